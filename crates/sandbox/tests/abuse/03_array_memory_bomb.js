// expect: memory
// limits: wall_time_ms=30000
async function main() {
  const hoard = [];
  while (true) hoard.push(new Array(100000).fill({ x: 1 }));
}
