// expect: memory
// limits: wall_time_ms=30000
// Flattening each step (a regex over the whole string) makes it a real allocation.
async function main() {
  let s = 'x';
  while (true) {
    s += s;
    s = s.replace(/^/, '');
  }
}
