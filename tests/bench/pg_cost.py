"""What one call through `quiver serve` costs its PostgreSQL store: statements, rows and
server CPU per call, for the sizing estimate in docs/DEPLOY.md.

Usage: python pg_cost.py QUIVER [CALLS] [CLIENTS]

Starts a PostgreSQL server of its own (initdb in a temp dir, pg_ctl on a free port, as the
`postgres` user when run as root; `pg_stat_statements` loaded; durable settings), one
`quiver serve` on it, and the official Python MCP client; then, per workload, resets the
statistics, makes CALLS calls in all from CLIENTS clients at once (default 1), each its own
stateless conversation, waits for the log writer, and
reads pg_stat_statements and the CPU time of the server's processes (/proc). Prints one
table per workload. Run from the repository root with the peers' Python
(`.peers/venv/bin/python tests/bench/pg_cost.py target/release/quiver`).

Workloads: `describe_tool` and `tool_search` over the built-in tools (the conversation's
working set stays empty), and `echo`: server-everything's echo (from `.peers`) called by a
conversation that found it with `tool_search`, so it holds a tool and each call moves its
round, which a shared store writes.
"""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

QUIVER = os.path.abspath(sys.argv[1])
CALLS = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
CLIENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 1
BIN = os.path.dirname(os.path.realpath(shutil.which("initdb") or sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]))
AS = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(postmaster):
    """utime+stime of the postmaster and its live children, plus what its reaped children used."""
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.split("/")[2])
        ppid = int(fields[1])
        if pid == postmaster:
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def psql(tmp, port, sql):
    out = subprocess.run(AS + [f"{BIN}/psql", "-X", "-At", "-h", tmp, "-p", str(port), "-U", "quiver", "-d", "quiver", "-c", sql],
                         capture_output=True, text=True, check=True, cwd=tmp)
    return out.stdout.strip()




async def main():
    tmp = tempfile.mkdtemp(prefix="quiver-pgcost-")
    if AS:
        subprocess.run(["chown", "-R", "postgres", tmp], check=True)
    port = free_port()
    subprocess.run(AS + [f"{BIN}/initdb", "-D", f"{tmp}/data", "-U", "quiver", "-A", "trust"], check=True, capture_output=True, cwd=tmp)
    opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
    subprocess.run(AS + [f"{BIN}/pg_ctl", "-D", f"{tmp}/data", "-o", opts, "-l", f"{tmp}/log", "-w", "start"], check=True, capture_output=True, cwd=tmp)
    serve = None
    try:
        subprocess.run(AS + [f"{BIN}/psql", "-X", "-h", tmp, "-p", str(port), "-U", "quiver", "-d", "postgres", "-c", "CREATE DATABASE quiver"], check=True, capture_output=True, cwd=tmp)
        psql(tmp, port, "CREATE EXTENSION pg_stat_statements")
        postmaster = int(open(f"{tmp}/data/postmaster.pid").readline())
        work = tempfile.mkdtemp(prefix="quiver-pgcost-serve-")
        with open(f"{work}/quiver.toml", "w") as f:
            f.write(f'[store]\nurl = "postgres://quiver@127.0.0.1:{port}/quiver"\n')
        everything = os.path.abspath(".peers/npm/node_modules/.bin/mcp-server-everything")
        if not os.path.exists(everything):
            sys.exit(f"{everything} is missing: run .ci/setup-peers from the repository root first")
        with open(f"{work}/mcp.json", "w") as f:
            f.write('{"mcpServers": {"everything": {"command": "%s"}}}' % everything)
        serve = subprocess.Popen([QUIVER, "--mcp-config", "mcp.json", "serve", "--listen", "127.0.0.1:0"],
                                 cwd=work, stdout=subprocess.PIPE, text=True)
        url = serve.stdout.readline().strip()

        async def describe(c, i):
            r = await c.call_tool("describe_tool", {"name": ("tool_search", "describe_tool")[(i // CLIENTS) % 2]})
            assert not r.is_error, r

        async def search(c, i):
            r = await c.call_tool("tool_search", {"query": f"find a tool number {i}"})
            assert not r.is_error, r

        async def echo(c, i):
            if i < 0:
                r = await c.call_tool("tool_search", {"query": "echo back the input string"})
                assert "mcp__everything__echo" in str(r.structured_content.get("exposed")), r
            r = await c.call_tool("mcp__everything__echo", {"message": f"m{i}"})
            assert not r.is_error, r

        for name, call in (("describe_tool", describe), ("tool_search", search), ("echo", echo)):
            clients = []
            stack = contextlib.AsyncExitStack()
            for k in range(CLIENTS):
                http = httpx2.AsyncClient(headers={"Quiver-Conversation": f"cost-{name}-{k}"}, timeout=httpx2.Timeout(60))
                c = await stack.enter_async_context(Client(streamable_http_client(url, http_client=http), mode="auto"))
                await call(c, -1)
                clients.append(c)
            await anyio.sleep(1)
            psql(tmp, port, "SELECT pg_stat_statements_reset()")
            logged0 = int(psql(tmp, port, "SELECT count(*) FROM execution_log"))
            cpu0 = cpu_seconds(postmaster)
            t0 = time.monotonic()

            async def run(c, k):
                for i in range(k, CALLS, CLIENTS):
                    await call(c, i)

            async with anyio.create_task_group() as tg:
                for k, c in enumerate(clients):
                    tg.start_soon(run, c, k)
            wall = time.monotonic() - t0
            await anyio.sleep(1.5)  # the log writer's last batch, the working-set mirror
            cpu = cpu_seconds(postmaster) - cpu0
            logged = int(psql(tmp, port, "SELECT count(*) FROM execution_log")) - logged0
            await stack.aclose()
            rows = psql(tmp, port, "SELECT calls, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_statements "
                        "WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY calls DESC")
            total_calls = total_rows = 0
            print(f"\n== {name}: {CALLS} calls from {CLIENTS} clients in {wall:.2f} s; PostgreSQL CPU {cpu:.2f} s "
                  f"({cpu / CALLS * 1000:.2f} s per 1000 calls)")
            for line in rows.splitlines():
                calls, nrows, query = line.split("|", 2)
                total_calls += int(calls)
                total_rows += int(nrows)
                print(f"  {int(calls) / CALLS:8.3f} per call  {int(nrows) / CALLS:8.3f} rows  {query}")
            print(f"  total: {total_calls / CALLS:.3f} statements per call, {total_rows / CALLS:.3f} rows per call "
                  f"as pg_stat_statements counts them; execution_log grew by {logged} rows")
        size = psql(tmp, port, "SELECT pg_total_relation_size('execution_log') / count(*) FROM execution_log")
        print(f"\nexecution_log: {size} bytes per row, indexes and TOAST included")
    finally:
        if serve:
            serve.terminate()
            serve.wait(timeout=15)
        subprocess.run(AS + [f"{BIN}/pg_ctl", "-D", f"{tmp}/data", "-m", "fast", "-w", "stop"], capture_output=True, cwd=tmp)
        shutil.rmtree(tmp, ignore_errors=True)


anyio.run(main)
