// expect: exception /ReferenceError: fetch is not defined/
async function main() {
  return await fetch('http://example.invalid/');
}
