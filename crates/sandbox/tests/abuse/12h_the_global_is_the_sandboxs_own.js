// expect: ok {"same": true, "extra": []}
async function main() {
  const g = Function('return this')();
  const language = new Set([
    'Object', 'Function', 'Error', 'EvalError', 'RangeError', 'ReferenceError', 'SyntaxError',
    'TypeError', 'URIError', 'InternalError', 'AggregateError', 'Iterator', 'Array', 'parseInt',
    'parseFloat', 'isNaN', 'isFinite', 'queueMicrotask', 'decodeURI', 'decodeURIComponent',
    'encodeURI', 'encodeURIComponent', 'escape', 'unescape', 'Infinity', 'NaN', 'undefined',
    'eval', 'Number', 'Boolean', 'String', 'Math', 'Reflect', 'Symbol', 'globalThis', 'Date',
    'RegExp', 'JSON', 'Proxy', 'Map', 'Set', 'WeakMap', 'WeakSet', 'ArrayBuffer', 'Uint8ClampedArray',
    'Int8Array', 'Uint8Array', 'Int16Array', 'Uint16Array', 'Int32Array', 'Uint32Array',
    'BigInt64Array', 'BigUint64Array', 'Float16Array', 'Float32Array', 'Float64Array', 'DataView',
    'Promise', 'BigInt', 'call_tool', 'log', 'console', 'Error', 'CallSite', 'DisposableStack',
    'AsyncDisposableStack', 'SuppressedError', 'Iterator',
  ]);
  const extra = Object.getOwnPropertyNames(g).filter((n) => !language.has(n));
  return { same: g === globalThis, extra };
}
