#!/usr/bin/env bash
# The execution-log writer's linger, A against B, for `quiver serve` in front of
# server-everything over HTTP, side by side (not a test: prints numbers).
#
#   LA=2 LB=20 bash tests/bench/linger.sh      # TARGET and PEERS as in tests/bench/ab.sh
#
# tests/bench/ab.sh with `[store] log_linger_ms` LA and LB (default 2 and 20): three rounds of
# `compare` (added latency to the upstream) each, taking the two in turn.
LA=${LA:-2} LB=${LB:-20}
A_NAME="linger $LA" A_TOML="[store]\nlog_linger_ms = $LA" \
  B_NAME="linger $LB" B_TOML="[store]\nlog_linger_ms = $LB" COMPARE_ONLY=1 \
  exec bash "$(dirname "$0")/ab.sh"
