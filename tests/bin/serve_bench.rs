//! A bench client (not a test: nothing is asserted) for an MCP server over streamable HTTP:
//! a lean hand-written HTTP/1.1 client over one keep-alive `TcpStream` with `TCP_NODELAY`,
//! the MCP handshake, then sequential `tools/call` with latency percentiles, or many
//! concurrent clients (each its own connection and session) for throughput.
//!
//! Usage:
//! - `quiver-serve-bench latency URL TOOL ARGS [N] [WARMUP]`: N (1000) sequential calls after
//!   WARMUP (100) unmeasured ones; prints min/p50/p90/p99/max in µs.
//! - `quiver-serve-bench throughput URL TOOL ARGS CLIENTS SECS`: CLIENTS concurrent
//!   sessions calling for SECS seconds; prints calls/s.
//! - `quiver-serve-bench compare URL_A TOOL_A URL_B TOOL_B ARGS [N] [WARMUP]`: one session
//!   on each server, calls interleaved (A then B, then B then A, ...), so both series see
//!   the same load; prints both series and the median of the paired differences B - A
//!   (what B adds, robust against load that drifts during the run).
//! - `quiver-serve-bench bridges ARGS N WARMUP "CMD [CMD_ARGS]" NAME URL TOOL [NAME URL TOOL
//!   ...]`: the bridges of one stdio server side by side. CMD is the stdio server itself,
//!   called straight over its stdin/stdout (newline-delimited JSON-RPC, the upstream's own
//!   time); each NAME is a streamable-HTTP endpoint in front of its own copy of that server.
//!   Every round calls each of them once, the order rotating per round, so all series see
//!   the same load; prints each series, its added p50 over the direct one, the median of its
//!   paired differences, and, when one is named `quiver`, the ratio of the slowest other's
//!   added p50 to Quiver's.
//! - `quiver-serve-bench load URL SESSIONS CALLS CONCURRENCY TOOL_A ARGS_A TOOL_B ARGS_B`:
//!   SESSIONS sessions, CONCURRENCY at a time, each on its own connection: the handshake,
//!   CALLS calls alternating between A and B, then `DELETE`; prints the calls answered and
//!   every error (the first five with why), not stopping at one.
//! - `quiver-serve-bench proxy UPSTREAM_HOST:PORT`: a proxy that only copies bytes (tokio's
//!   `copy_bidirectional`, `TCP_NODELAY` on both sides, a task per connection), on a free
//!   loopback port it prints; runs until killed. `compare` through it gives what any proxy
//!   adds on this host, the floor under Quiver's added latency.
//!
//! ARGS is `describe` (alternates `{"name": "tool_search"}` and `{"name": "describe_tool"}`,
//! so the loop guard never sees identical consecutive calls), `echo`
//! (`{"message": "ping N"}` with a counter) or `city` (`{"city": "Paris N"}`, for the
//! fixture server's `weather_forecast`).
//!
//! A URL may end in `#bearer=TOKEN`: every request to it then carries `Authorization: Bearer
//! TOKEN` (a configured inbound token, or an OIDC access token).
//!
//! Output is one JSON object per run on stdout.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::{Child, ChildStdin, ChildStdout, Command},
};

struct Target {
    host_port: String,
    path: String,
    bearer: Option<String>,
}

