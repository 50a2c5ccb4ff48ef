// expect: ok {"sync": true}
export function main() {
  return { sync: true };
}
