// expect: exception /could not load module 'fs'/
async function main() {
  return await import('fs');
}
