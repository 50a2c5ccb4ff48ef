// expect: timeout
async function main() {
  for (;;) await null;
}
