// expect: ok {"depth": 4}
// inputs: {"n": 0}
async function main(inputs) {
  if (inputs.n === 4) return { depth: inputs.n };
  return await call_tool('self', { n: inputs.n + 1 });
}
