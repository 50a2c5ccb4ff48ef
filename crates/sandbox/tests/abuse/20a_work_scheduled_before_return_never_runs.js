// expect: ok "returned"
// host-calls: 0
// logs: []
async function main() {
  queueMicrotask(() => { log('after'); call_tool('count', {}); });
  Promise.resolve().then(() => { log('after'); call_tool('count', {}); });
  return 'returned';
}
