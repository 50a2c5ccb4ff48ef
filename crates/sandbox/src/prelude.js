// The sandbox's own JavaScript, evaluated in each fresh context before the tool's code. It
// captures the built-ins it uses first, so nothing the tool's code later changes (prototypes,
// JSON, Object.keys, Promise) can steer it; it keeps its state in null-prototype objects
// (no inherited setters or getters); and what it hands back to Rust are null-prototype
// records with own data properties only. The two host functions stay in this closure: the
// tool's code reaches them only through `call_tool` and `log`.
(function (hostCall, hostLog, limits) {
  'use strict';
  const G = globalThis;
  const create = Object.create;
  const keys = Object.keys;
  const defineProperty = Object.defineProperty;
  const isArray = Array.isArray;
  const stringify = JSON.stringify;
  const parse = JSON.parse;
  const StringOf = String;
  const P = Promise;
  const Err = Error;
  const TypeErr = TypeError;
  const RangeErr = RangeError;
  const sliceOf = Function.prototype.call.bind(String.prototype.slice);
  const FAIL = create(null);

  function record() {
    return create(null);
  }

  // Writes `v` as JSON text of at most `limit` characters and `maxDepth` levels, reading only
  // own enumerable string keys (getters and Proxy traps run, under the interrupt handler;
  // `toJSON` is not called). Returns a record: {ok, text} or {ok: false, large, why}.
  function encode(v, limit, maxDepth, root) {
    let out = '';
    let why = '';
    let large = false;
    const anc = create(null);
    const seg = create(null);
    let depth = 0;
    function where() {
      let p = root;
      for (let i = 0; i < depth; i++) {
        const s = seg[i];
        p += typeof s === 'number' ? '[' + s + ']' : '.' + s;
        if (p.length > 200) return sliceOf(p, 0, 200) + '…';
      }
      return p;
    }
    function fail(what) {
      why = where() + ': ' + what;
      throw FAIL;
    }
    function put(s) {
      out += s;
      if (out.length > limit) {
        large = true;
        throw FAIL;
      }
    }
    function walk(x) {
      switch (typeof x) {
        case 'string':
          if (x.length > limit) {
            large = true;
            throw FAIL;
          }
          put(stringify(x));
          return;
        case 'number':
          put(x === x && x !== Infinity && x !== -Infinity ? stringify(x) : 'null');
          return;
        case 'boolean':
          put(x ? 'true' : 'false');
          return;
        case 'undefined':
          put('null');
          return;
        case 'function':
          fail('a function');
        case 'bigint':
          fail('a BigInt (convert it with Number() or String())');
        case 'symbol':
          fail('a Symbol');
      }
      if (x === null) {
        put('null');
        return;
      }
      if (depth >= maxDepth) fail('nested deeper than ' + maxDepth + ' levels');
      for (let i = 0; i < depth; i++) {
        if (anc[i] === x) fail('a cycle (the value contains itself)');
      }
      anc[depth] = x;
      if (isArray(x)) {
        const n = x.length;
        put('[');
        for (let i = 0; i < n; i++) {
          if (i > 0) put(',');
          seg[depth] = i;
          depth++;
          walk(x[i]);
          depth--;
        }
        put(']');
      } else {
        const ks = keys(x);
        const n = ks.length;
        let first = true;
        put('{');
        for (let i = 0; i < n; i++) {
          const k = ks[i];
          const item = x[k];
          if (item === undefined) continue;
          put((first ? '' : ',') + stringify(k) + ':');
          first = false;
          seg[depth] = k;
          depth++;
          walk(item);
          depth--;
        }
        put('}');
      }
      anc[depth] = undefined;
    }
    const r = record();
    try {
      walk(v);
      r.ok = true;
      r.text = out;
    } catch (e) {
      if (e !== FAIL) throw e;
      r.ok = false;
      r.large = large;
      r.why = why;
    }
    return r;
  }

  // What a thrown value says, bounded; never throws.
  function describe(e) {
    const r = record();
    r.exception = true;
    let name = '';
    let message = '';
    let stack = '';
    try {
      if (e !== null && (typeof e === 'object' || typeof e === 'function')) {
        const n = e.name;
        const m = e.message;
        const s = e.stack;
        if (typeof n === 'string') name = n;
        if (typeof m === 'string') message = m;
        else {
          const j = encode(e, 2000, 8, 'thrown');
          message = j.ok ? j.text : 'an object';
        }
        if (typeof s === 'string') stack = s;
      } else if (typeof e === 'string') {
        message = e;
      } else {
        message = StringOf(e);
      }
    } catch (_) {
      message = message || 'an exception that cannot be read';
    }
    if (message.length > 4000) message = sliceOf(message, 0, 4000) + '…';
    if (stack.length > 4000) stack = sliceOf(stack, 0, 4000) + '…';
    r.name = name;
    r.message = message;
    r.stack = stack;
    return r;
  }

  const pending = create(null);

  function call_tool(name, inputs) {
    if (typeof name !== 'string' || name.length === 0) {
      throw new TypeErr('call_tool(name, inputs): name must be a non-empty string');
    }
    if (name.length > 256) {
      throw new TypeErr('call_tool(name, inputs): name is longer than 256 characters');
    }
    const j = encode(inputs === undefined ? null : inputs, limits.input, limits.depth, 'inputs');
    if (!j.ok) {
      if (j.large) {
        throw new RangeErr(
          'call_tool: the inputs for `' + name + '` are larger than the input limit (' +
            limits.input + ' bytes as JSON)');
      }
      throw new TypeErr('call_tool: the inputs for `' + name + '` are not JSON: ' + j.why);
    }
    const id = hostCall(name, j.text);
    return new P(function (resolve, reject) {
      const slot = create(null);
      slot.resolve = resolve;
      slot.reject = reject;
      slot.name = name;
      pending[id] = slot;
    });
  }

  let logFull = false;
  function log(...args) {
    if (logFull) {
      hostLog('');
      return;
    }
    let line = '';
    const n = args.length;
    for (let i = 0; i < n; i++) {
      const a = args[i];
      let s;
      if (typeof a === 'string') s = a;
      else if (a === null || (typeof a !== 'object' && typeof a !== 'function')) s = StringOf(a);
      else if (typeof a === 'function') s = '[function]';
      else {
        const j = encode(a, limits.log, limits.depth, 'value');
        s = j.ok ? j.text : j.large ? '[too large to log]' : '[' + j.why + ']';
      }
      line += (i > 0 ? ' ' : '') + s;
      if (line.length > limits.log) {
        line = sliceOf(line, 0, limits.log);
        break;
      }
    }
    logFull = !hostLog(line);
  }

  function settle(id, ok, text, kind) {
    const slot = pending[id];
    if (slot === undefined) return;
    delete pending[id];
    if (ok) {
      let v;
      try {
        v = parse(text);
      } catch (e) {
        slot.reject(e);
        return;
      }
      slot.resolve(v);
    } else {
      const e = new Err('call_tool(`' + slot.name + '`) failed: ' + text);
      const d = create(null);
      d.value = kind;
      d.writable = true;
      d.enumerable = true;
      d.configurable = true;
      defineProperty(e, 'kind', d);
      slot.reject(e);
    }
  }

  // Awaits the module's evaluation (top-level await included); resolves to a record with
  // `main`, or to a description of what the module threw.
  async function boot(evaluated, namespace) {
    try {
      await evaluated;
    } catch (e) {
      return describe(e);
    }
    const r = record();
    r.main = namespace.__quiver_main__;
    return r;
  }

  // Calls main; the record holds its return value (a promise, usually) or what it threw.
  function invoke(main, text) {
    const r = record();
    try {
      r.value = main(parse(text));
      r.ok = true;
    } catch (e) {
      return describe(e);
    }
    return r;
  }

  function finish(value) {
    return encode(value, limits.output, limits.depth, 'result');
  }

  const console = create(null);
  console.log = log;
  console.info = log;
  console.warn = log;
  console.error = log;
  console.debug = log;
  const hidden = create(null);
  hidden.writable = true;
  hidden.enumerable = false;
  hidden.configurable = true;
  for (const [name, value] of [['call_tool', call_tool], ['log', log], ['console', console]]) {
    hidden.value = value;
    defineProperty(G, name, hidden);
  }
  delete G.SharedArrayBuffer;
  delete G.Atomics;
  // The V8-style hook would hand the script CallSite objects whose getFunction() returns
  // every function on the stack, this closure's and the host's native ones included.
  delete Error.prepareStackTrace;

  const api = record();
  api.settle = settle;
  api.boot = boot;
  api.invoke = invoke;
  api.finish = finish;
  api.describe = describe;
  return api;
})
