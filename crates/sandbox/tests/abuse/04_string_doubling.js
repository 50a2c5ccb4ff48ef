// expect: exception /InternalError: string too long/
// QuickJS concatenates into ropes, so doubling reaches the engine's string length cap (2^30)
// before it has used the heap: a clean, catchable InternalError.
async function main() {
  let s = 'x';
  while (true) s += s;
}
