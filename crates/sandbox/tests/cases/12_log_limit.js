// expect: ok
// limits: log_bytes=12
// logs: ["first", "second ", "[log limit of 12 bytes reached: the last line was cut and 2 more line(s) dropped]"]
async function main() {
  log('first');
  log('second line');
  log('third');
  log('fourth');
}
