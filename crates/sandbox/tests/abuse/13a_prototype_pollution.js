// expect: ok {"list": [1, 2], "n": 3, "text": "plain"}
// Poisons everything the host's conversion could touch, then returns plain data: the result
// must come out exact. The next case checks none of it survives into the next run.
Object.prototype.polluted = 'yes';
Object.defineProperty(Object.prototype, 'ok', { get() { return false; }, configurable: true });
Object.defineProperty(Object.prototype, 'text', { get() { return '"forged"'; }, configurable: true });
Object.defineProperty(Object.prototype, 'then', { get() { return undefined; }, configurable: true });
Object.defineProperty(Array.prototype, '0', { set(v) { throw new Error('setter ran'); }, configurable: true });
Array.prototype.push = () => { throw new Error('push ran'); };
Array.isArray = () => false;
Object.keys = () => ['forged'];
JSON.stringify = () => '"forged"';
JSON.parse = () => 'forged';
String.prototype.slice = () => 'forged';
Function.prototype.call = () => 'forged';
globalThis.Promise = function () { throw new Error('Promise replaced'); };
async function main() {
  return { list: [1, 2], n: 3, text: 'plain' };
}
