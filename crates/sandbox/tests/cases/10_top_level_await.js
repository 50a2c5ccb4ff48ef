// expect: ok {"prefix": "hi", "n": 2}
// inputs: {"n": 1}
const prefix = await call_tool('echo', 'hi');
async function main(inputs) {
  return { prefix, n: inputs.n * 2 };
}
