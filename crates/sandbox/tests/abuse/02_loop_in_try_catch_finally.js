// expect: timeout
async function main() {
  for (;;) {
    try {
      try {
        while (true) {}
      } catch (e) {
        continue;
      } finally {
        continue;
      }
    } catch (e) {
      continue;
    }
  }
}
