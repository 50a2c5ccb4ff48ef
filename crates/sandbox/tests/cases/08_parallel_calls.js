// expect: ok [0, 1, 2, 3, 4]
async function main() {
  const calls = [0, 1, 2, 3, 4].map((i) => call_tool('echo', i));
  return await Promise.all(calls);
}
