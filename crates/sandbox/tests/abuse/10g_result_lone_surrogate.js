// expect: invalid_result /lone surrogate/
async function main() {
  return { text: 'ok \ud800 broken' };
}
