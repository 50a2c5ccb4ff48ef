// expect: input_too_large
// limits: input_bytes=16
// inputs: {"long": "more than sixteen bytes of JSON"}
async function main(inputs) {
  return inputs;
}
