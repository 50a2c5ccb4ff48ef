// expect: invalid_result /result.s: a Symbol/
async function main() {
  return { s: Symbol('x') };
}
