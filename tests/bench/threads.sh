#!/usr/bin/env bash
# Per-thread context switches and CPU per call of `quiver serve` in front of
# server-everything (not a test: prints numbers, asserts nothing).
#
#   bash tests/bench/threads.sh stdio|http [ENV=VALUE ...]
#
# ENV=VALUE pairs go to `quiver serve` only (e.g. TOKIO_WORKER_THREADS=1). After 250 warm-up
# calls, 2000 sequential `echo` calls; switches and CPU (utime+stime, 10 ms ticks) are read
# from /proc/PID/task/*/{status,stat} before and after, summed per thread name. TARGET: the
# release build's directory (default ${CARGO_TARGET_DIR:-<repo>/target}/release); PEERS: where
# .ci/setup-peers installed server-everything (default <repo>/.peers).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${TARGET:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
TARGET=$(cd "$TARGET" && pwd) # absolute: the servers run from their own directories
PEERS=${PEERS:-$ROOT/.peers}
EVERYTHING=$PEERS/npm/node_modules/.bin/mcp-server-everything
[ -x "$EVERYTHING" ] || { echo "no $EVERYTHING: run .ci/setup-peers, or set PEERS" >&2; exit 1; }
KIND=${1:?stdio or http}; shift
N=2000
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
if [ "$KIND" = http ]; then
  PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  PORT=$PORT "$EVERYTHING" streamableHttp >"$WORK/ev.out" 2>&1 & PIDS+=("$!")
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.05; done
  echo "{\"mcpServers\": {\"everything\": {\"url\": \"http://127.0.0.1:$PORT/mcp\"}}}" >"$WORK/cfg.json"
else
  echo "{\"mcpServers\": {\"everything\": {\"command\": \"$EVERYTHING\", \"args\": [\"stdio\"]}}}" >"$WORK/cfg.json"
fi
(cd "$WORK" && exec env "$@" "$TARGET/quiver" --mcp-config cfg.json serve --listen 127.0.0.1:0 >out 2>err) &
QPID=$!; PIDS+=("$QPID")
for _ in $(seq 400); do [ -s "$WORK/out" ] && break; sleep 0.05; done
URL=$(head -n1 "$WORK/out")
"$TARGET/quiver-serve-bench" latency "$URL" mcp__everything__echo echo 200 50 >/dev/null
snap() {
  for t in /proc/$QPID/task/*; do
    echo "$(cat "$t/comm") $(awk '/^voluntary_ctxt/{v=$2}/^nonvoluntary_ctxt/{n=$2}END{print v+n}' "$t/status") $(awk '{print $14+$15}' "$t/stat")"
  done | awk '{c[$1]+=$2; u[$1]+=$3} END {for (k in c) print k, c[k], u[k]}' | sort
}
snap >"$WORK/a"
"$TARGET/quiver-serve-bench" latency "$URL" mcp__everything__echo echo "$N" 0
snap >"$WORK/b"
join "$WORK/a" "$WORK/b" | awk -v n="$N" '{printf "%s: %.2f switches/call, %d us CPU/call\n", $1, ($4-$2)/n, ($5-$3)*10000/n}'
