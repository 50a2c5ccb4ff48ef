// expect: timeout
async function main() {
  (function again() {
    queueMicrotask(again);
  })();
  await new Promise(() => {});
}
