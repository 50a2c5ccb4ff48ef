// expect: ok {"echoed": {"x": 1, "list": [1, "two"]}, "calls": 2}
// calls: 2
async function main() {
  const echoed = await call_tool('echo', { x: 1, list: [1, 'two'] });
  await call_tool('noop', {});
  return { echoed, calls: 2 };
}
