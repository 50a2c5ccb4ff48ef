// expect: output_too_large
async function main() {
  let n = 0;
  const endless = new Proxy([], {
    get(target, key) {
      return key === 'length' ? 2 ** 32 - 1 : n++;
    },
  });
  return endless;
}