impl Target {
    fn parse(url: &str) -> Result<Self> {
        let (url, bearer) = match url.split_once("#bearer=") {
            Some((u, t)) => (u, Some(t.to_owned())),
            None => (url, None),
        };
        let rest = url
            .strip_prefix("http://")
            .context("only http:// URLs are supported")?;
        let (host_port, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        Ok(Self {
            host_port: host_port.to_owned(),
            path: path.to_owned(),
            bearer,
        })
    }
}

struct Response {
    status: u16,
    session: Option<String>,
    body: Vec<u8>,
    event_stream: bool,
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    host_port: String,
    path: String,
    bearer: Option<String>,
    session: Option<String>,
    protocol: Option<String>,
    next_id: u64,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Conn {
    async fn connect(target: &Target) -> Result<Self> {
        let stream = TcpStream::connect(&target.host_port)
            .await
            .with_context(|| format!("connecting to {}", target.host_port))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 * 1024),
            host_port: target.host_port.clone(),
            path: target.path.clone(),
            bearer: target.bearer.clone(),
            session: None,
            protocol: None,
            next_id: 1,
        })
    }

    async fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            bail!("connection closed by the server");
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn read_until(&mut self, needle: &[u8]) -> Result<usize> {
        let mut from = 0;
        loop {
            if let Some(i) = find(&self.buf[from..], needle) {
                return Ok(from + i);
            }
            from = self.buf.len().saturating_sub(needle.len());
            self.fill().await?;
        }
    }

    async fn take(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill().await?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    async fn post(&mut self, body: &[u8]) -> Result<Response> {
        let mut req = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.path,
            self.host_port,
            body.len()
        );
        if let Some(t) = &self.bearer {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(s) = &self.session {
            req.push_str("Mcp-Session-Id: ");
            req.push_str(s);
            req.push_str("\r\n");
        }
        if let Some(p) = &self.protocol {
            req.push_str("Mcp-Protocol-Version: ");
            req.push_str(p);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.stream.write_all(&bytes).await?;

        let end = self.read_until(b"\r\n\r\n").await?;
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let (mut length, mut chunked, mut session, mut event_stream) = (None, false, None, false);
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "mcp-session-id" => session = Some(value.to_owned()),
                "content-type" => event_stream = value.starts_with("text/event-stream"),
                _ => {}
            }
        }
        let body = if chunked {
            let mut body = Vec::new();
            loop {
                let eol = self.read_until(b"\r\n").await?;
                let size_line = String::from_utf8_lossy(&self.buf[..eol]).into_owned();
                self.buf.drain(..eol + 2);
                let size_hex = size_line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(size_hex, 16)
                    .with_context(|| format!("bad chunk size {size_line:?}"))?;
                if size == 0 {
                    // No trailers expected: the terminating CRLF.
                    let eol = self.read_until(b"\r\n").await?;
                    self.buf.drain(..eol + 2);
                    break;
                }
                let data = self.take(size + 2).await?;
                body.extend_from_slice(&data[..size]);
            }
            body
        } else {
            self.take(length.unwrap_or(0)).await?
        };
        Ok(Response {
            status,
            session,
            body,
            event_stream,
        })
    }

    /// Sends a JSON-RPC request and returns its response's `result`.
    async fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": id, "method": method, "params": params
        }))?;
        let resp = self.post(&body).await?;
        if resp.status != 200 {
            bail!(
                "{method}: HTTP {}: {}",
                resp.status,
                String::from_utf8_lossy(&resp.body)
            );
        }
        if let Some(s) = resp.session {
            self.session = Some(s);
        }
        let message = if resp.event_stream {
            let text = String::from_utf8_lossy(&resp.body);
            let mut found = None;
            for line in text.lines() {
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                    continue;
                };
                if v["id"] == json!(id) {
                    found = Some(v);
                    break;
                }
            }
            found.with_context(|| format!("{method}: no response with id {id} in {text:?}"))?
        } else {
            serde_json::from_slice(&resp.body)?
        };
        if let Some(err) = message.get("error") {
            bail!("{method}: error {err}");
        }
        Ok(message["result"].clone())
    }

    async fn notify(&mut self, method: &str) -> Result<()> {
        let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method}))?;
        let resp = self.post(&body).await?;
        if !(200..300).contains(&resp.status) {
            bail!("{method}: HTTP {}", resp.status);
        }
        Ok(())
    }

    async fn handshake(&mut self) -> Result<()> {
        let result = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "quiver-serve-bench", "version": "0"}
                }),
            )
            .await?;
        self.protocol = result["protocolVersion"].as_str().map(str::to_owned);
        self.notify("notifications/initialized").await
    }

    /// Ends the session (HTTP DELETE), so that the server can free it.
    async fn close(&mut self) -> Result<String> {
        let Some(session) = self.session.take() else {
            return Ok(String::new());
        };
        let req = format!(
            "DELETE {} HTTP/1.1\r\nHost: {}\r\nMcp-Session-Id: {session}\r\nConnection: close\r\n\r\n",
            self.path, self.host_port
        );
        self.stream.write_all(req.as_bytes()).await?;
        // The status line is enough; the server closes the connection.
        let eol = self.read_until(b"\r\n").await?;
        let status = String::from_utf8_lossy(&self.buf[..eol]).into_owned();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let mut rest = Vec::new();
            self.stream.read_to_end(&mut rest).await
        })
        .await;
        Ok(status)
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Result<()> {
        let result = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await?;
        succeeded(tool, &result)
    }
}

