// expect: ok
// The corpus test checks this result and every error text for the working directory, $HOME
// and environment values.
async function main() {
  const probes = {};
  probes.stack = new Error('probe').stack;
  probes.meta = JSON.stringify(import.meta);
  try {
    await import('/etc/passwd');
  } catch (e) {
    probes.absolute = String(e) + e.stack;
  }
  try {
    await import('../../Cargo.toml');
  } catch (e) {
    probes.relative = String(e) + e.stack;
  }
  try {
    null.x;
  } catch (e) {
    probes.type = e.stack;
  }
  return probes;
}
