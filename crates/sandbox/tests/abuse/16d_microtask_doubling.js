// expect: memory
async function main() {
  (function twice() {
    queueMicrotask(twice);
    queueMicrotask(twice);
  })();
  await new Promise(() => {});
}
