// expect-validate: syntax /could not load module 'os': a custom tool cannot import modules/
// expect: syntax
import * as os from 'os';
async function main() {
  return os.getcwd();
}
