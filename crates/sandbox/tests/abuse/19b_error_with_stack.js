// expect: exception /TypeError/
// stack: main.js:5
async function main() {
  const value = null;
  return value.field;
}
