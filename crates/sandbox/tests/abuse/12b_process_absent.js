// expect: exception /ReferenceError: process is not defined/
async function main() {
  return process.env;
}
