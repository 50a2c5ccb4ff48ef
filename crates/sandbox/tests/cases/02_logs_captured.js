// expect: ok "done"
// logs: ["hello 1 true null undefined {\"a\":[1,2]}", "from console.log", "[function]"]
async function main() {
  log('hello', 1, true, null, undefined, { a: [1, 2] });
  console.log('from console.log');
  log(() => 1);
  return 'done';
}
