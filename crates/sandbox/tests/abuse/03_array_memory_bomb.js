// expect: memory
async function main() {
  const hoard = [];
  while (true) hoard.push(new Array(100000).fill({ x: 1 }));
}
