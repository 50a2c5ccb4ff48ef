// expect: memory
// The heap is what stops it; the wall time is long enough that a slow machine cannot
// make the clock win first.
// limits: wall_time_ms=30000
async function main() {
  (function twice() {
    queueMicrotask(twice);
    queueMicrotask(twice);
  })();
  await new Promise(() => {});
}
