// expect: exception /Uncaught nope/
async function main() {
  throw 'nope';
}
