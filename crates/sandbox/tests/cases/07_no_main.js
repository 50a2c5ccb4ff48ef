// expect-validate: syntax /async function main/
// expect: syntax
async function helper(inputs) {
  return inputs;
}
