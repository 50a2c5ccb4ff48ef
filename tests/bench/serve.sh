#!/usr/bin/env bash
# Bench of `quiver serve` (streamable HTTP) with tests/bin/serve_bench.rs as the client.
# Not a test: prints numbers, asserts nothing.
#
#   cargo build --release -p quiver-host -p quiver-tests
#   tests/bench/serve.sh            # 1-4: in-process tool, upstream echo, throughput, RSS
#     (2 interleaves direct and through-quiver calls: `quiver-serve-bench compare`, and
#     then direct and through a proxy that only copies bytes, the floor for any proxy)
#   STDIO_BRIDGES=1 tests/bench/serve.sh
#     also 5: stdio server-everything bridged by quiver, supergateway (npm), mcp-proxy (PyPI),
#     and the same calls straight to the stdio server (tests/bench/stdio_direct.py); the two
#     peers are installed into $PEERS/bridges unless SUPERGATEWAY / MCP_PROXY name them;
#     5b runs the three side by side (`quiver-serve-bench bridges`: one call to each and
#     one straight to the stdio server per round, twice)
#
# Env: TARGET, the directory of the release `quiver` and `quiver-serve-bench` (default
# ${CARGO_TARGET_DIR:-<repo>/target}/release); PEERS, where .ci/setup-peers installed
# server-everything (default <repo>/.peers); N (1000), CLIENTS (64), SECS (5).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${TARGET:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
TARGET=$(cd "$TARGET" && pwd) # absolute: the servers run from their own directories
QUIVER=$TARGET/quiver
BENCH=$TARGET/quiver-serve-bench
PEERS=${PEERS:-$ROOT/.peers}
EVERYTHING=$PEERS/npm/node_modules/.bin/mcp-server-everything
[ -x "$EVERYTHING" ] || { echo "no $EVERYTHING: run .ci/setup-peers, or set PEERS" >&2; exit 1; }
N=${N:-1000}
CLIENTS=${CLIENTS:-64}
SECS=${SECS:-5}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

# start_quiver NAME [ARGS...]: runs `quiver serve` in a fresh dir; sets QPID and QURL.
start_quiver() {
  local dir=$WORK/$1; shift
  mkdir -p "$dir"
  (cd "$dir" && exec "$QUIVER" "$@" serve --listen 127.0.0.1:0 >"$dir/out" 2>"$dir/err") &
  QPID=$!; PIDS+=("$QPID")
  for _ in $(seq 400); do [ -s "$dir/out" ] && break; sleep 0.05; done
  QURL=$(head -n1 "$dir/out")
  [ -n "$QURL" ] || { cat "$dir/err" >&2; return 1; }
}

echo "# machine: $(nproc) cpu(s); $(uptime)"

echo "## 1. in-process tool (describe_tool) through quiver serve, no config"
start_quiver plain
sleep 1
echo "rss_after_startup_kb=$(rss_kb "$QPID")"
"$BENCH" latency "$QURL" describe_tool describe "$N"
"$BENCH" latency "$QURL" describe_tool describe "$N"
echo "## 3. throughput: $CLIENTS clients x ${SECS}s, describe_tool"
"$BENCH" throughput "$QURL" describe_tool describe "$CLIENTS" "$SECS"
echo "## 4. RSS"
echo "rss_after_runs_kb=$(rss_kb "$QPID")"
sleep 2
echo "rss_after_runs_plus_2s_kb=$(rss_kb "$QPID")"
"$BENCH" latency "$QURL" describe_tool describe "$N" | sed "s/^/after_throughput: /"
echo "# $(uptime)"
kill "$QPID"

echo "## 2. server-everything echo: direct vs as an upstream of quiver serve"
PORT=$(free_port)
PORT=$PORT "$EVERYTHING" streamableHttp >"$WORK/everything.out" 2>&1 &
PIDS+=("$!")
wait_port "$PORT"
EURL=http://127.0.0.1:$PORT/mcp
echo "{\"mcpServers\": {\"everything\": {\"url\": \"$EURL\"}}}" >"$WORK/http.json"
start_quiver upstream --mcp-config "$WORK/http.json"
# Interleaved: a = direct, b = through quiver; "added" is b - a under the same load.
for _ in 1 2 3; do
  "$BENCH" compare "$EURL" echo "$QURL" mcp__everything__echo echo "$N"
