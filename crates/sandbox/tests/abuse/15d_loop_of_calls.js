// expect: call_limit
async function main() {
  for (let i = 0; ; i++) {
    try {
      await call_tool('noop', {});
    } catch (e) {
      // Swallowing the refusal does not help: the budget stops the run.
    }
  }
}
