// expect: timeout
async function main() {
  // Catching the out-of-memory error frees nothing for long: the loop ends at the deadline.
  while (true) {
    try {
      const hoard = [];
      while (true) hoard.push(new Array(100000).fill(1));
    } catch (e) {}
  }
}
