// expect: output_too_large
async function main() {
  return 'x'.repeat(2 << 20);
}
