"""Calls `echo` N times straight on a stdio MCP server (newline-delimited JSON-RPC, no SDK),
after 100 warm-up calls, and prints the latency percentiles as one JSON line: the upstream's
own time, against which a bridge's added latency is measured. Not a test."""

import json
import subprocess
import sys
import time


def main() -> None:
    server, n = sys.argv[1], int(sys.argv[2])
    proc = subprocess.Popen(
        [server, "stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    next_id = 0

    def request(method: str, params: dict) -> dict:
        nonlocal next_id
        next_id += 1
        msg = {"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()
        while True:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("the server closed its stdout")
            reply = json.loads(line)
            if reply.get("id") == next_id:
                return reply

    request(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "stdio-direct-bench", "version": "1"},
        },
    )
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    proc.stdin.flush()
    times = []
    for i in range(100 + n):
        t0 = time.perf_counter()
        reply = request("tools/call", {"name": "echo", "arguments": {"message": f"m{i}"}})
        took = time.perf_counter() - t0
        if "error" in reply:
            raise SystemExit(f"echo failed: {reply['error']}")
        if i >= 100:
            times.append(took * 1e6)
    proc.terminate()
    proc.wait()
    times.sort()
    pick = lambda q: round(times[min(len(times) - 1, int(q * len(times)))])
    print(json.dumps({"calls": n, "p50_us": pick(0.5), "p90_us": pick(0.9), "p99_us": pick(0.99)}))


if __name__ == "__main__":
    main()
