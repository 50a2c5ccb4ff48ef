// expect: exception /name must be a non-empty string/
async function main() {
  return await call_tool(42, {});
}
