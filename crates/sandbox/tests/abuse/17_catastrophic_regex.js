// expect: timeout
async function main() {
  return /^(a+)+$/.test('a'.repeat(64) + 'b');
}
