// expect: exception /inputs.a.toString: a function/
async function main() {
  return await call_tool('echo', { a: { toString() { while (true) {} } } });
}
