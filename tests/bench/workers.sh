#!/usr/bin/env bash
# One tokio worker against the default (one per core) for `quiver serve` in front of
# server-everything over HTTP, side by side (not a test: prints numbers).
#
#   TARGET=$PWD/target/release bash tests/bench/workers.sh
#
# Two `quiver serve` on one upstream, one with TOKIO_WORKER_THREADS=1; three rounds of
# `compare` (added latency to the upstream) and of latency + 64-client throughput on the
# in-process `describe_tool`, taking the two in turn. The bench client keeps its default.
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
mkdir -p "$WORK/w1" "$WORK/w2"
(cd "$WORK/w1" && TOKIO_WORKER_THREADS=1 exec "$TARGET/quiver" --mcp-config ../http.json serve --listen 127.0.0.1:0 >out 2>err) & PIDS+=("$!")
(cd "$WORK/w2" && exec "$TARGET/quiver" --mcp-config ../http.json serve --listen 127.0.0.1:0 >out 2>err) & PIDS+=("$!")
for w in w1 w2; do for _ in $(seq 400); do [ -s "$WORK/$w/out" ] && break; sleep 0.05; done; done
U1=$(head -n1 "$WORK/w1/out"); U2=$(head -n1 "$WORK/w2/out")
for _ in 1 2 3; do
  echo "one worker:  $("$B" compare "$E" echo "$U1" mcp__everything__echo echo 1000)"
  echo "default:     $("$B" compare "$E" echo "$U2" mcp__everything__echo echo 1000)"
done
for _ in 1 2 3; do
  echo "one worker:  $("$B" latency "$U1" describe_tool describe 1000) $("$B" throughput "$U1" describe_tool describe 64 4)"
  echo "default:     $("$B" latency "$U2" describe_tool describe 1000) $("$B" throughput "$U2" describe_tool describe 64 4)"
done
