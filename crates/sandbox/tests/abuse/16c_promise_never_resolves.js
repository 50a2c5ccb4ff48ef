// expect: exception /never settles/
async function main() {
  await new Promise(() => {});
}
