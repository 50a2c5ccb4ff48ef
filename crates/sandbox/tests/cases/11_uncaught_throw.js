// expect: exception /Error: boom/
// stack: main.js:7
function helper() {
  throw new Error('boom');
}
async function main() {
  helper();
}
