// expect: ok {"polluted": "undefined", "ok": "undefined", "keys": ["a"], "json": "{\"a\":1}", "echo": {"a": [1]}}
async function main() {
  const echo = await call_tool('echo', { a: [1] });
  return {
    polluted: typeof ({}).polluted,
    ok: typeof ({}).ok,
    keys: Object.keys({ a: 1 }),
    json: JSON.stringify({ a: 1 }),
    echo,
  };
}
