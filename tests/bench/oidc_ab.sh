#!/usr/bin/env bash
# What an OIDC access token costs a request through `quiver serve`, against a configured
# static token on the same server: the npm oidc-provider (tests/fixtures/oidc/provider.mjs)
# issues a client-credentials JWT for the server's resource; `quiver-serve-bench compare`
# then calls `describe_tool` through one session with each credential, interleaved, and
# prints the median of the paired differences (what the JWT adds: the verifier's cache hit
# and the claim rules, the signature having been checked on the first request).
#
# Usage: tests/bench/oidc_ab.sh [N] [WARMUP]   (release binaries: cargo build --release
#        -p quiver-host -p quiver-tests --bin quiver --bin quiver-serve-bench)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
peers="${QUIVER_PEERS:-$repo/.peers}"
n="${1:-2000}"
warmup="${2:-200}"
bin="$repo/target/release"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
resource="http://127.0.0.1:$port/mcp"
node "$repo/tests/fixtures/oidc/provider.mjs" "$peers/npm/node_modules" "$resource" >"$dir/provider.out" 2>/dev/null &
for _ in $(seq 100); do grep -q '^issuer ' "$dir/provider.out" && break; sleep 0.1; done
issuer="$(awk '/^issuer /{print $2}' "$dir/provider.out")"
cat >"$dir/quiver.toml" <<TOML
[store]
path = "$dir/quiver.db"

[[auth.tokens]]
name = "static"
token = "static-token-for-the-bench"

[auth.oidc]
issuer = "$issuer"
resource = "$resource"
TOML
(cd "$dir" && "$bin/quiver" serve --listen "127.0.0.1:$port" >"$dir/serve.out" 2>"$dir/serve.err") &
for _ in $(seq 100); do grep -q '/mcp' "$dir/serve.out" 2>/dev/null && break; sleep 0.1; done
jwt="$(curl -s -u ops-bot:ops-bot-secret -d grant_type=client_credentials -d "resource=$resource" "$issuer/token" |
    python3 -c 'import sys, json; print(json.load(sys.stdin)["access_token"])')"
"$bin/quiver-serve-bench" compare "$resource#bearer=static-token-for-the-bench" describe_tool \
    "$resource#bearer=$jwt" describe_tool describe "$n" "$warmup"
