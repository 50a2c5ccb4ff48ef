// expect: timeout
async function main() {
  function down() {
    try {
      down();
    } catch (e) {
      down();
    }
  }
  down();
}
