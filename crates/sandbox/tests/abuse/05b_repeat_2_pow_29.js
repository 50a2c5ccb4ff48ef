// expect: memory
async function main() {
  return 'x'.repeat(2 ** 29).length;
}
