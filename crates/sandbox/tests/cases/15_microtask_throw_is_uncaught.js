// expect: exception /Error: thrown in a microtask/
// A queueMicrotask callback that throws ends the run, as an uncaught exception would.
async function main() {
  queueMicrotask(() => {
    throw new Error('thrown in a microtask');
  });
  await call_tool('noop', {});
  return 'not reached';
}
