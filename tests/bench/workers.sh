#!/usr/bin/env bash
# One tokio worker against the default (one per core) for `quiver serve` in front of
# server-everything over HTTP, side by side (not a test: prints numbers).
#
#   bash tests/bench/workers.sh      # TARGET and PEERS as in tests/bench/ab.sh
#
# tests/bench/ab.sh with one server under TOKIO_WORKER_THREADS=1: three rounds of `compare`
# (added latency to the upstream) and of latency + 64-client throughput on the in-process
# `describe_tool`, taking the two in turn. The bench client keeps its default.
A_NAME="one worker" A_ENV="TOKIO_WORKER_THREADS=1" B_NAME="default" \
  exec bash "$(dirname "$0")/ab.sh"
