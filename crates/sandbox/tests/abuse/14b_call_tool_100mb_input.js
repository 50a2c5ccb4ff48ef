// expect: exception /RangeError: call_tool: the inputs for `echo` are larger than the input limit/
// host-calls: 0
async function main() {
  const mb = 'x'.repeat(1 << 20);
  const big = {};
  for (let i = 0; i < 100; i++) big['k' + i] = mb;
  return await call_tool('echo', big);
}
