// expect: ok {"sum": 3, "names": ["a", "b"], "nested": {"ok": true, "none": null}}
// inputs: {"a": 1, "b": 2}
async function main(inputs) {
  return {
    sum: inputs.a + inputs.b,
    names: Object.keys(inputs),
    nested: { ok: true, none: null, skipped: undefined },
  };
}
