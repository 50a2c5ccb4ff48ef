// expect: ok {"kind": "err", "message": "call_tool(`fail`) failed: boom (tool_failed)", "isError": true}
async function main() {
  try {
    await call_tool('fail', { message: 'boom' });
    return 'not reached';
  } catch (e) {
    return { kind: e.kind, message: e.message, isError: e instanceof Error };
  }
}