done
# The floor: what a proxy that parses nothing adds in front of the same server, and what
# Quiver adds over that proxy (a = the proxy, b = quiver).
"$BENCH" proxy "127.0.0.1:$PORT" >"$WORK/proxy.out" &
PIDS+=("$!")
for _ in $(seq 100); do [ -s "$WORK/proxy.out" ] && break; sleep 0.05; done
PURL=http://$(head -n1 "$WORK/proxy.out")/mcp
for _ in 1 2; do
  "$BENCH" compare "$EURL" echo "$PURL" echo echo "$N" | sed 's/^/byte_proxy: /'
  "$BENCH" compare "$PURL" echo "$QURL" mcp__everything__echo echo "$N" | sed 's/^/quiver_over_byte_proxy: /'
done
echo "# $(uptime)"
kill "$QPID"

if [ -n "${STDIO_BRIDGES:-}" ]; then
  # The two peers are installed here unless given: npm supergateway, PyPI mcp-proxy.
  BRIDGES=$PEERS/bridges
  if [ -z "${SUPERGATEWAY:-}" ]; then
    [ -x "$BRIDGES/npm/node_modules/.bin/supergateway" ] ||
      npm install --no-audit --no-fund --prefix "$BRIDGES/npm" supergateway >&2
    SUPERGATEWAY=$BRIDGES/npm/node_modules/.bin/supergateway
  fi
  if [ -z "${MCP_PROXY:-}" ]; then
    [ -x "$BRIDGES/venv/bin/mcp-proxy" ] || {
      python3 -m venv "$BRIDGES/venv" &&
        "$BRIDGES/venv/bin/pip" install --quiet --disable-pip-version-check mcp-proxy >&2
    }
    MCP_PROXY=$BRIDGES/venv/bin/mcp-proxy
  fi
  echo "## 5. stdio server-everything bridged to streamable HTTP"
  # The upstream's own time: a raw stdio client straight to the server, same calls.
  python3 "$ROOT/tests/bench/stdio_direct.py" "$EVERYTHING" "$N" | sed 's/^/direct stdio: /'
  echo "{\"mcpServers\": {\"everything\": {\"command\": \"$EVERYTHING\", \"args\": [\"stdio\"]}}}" >"$WORK/stdio.json"
  start_quiver stdio --mcp-config "$WORK/stdio.json"
  "$BENCH" latency "$QURL" mcp__everything__echo echo "$N" | sed 's/^/quiver: /'
  kill "$QPID"
  if [ -n "${SUPERGATEWAY:-}" ]; then
    P=$(free_port)
    "$SUPERGATEWAY" --stdio "$EVERYTHING stdio" --outputTransport streamableHttp --stateful --port "$P" \
      >"$WORK/sg.out" 2>&1 &
    SG=$!; PIDS+=("$SG")
    wait_port "$P"
    "$BENCH" latency "http://127.0.0.1:$P/mcp" echo echo "$N" | sed 's/^/supergateway: /'
    kill "$SG"
  fi
  if [ -n "${MCP_PROXY:-}" ]; then
    P=$(free_port)
    "$MCP_PROXY" --port "$P" -- "$EVERYTHING" stdio >"$WORK/mp.out" 2>&1 &
    MP=$!; PIDS+=("$MP")
    wait_port "$P"
    "$BENCH" latency "http://127.0.0.1:$P/mcp" echo echo "$N" | sed 's/^/mcp-proxy: /'
    kill "$MP"
  fi
  echo "# $(uptime)"
  echo "## 5b. the same, side by side: all three bridges up at once, every round one call"
  echo "##     straight to the stdio server (a Rust raw client) and one through each bridge"
  start_quiver stdio2 --mcp-config "$WORK/stdio.json"
  QP=$QPID
  P1=$(free_port)
  "$SUPERGATEWAY" --stdio "$EVERYTHING stdio" --outputTransport streamableHttp --stateful --port "$P1" \
    >"$WORK/sg2.out" 2>&1 &
  SG=$!; PIDS+=("$SG")
  P2=$(free_port)
  "$MCP_PROXY" --port "$P2" -- "$EVERYTHING" stdio >"$WORK/mp2.out" 2>&1 &
  MP=$!; PIDS+=("$MP")
  wait_port "$P1"
  wait_port "$P2"
  for _ in 1 2; do
    "$BENCH" bridges echo "$N" 100 "$EVERYTHING stdio" echo \
      quiver "$QURL" mcp__everything__echo \
      supergateway "http://127.0.0.1:$P1/mcp" echo \
      mcp-proxy "http://127.0.0.1:$P2/mcp" echo
  done
  kill "$QP" "$SG" "$MP"
  echo "# $(uptime)"
fi
