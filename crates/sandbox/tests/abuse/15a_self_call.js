// expect: depth_limit
async function main(inputs) {
  return await call_tool('self', inputs);
}
