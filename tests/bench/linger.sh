#!/usr/bin/env bash
# The execution-log writer's linger, A against B, for `quiver serve` in front of
# server-everything over HTTP, side by side (not a test: prints numbers).
#
#   LA=2 LB=20 TARGET=$PWD/target/release bash tests/bench/linger.sh
#
# Two `quiver serve` on one upstream, `[store] log_linger_ms` LA and LB (default 2 and 20);
# three rounds of `compare` (added latency to the upstream) each, taking the two in turn.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${TARGET:-$ROOT/target/release}
PEERS=${PEERS:-$ROOT/.peers}
EVERYTHING=$PEERS/npm/node_modules/.bin/mcp-server-everything
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
for w in a b; do mkdir -p "$WORK/$w"; done
printf '[store]\nlog_linger_ms = %s\n' "${LA:-2}" > "$WORK/a/quiver.toml"
printf '[store]\nlog_linger_ms = %s\n' "${LB:-20}" > "$WORK/b/quiver.toml"
(cd "$WORK/a" && exec "$TARGET/quiver" --mcp-config ../http.json serve --listen 127.0.0.1:0 >out 2>err) & PIDS+=("$!")
(cd "$WORK/b" && exec "$TARGET/quiver" --mcp-config ../http.json serve --listen 127.0.0.1:0 >out 2>err) & PIDS+=("$!")
for w in a b; do for _ in $(seq 400); do [ -s "$WORK/$w/out" ] && break; sleep 0.05; done; done
UA=$(head -n1 "$WORK/a/out"); UB=$(head -n1 "$WORK/b/out")
for _ in 1 2 3; do
  echo "linger ${LA:-2}:  $("$B" compare "$E" echo "$UA" mcp__everything__echo echo 1000)"
  echo "linger ${LB:-20}: $("$B" compare "$E" echo "$UB" mcp__everything__echo echo 1000)"
done