/// A `tools/call` result that is not a tool error.
fn succeeded(tool: &str, result: &Value) -> Result<()> {
    if result["isError"] == json!(true) {
        bail!("tools/call {tool}: tool error {result}");
    }
    Ok(())
}

fn arguments(kind: &str, i: u64) -> Result<Value> {
    Ok(match kind {
        "describe" => {
            let name = if i.is_multiple_of(2) {
                "tool_search"
            } else {
                "describe_tool"
            };
            json!({"name": name})
        }
        "echo" => json!({"message": format!("ping {i}")}),
        "city" => json!({"city": format!("Paris {i}")}),
        other => bail!("unknown ARGS {other:?}: use describe, echo or city"),
    })
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn stats(micros: &mut [u64]) -> Value {
    micros.sort_unstable();
    let mean = micros.iter().sum::<u64>() as f64 / micros.len() as f64;
    json!({
        "min_us": micros[0],
        "p50_us": percentile(micros, 50.0),
        "p90_us": percentile(micros, 90.0),
        "p99_us": percentile(micros, 99.0),
        "max_us": micros[micros.len() - 1],
        "mean_us": mean.round(),
    })
}

async fn latency(target: Target, tool: &str, kind: &str, n: u64, warmup: u64) -> Result<()> {
    let mut conn = Conn::connect(&target).await?;
    conn.handshake().await?;
    for i in 0..warmup {
        conn.call(tool, arguments(kind, i)?).await?;
    }
    let mut micros = Vec::with_capacity(n as usize);
    for i in warmup..warmup + n {
        let args = arguments(kind, i)?;
        let start = Instant::now();
        conn.call(tool, args).await?;
        micros.push(start.elapsed().as_micros() as u64);
    }
    let delete_status = conn.close().await?;
    let mut out = json!({"mode": "latency", "tool": tool, "calls": n, "warmup": warmup});
    out.as_object_mut()
        .expect("an object")
        .extend(stats(&mut micros).as_object().expect("an object").clone());
    out["delete"] = json!(delete_status);
    println!("{out}");
    Ok(())
}

async fn timed(conn: &mut Conn, tool: &str, args: Value) -> Result<u64> {
    let start = Instant::now();
    conn.call(tool, args).await?;
    Ok(start.elapsed().as_micros() as u64)
}

async fn compare(
    a: (Target, String),
    b: (Target, String),
    kind: &str,
    n: u64,
    warmup: u64,
) -> Result<()> {
    let mut ca = Conn::connect(&a.0).await?;
    ca.handshake().await?;
    let mut cb = Conn::connect(&b.0).await?;
    cb.handshake().await?;
    for i in 0..warmup {
        ca.call(&a.1, arguments(kind, i)?).await?;
        cb.call(&b.1, arguments(kind, i)?).await?;
    }
    let (mut ta, mut tb, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for i in warmup..warmup + n {
        let (x, y) = if i.is_multiple_of(2) {
            let x = timed(&mut ca, &a.1, arguments(kind, i)?).await?;
            (x, timed(&mut cb, &b.1, arguments(kind, i)?).await?)
        } else {
            let y = timed(&mut cb, &b.1, arguments(kind, i)?).await?;
            (timed(&mut ca, &a.1, arguments(kind, i)?).await?, y)
        };
        ta.push(x);
        tb.push(y);
        diff.push(y as i64 - x as i64);
    }
    ca.close().await?;
    cb.close().await?;
    diff.sort_unstable();
    let median_diff = diff[diff.len() / 2];
    let (sa, sb) = (stats(&mut ta), stats(&mut tb));
    let added_p50 = sb["p50_us"].as_i64().unwrap_or(0) - sa["p50_us"].as_i64().unwrap_or(0);
    println!(
        "{}",
        json!({
            "mode": "compare", "calls": n, "warmup": warmup,
            "a": {"tool": a.1, "latency": sa},
            "b": {"tool": b.1, "latency": sb},
            "added_p50_us": added_p50,
            "median_paired_diff_us": median_diff,
        })
    );
    Ok(())
}

/// A raw client on a stdio MCP server: one JSON-RPC message per line.
struct Stdio {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    next_id: u64,
    line: String,
}

impl Stdio {
    async fn spawn(cmd: &str) -> Result<Self> {
        let mut parts = cmd.split_whitespace();
        let program = parts.next().context("an empty stdio command")?;
        let mut child = Command::new(program)
            .args(parts)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {cmd}"))?;
        let stdin = child.stdin.take().context("stdin")?;
        let out = BufReader::new(child.stdout.take().context("stdout")?);
        let mut s = Stdio {
            child,
            stdin,
            out,
            next_id: 0,
            line: String::new(),
        };
        s.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "quiver-serve-bench", "version": "1"}}),
        )
        .await?;
        s.stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
            .await?;
        Ok(s)
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        self.next_id += 1;
        let mut msg = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}),
        )?;
        msg.push(b'\n');
        self.stdin.write_all(&msg).await?;
        loop {
            self.line.clear();
            if self.out.read_line(&mut self.line).await? == 0 {
                bail!("the stdio server closed its stdout");
            }
            let reply: Value = serde_json::from_str(&self.line)?;
            if reply["id"] == json!(self.next_id) {
                if let Some(e) = reply.get("error") {
                    bail!("{method}: {e}");
                }
                return Ok(reply["result"].clone());
            }
        }
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Result<()> {
        let result = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await?;
        succeeded(tool, &result)
    }
}

