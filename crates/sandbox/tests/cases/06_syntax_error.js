// expect-validate: syntax 4:15
// expect: syntax
async function main(inputs) {
  return { a: };
}
