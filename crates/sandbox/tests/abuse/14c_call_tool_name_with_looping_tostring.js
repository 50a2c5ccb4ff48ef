// expect: exception /name must be a non-empty string/
async function main() {
  const name = { toString() { while (true) {} } };
  return await call_tool(name, {});
}
