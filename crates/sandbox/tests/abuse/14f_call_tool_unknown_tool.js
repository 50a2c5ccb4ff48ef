// expect: ok {"kind": "err", "message": "✗ error (undefined_tool): no tool `nope`"}
async function main() {
  try {
    await call_tool('nope', {});
  } catch (e) {
    return { kind: e.kind, message: e.message };
  }
}
