// expect: ok {"kind": "hint", "message": "call_tool(`hint`) failed: did you mean `echo`? (schema hint)"}
async function main() {
  try {
    await call_tool('hint', {});
  } catch (e) {
    return { kind: e.kind, message: e.message };
  }
}
