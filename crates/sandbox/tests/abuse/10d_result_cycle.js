// expect: invalid_result /result.self.again: a cycle/
async function main() {
  const o = { self: {} };
  o.self.again = o;
  return o;
}
