// expect: timeout
async function main() {
  return new Proxy({}, {
    ownKeys() {
      while (true) {}
    },
  });
}
