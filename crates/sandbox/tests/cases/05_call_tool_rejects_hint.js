// expect: ok {"kind": "hint", "message": "⚠ schema hint: did you mean `echo`?"}
async function main() {
  try {
    await call_tool('hint', {});
  } catch (e) {
    return { kind: e.kind, message: e.message };
  }
}
