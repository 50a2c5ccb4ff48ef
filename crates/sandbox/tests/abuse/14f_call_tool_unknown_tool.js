// expect: ok {"kind": "err", "message": "call_tool(`nope`) failed: no tool `nope` (undefined_tool)"}
async function main() {
  try {
    await call_tool('nope', {});
  } catch (e) {
    return { kind: e.kind, message: e.message };
  }
}
