// expect: exception /invalid string length/
async function main() {
  return 'x'.repeat(2 ** 30);
}
