// expect: exception /it threw nope, a value that is not an Error/
async function main() {
  throw 'nope';
}
