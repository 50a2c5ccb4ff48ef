#!/usr/bin/env bash
# Two variants of `quiver serve` side by side in front of one server-everything over HTTP
# (not a test: prints numbers). Three rounds of `compare` (added latency to the upstream),
# the two taken in turn; unless COMPARE_ONLY=1, then three rounds of latency and 64-client
# throughput on the in-process `describe_tool`. The bench client keeps its defaults.
#
#   A_NAME=... A_ENV="VAR=value ..." A_TOML="[store]\nlog_linger_ms = 2" \
#   B_NAME=... B_ENV=... B_TOML=... bash tests/bench/ab.sh
#
# A_ENV/B_ENV: environment of each server (`env` arguments); A_TOML/B_TOML: its quiver.toml
# (printf escapes); A_BIN/B_BIN: its `quiver` binary (default $TARGET/quiver), to compare
# two builds. TARGET: the release build's directory (default
# ${CARGO_TARGET_DIR:-<repo>/target}/release); PEERS: where .ci/setup-peers installed
# server-everything (default <repo>/.peers). tests/bench/workers.sh and tests/bench/linger.sh
# are two uses.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${TARGET:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
TARGET=$(cd "$TARGET" && pwd) # absolute: the servers run from their own directories
PEERS=${PEERS:-$ROOT/.peers}
EVERYTHING=$PEERS/npm/node_modules/.bin/mcp-server-everything
[ -x "$EVERYTHING" ] || { echo "no $EVERYTHING: run .ci/setup-peers, or set PEERS" >&2; exit 1; }
B=$TARGET/quiver-serve-bench
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
PORT=$PORT "$EVERYTHING" streamableHttp >"$WORK/ev.out" 2>&1 & PIDS+=("$!")
for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.05; done
E=http://127.0.0.1:$PORT/mcp
echo "{\"mcpServers\": {\"everything\": {\"url\": \"$E\"}}}" >"$WORK/http.json"
for v in a b; do
  mkdir -p "$WORK/$v"
  if [ $v = a ]; then toml=${A_TOML:-}; envs=${A_ENV:-}; bin=${A_BIN:-$TARGET/quiver}
  else toml=${B_TOML:-}; envs=${B_ENV:-}; bin=${B_BIN:-$TARGET/quiver}; fi
  printf "$toml\n" >"$WORK/$v/quiver.toml"
  # shellcheck disable=SC2086 # envs is a list of VAR=value words
  (cd "$WORK/$v" && exec env $envs "$bin" --mcp-config ../http.json serve --listen 127.0.0.1:0 >out 2>err) & PIDS+=("$!")
done
for v in a b; do for _ in $(seq 400); do [ -s "$WORK/$v/out" ] && break; sleep 0.05; done; done
UA=$(head -n1 "$WORK/a/out"); UB=$(head -n1 "$WORK/b/out")
NA=${A_NAME:-a}; NB=${B_NAME:-b}
for _ in 1 2 3; do
  echo "$NA: $("$B" compare "$E" echo "$UA" mcp__everything__echo echo 1000)"
  echo "$NB: $("$B" compare "$E" echo "$UB" mcp__everything__echo echo 1000)"
done
[ "${COMPARE_ONLY:-0}" = 1 ] && exit 0
for _ in 1 2 3; do
  echo "$NA: $("$B" latency "$UA" describe_tool describe 1000) $("$B" throughput "$UA" describe_tool describe 64 4)"
  echo "$NB: $("$B" latency "$UB" describe_tool describe 1000) $("$B" throughput "$UB" describe_tool describe 64 4)"
done
