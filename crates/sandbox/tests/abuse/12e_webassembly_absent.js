// expect: exception /ReferenceError: WebAssembly is not defined/
async function main() {
  return WebAssembly.compile(new Uint8Array([0, 97, 115, 109]));
}
