// expect-validate: ok
// expect: timeout
while (1) {}
async function main() {
  return 'never';
}
