// expect: ok {"a": {"x": 1}, "b": {"x": 1}, "t": null, "n": null}
async function main() {
  const shared = { x: 1 };
  return { a: shared, b: shared, t: NaN, n: -Infinity };
}
