// expect: depth_limit
async function main(inputs) {
  try {
    return await call_tool('self', inputs);
  } catch (e) {
    return 'swallowed';
  }
}
