// expect: ok null
async function main() {}
