// expect: exception /main has already returned/
// host-calls: 0
async function main() {
  return {
    get sneaky() {
      call_tool('count', {});
      return 1;
    },
  };
}
