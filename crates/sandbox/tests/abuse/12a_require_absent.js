// expect: exception /ReferenceError: require is not defined/
async function main() {
  return require('fs');
}
