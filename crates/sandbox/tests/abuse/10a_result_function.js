// expect: invalid_result /result.a[1]: a function/
async function main() {
  return { a: [1, () => 2] };
}
