// expect: ok "returned"
// host-calls: 1
// logs: ["before"]
async function main() {
  await call_tool('count', {});
  log('before');
  queueMicrotask(() => { log('after'); call_tool('count', {}); });
  (async () => { await null; log('after'); call_tool('count', {}); })();
  return 'returned';
}
