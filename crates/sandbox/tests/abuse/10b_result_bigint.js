// expect: invalid_result /result.n: a BigInt/
async function main() {
  return { n: 10n ** 30n };
}
