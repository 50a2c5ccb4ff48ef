async function main() {
  return await call_tool('ping', {});
}
