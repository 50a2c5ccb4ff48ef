// expect: timeout
async function main() {
  return {
    get forever() {
      while (true) {}
    },
  };
}
