// expect: output_too_large
async function main() {
  const mb = 'x'.repeat(1 << 20);
  return new Array(50).fill(mb);
}