async fn bridges(
    kind: &str,
    n: u64,
    warmup: u64,
    direct_cmd: &str,
    direct_tool: &str,
    targets: Vec<(String, Target, String)>,
) -> Result<()> {
    let mut direct = Stdio::spawn(direct_cmd).await?;
    let mut conns = Vec::new();
    for (name, target, _) in &targets {
        let mut c = Conn::connect(target)
            .await
            .with_context(|| format!("connecting to {name}"))?;
        c.handshake().await?;
        conns.push(c);
    }
    let sides = targets.len() + 1;
    let mut times: Vec<Vec<u64>> = vec![Vec::with_capacity(n as usize); sides];
    for i in 0..warmup + n {
        let mut round = vec![0u64; sides];
        for k in 0..sides {
            let side = (i as usize + k) % sides;
            let args = arguments(kind, i)?;
            let start = Instant::now();
            if side == 0 {
                direct.call(direct_tool, args).await?;
            } else {
                conns[side - 1].call(&targets[side - 1].2, args).await?;
            }
            round[side] = start.elapsed().as_micros() as u64;
        }
        if i >= warmup {
            for (t, r) in times.iter_mut().zip(round) {
                t.push(r);
            }
        }
    }
    for c in &mut conns {
        c.close().await?;
    }
    let _ = direct.child.start_kill();
    let paired: Vec<i64> = (1..sides)
        .map(|side| {
            let mut d: Vec<i64> = times[side]
                .iter()
                .zip(&times[0])
                .map(|(b, a)| *b as i64 - *a as i64)
                .collect();
            d.sort_unstable();
            d[d.len() / 2]
        })
        .collect();
    let stats: Vec<Value> = times.iter_mut().map(|t| stats(t)).collect();
    let p50 = |v: &Value| v["p50_us"].as_i64().unwrap_or(0);
    let direct_p50 = p50(&stats[0]);
    let mut out_targets = Vec::new();
    let mut added = Vec::new();
    for (side, (name, _, tool)) in targets.iter().enumerate() {
        let a = p50(&stats[side + 1]) - direct_p50;
        added.push((name.clone(), a));
        out_targets.push(json!({
            "name": name, "tool": tool, "latency": stats[side + 1],
            "added_p50_us": a, "median_paired_added_us": paired[side],
        }));
    }
    let mut out = json!({
        "mode": "bridges", "calls": n, "warmup": warmup,
        "direct": {"command": direct_cmd, "latency": stats[0]},
        "targets": out_targets,
    });
    if let Some((_, q)) = added.iter().find(|(name, _)| name == "quiver")
        && let Some((slowest, worst)) = added
            .iter()
            .filter(|(name, _)| name != "quiver")
            .max_by_key(|(_, a)| *a)
        && *q > 0
    {
        out["ratio_slowest_peer_over_quiver"] = json!({
            "peer": slowest,
            "ratio": ((*worst as f64 / *q as f64) * 10.0).round() / 10.0,
        });
    }
    println!("{out}");
    Ok(())
}

