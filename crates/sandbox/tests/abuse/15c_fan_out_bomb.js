// expect: call_limit
// Thirty calls a level: four levels would need 120 calls, more than the budget of 100 the
// whole tree shares, so the budget runs out before the depth limit is reached.
async function main() {
  const calls = [];
  for (let i = 0; i < 30; i++) calls.push(call_tool('self', {}));
  return await Promise.all(calls);
}
