// expect: invalid_result /nested deeper than 64 levels/
async function main() {
  let v = [];
  for (let i = 0; i < 10000; i++) v = [v];
  return v;
}
