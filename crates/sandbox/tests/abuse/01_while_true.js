// expect: timeout
async function main() {
  while (true) {}
}