async fn throughput(target: Target, tool: &str, kind: &str, clients: u64, secs: f64) -> Result<()> {
    let target = std::sync::Arc::new(target);
    // Connect and handshake every client first, then start them together.
    let mut conns = Vec::new();
    for _ in 0..clients {
        let mut conn = Conn::connect(&target).await?;
        conn.handshake().await?;
        conns.push(conn);
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for mut conn in conns {
        let tool = tool.to_owned();
        let kind = kind.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                conn.call(&tool, arguments(&kind, i)?).await?;
                i += 1;
            }
            let done = Instant::now();
            conn.close().await?;
            anyhow::Ok((i, done))
        }));
    }
    let mut total = 0;
    let mut last = start;
    for t in tasks {
        // Until each client's last call returned: closing its session is not counted.
        let (calls, done) = t.await??;
        total += calls;
        last = last.max(done);
    }
    let elapsed = (last - start).as_secs_f64();
    println!(
        "{}",
        json!({
            "mode": "throughput", "tool": tool, "clients": clients,
            "seconds": (elapsed * 1000.0).round() / 1000.0, "calls": total,
            "calls_per_s": (total as f64 / elapsed).round(),
        })
    );
    Ok(())
}

/// Copies bytes between each accepted connection and a new one to `upstream`.
async fn proxy(upstream: String) -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    loop {
        let (mut inbound, _) = listener.accept().await?;
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

/// `load`: SESSIONS sessions, CONCURRENCY at a time, each on its own connection: the
/// handshake, CALLS calls alternating between tool A and tool B, then `DELETE`. A failed
/// call is counted (the first few are kept with why), not fatal, so a run reports every
/// error it met.
async fn load(
    target: Target,
    sessions: u64,
    calls: u64,
    concurrency: usize,
    a: (String, String),
    b: (String, String),
) -> Result<()> {
    let target = std::sync::Arc::new(target);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..sessions {
        let (target, slots) = (target.clone(), slots.clone());
        let (a, b) = (a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await?;
            let mut conn = Conn::connect(&target).await?;
            conn.handshake().await?;
            let mut errors = Vec::new();
            let mut done = 0u64;
            for i in 0..calls {
                let (tool, kind) = if i.is_multiple_of(2) { &a } else { &b };
                // Each tool's own counter, so its consecutive calls never repeat each other.
                match conn.call(tool, arguments(kind, (s * calls + i) / 2)?).await {
                    Ok(()) => done += 1,
                    Err(e) => errors.push(format!("session {s} call {i}: {e:#}")),
                }
            }
            conn.close().await?;
            anyhow::Ok((done, errors))
        }));
    }
    let (mut answered, mut errors) = (0u64, Vec::new());
    for t in tasks {
        match t.await? {
            Ok((done, errs)) => {
                answered += done;
                errors.extend(errs);
            }
            Err(e) => errors.push(format!("a session failed: {e:#}")),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "mode": "load", "sessions": sessions, "calls_per_session": calls,
            "concurrency": concurrency, "calls": sessions * calls, "answered": answered,
            "errors": errors.len(), "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
            "seconds": (secs * 1000.0).round() / 1000.0,
            "calls_per_s": (answered as f64 / secs).round(),
        })
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: quiver-serve-bench latency URL TOOL ARGS [N] [WARMUP] | \
                 throughput URL TOOL ARGS CLIENTS SECS | \
                 compare URL_A TOOL_A URL_B TOOL_B ARGS [N] [WARMUP] | \
                 bridges ARGS N WARMUP \"CMD [CMD_ARGS]\" DIRECT_TOOL NAME URL TOOL [...] | \
                 proxy UPSTREAM_HOST:PORT | \
                 load URL SESSIONS CALLS CONCURRENCY TOOL_A ARGS_A TOOL_B ARGS_B";
    let get = |i: usize| args.get(i).map(String::as_str).context(usage);
    let mode = get(0)?;
    if mode == "compare" {
        let a = (Target::parse(get(1)?)?, get(2)?.to_owned());
        let b = (Target::parse(get(3)?)?, get(4)?.to_owned());
        let kind = get(5)?.to_owned();
        let n = args.get(6).map_or(Ok(1000), |s| s.parse())?;
        let warmup = args.get(7).map_or(Ok(100), |s| s.parse())?;
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(compare(a, b, &kind, n, warmup));
    }
    if mode == "load" {
        let target = Target::parse(get(1)?)?;
        let (sessions, calls, concurrency) = (get(2)?.parse()?, get(3)?.parse()?, get(4)?.parse()?);
        let a = (get(5)?.to_owned(), get(6)?.to_owned());
        let b = (get(7)?.to_owned(), get(8)?.to_owned());
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(load(target, sessions, calls, concurrency, a, b));
    }
    if mode == "proxy" {
        let upstream = get(1)?.to_owned();
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(proxy(upstream));
    }
    if mode == "bridges" {
        let kind = get(1)?.to_owned();
        let n = get(2)?.parse()?;
        let warmup = get(3)?.parse()?;
        let (cmd, direct_tool) = (get(4)?.to_owned(), get(5)?.to_owned());
        let rest = &args[6..];
        if rest.is_empty() || !rest.len().is_multiple_of(3) {
            bail!("{usage}");
        }
        let targets = rest
            .chunks(3)
            .map(|c| Ok((c[0].clone(), Target::parse(&c[1])?, c[2].clone())))
            .collect::<Result<Vec<_>>>()?;
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(bridges(&kind, n, warmup, &cmd, &direct_tool, targets));
    }
    let target = Target::parse(get(1)?)?;
    let tool = get(2)?.to_owned();
    let kind = get(3)?.to_owned();
    match mode {
        "latency" => {
            let n = args.get(4).map_or(Ok(1000), |s| s.parse())?;
            let warmup = args.get(5).map_or(Ok(100), |s| s.parse())?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(latency(target, &tool, &kind, n, warmup))
        }
        "throughput" => {
            let clients = get(4)?.parse()?;
            let secs = get(5)?.parse()?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(throughput(target, &tool, &kind, clients, secs))
        }
        _ => bail!("{usage}"),
    }
}
