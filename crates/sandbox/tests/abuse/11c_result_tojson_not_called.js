// expect: ok {"plain": 1}
async function main() {
  return {
    plain: 1,
    toJSON: undefined,
    get hidden() {
      return undefined;
    },
  };
}
