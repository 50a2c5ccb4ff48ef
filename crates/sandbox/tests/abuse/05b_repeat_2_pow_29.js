// expect: memory
// limits: wall_time_ms=30000
async function main() {
  return 'x'.repeat(2 ** 29).length;
}
