// expect: timeout
async function main() {
  return await call_tool('echo', { get a() { while (true) {} } });
}
