// expect: ok []
async function main() {
  const names = [
    'require', 'process', 'fetch', 'std', 'os', 'WebAssembly', 'SharedArrayBuffer', 'Atomics',
    'performance', 'setTimeout', 'setInterval', 'XMLHttpRequest', 'WebSocket', 'Deno', 'Bun',
    'module', 'exports', 'global', 'gc', 'scriptArgs', 'print', 'navigator', 'Worker',
    'WeakRef', 'FinalizationRegistry', 'importScripts', 'bjson',
  ];
  const g = Function('return this')();
  return names.filter((n) => typeof g[n] !== 'undefined');
}
