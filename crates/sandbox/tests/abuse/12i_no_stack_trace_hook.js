// expect: ok {"hook": "undefined", "called": false}
// Error.prepareStackTrace would hand the script every function on the stack (the host's
// native call_tool among them) through CallSite.getFunction(); it is removed.
async function main() {
  let called = false;
  Error.prepareStackTrace = (error, sites) => {
    called = true;
    return sites.map((s) => s.getFunction());
  };
  try {
    await call_tool(42, {});
  } catch (e) {}
  try {
    null.x;
  } catch (e) {
    e.stack;
  }
  delete Error.prepareStackTrace;
  return { hook: typeof Error.prepareStackTrace, called };
}
