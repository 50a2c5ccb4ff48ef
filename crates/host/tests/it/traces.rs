//! OpenTelemetry traces of `quiver serve`, sent to a real OTLP receiver: a Python server
//! decoding each export with the official OTLP protobuf definitions (PyPI
//! `opentelemetry-proto`, and `grpcio` for its gRPC service; installed by
//! `.ci/setup-peers`), over HTTP and over gRPC. The call goes from the client
//! (with its own `traceparent`) through a custom tool's `call_tool` to a streamable-HTTP
//! upstream (the official Python SDK), which reports the trace context it received.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::serve::{get, open, rpc, start_with, stop};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
/// The client's trace: its trace id and the id of its span that made the request.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// A second client trace, sent in `_meta` (SEP-414) instead of the header.
const META_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const META_SPAN: &str = "b7ad6b7169203331";

fn python() -> PathBuf {
    let peers = std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers")));
    let python = peers.join("venv/bin/python");
    let ok = Command::new(&python)
        .args([
            "-c",
            "import opentelemetry.proto.collector.trace.v1, grpc, mcp",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the OTLP receiver needs opentelemetry-proto, grpcio and mcp in {}: run .ci/setup-peers",
        python.display()
    );
    python
}

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The receiver: its process, its HTTP address (exports and `GET /spans`), and its gRPC
/// address.
fn receiver(python: &Path) -> (Killed, String, String) {
    let mut child = Command::new(python)
        .arg(format!("{FIXTURES}/otlp_receiver.py"))
        .arg("--grpc")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut port = || -> u16 {
        let line = lines.next().unwrap().unwrap();
        line.trim().parse().expect("the receiver prints its ports")
    };
    let (http, grpc) = (port(), port());
    (
        Killed(child),
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{grpc}"),
    )
}

/// The traced upstream on a free port, once it accepts connections.
fn upstream(python: &Path) -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(python)
        .arg(format!("{FIXTURES}/traced_upstream.py"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the traced upstream never listened"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (Killed(child), addr)
}

/// What the receiver holds.
fn received(receiver: &str) -> Value {
    let (status, body) = get(receiver, "/spans", &[]);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(body.split("\r\n\r\n").nth(1).unwrap_or(&body)).unwrap()
}

/// The spans of `trace`, once `want` of them have arrived.
fn spans_of(receiver: &str, trace: &str, want: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans: Vec<Value> = received(receiver)["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["trace_id"] == trace)
            .cloned()
            .collect();
        if spans.len() >= want {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {want} spans of trace {trace} arrived: {spans:#?}",
            spans.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The one span named `name` whose parent is `parent`.
fn child<'a>(spans: &'a [Value], parent: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parent_span_id"] == parent && s["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name:?} under {parent}; the spans: {spans:#?}"
    );
    found[0]
}

fn id(span: &Value) -> &str {
    span["span_id"].as_str().unwrap()
}

/// The text of a `tools/call` answer's first content item, parsed as the tool's JSON.
fn tool_text(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    // JSON, or an event stream whose answer is the event with an id.
    let message: Value = std::iter::once(body)
        .chain(body.lines().filter_map(|l| l.strip_prefix("data:")))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m.get("id").is_some())
        .unwrap_or_else(|| panic!("an answer: {answer}"));
    assert_eq!(message["result"]["isError"], false, "{message}");
    let result = message["result"]["structuredContent"]["result"]
        .as_str()
        .unwrap_or_else(|| panic!("a text result: {message}"));
    serde_json::from_str(result).unwrap()
}

/// A store with the custom tool `relay_trace` approved: it calls the upstream's `whoami`
/// through `call_tool` and returns what it said. Traces go to `collector`.
fn config(dir: &Path, collector: &str, upstream: &str, extra: &str) {
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[telemetry]\notlp_endpoint = \"http://{collector}\"\nheaders = {{ x-api-key = \"collector-key\" }}\n{extra}\n[surface]\nanchors = [\"mcp__traced__whoami\", \"relay_trace\"]\n\n[[mcp.servers]]\nname = \"traced\"\nurl = \"http://{upstream}/mcp\"\nrequired = true\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("relay.js"),
        "async function main(inputs) {\n  return await call_tool(\"mcp__traced__whoami\", {});\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {"note": {"type": "string", "description": "Anything."}}}"#,
    )
    .unwrap();
    for args in [
        vec![
            "custom",
            "add",
            "relay.js",
            "--name",
            "relay_trace",
            "--description",
            "Asks the traced server which trace context reached it.",
            "--schema",
            "schema.json",
        ],
        vec!["custom", "approve", "relay_trace", "--force"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(&args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The names of the threads of process `pid`.
fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect()
}

/// One trace per call: the client's `traceparent` header is the MCP server span's parent;
/// the custom tool's dispatch, its timeout, its sandbox run, the nested `call_tool`'s
/// dispatch and the upstream call follow as children, in that order; the upstream received
/// the upstream call span's context in both the header and `_meta`. A trace sent in
/// `_meta` instead is continued the same way. Arguments stay off the spans. The execution
/// log's rows carry the trace id.
#[test]
fn a_call_through_call_tool_to_an_http_upstream_is_one_trace_continued_from_the_client() {
    let python = python();
    let (_receiver, receiver_addr, _) = receiver(&python);
    let (_upstream, upstream_addr) = upstream(&python);
    let dir = crate::Scratch::new("traces");
    config(&dir, &receiver_addr, &upstream_addr, "");
    let (quiver, addr) = start_with(&dir, &[], &[], &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);
    assert!(
        threads(quiver.id())
            .iter()
            .any(|t| t.starts_with("OpenTelemetry")),
        "the batch exporter's thread runs: {:?}",
        threads(quiver.id())
    );
    let sid = open(&addr, "traces");
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let answer = rpc(
        &addr,
        &[
            ("Mcp-Session-Id", &sid),
            ("Quiver-Conversation", "traces"),
            ("traceparent", &traceparent),
        ],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"relay_trace","arguments":{"note":"secret-argument"}}}"#,
    );
    let seen = tool_text(&answer);

    let spans = spans_of(&receiver_addr, CLIENT_TRACE, 7);
    let server = child(&spans, CLIENT_SPAN, "tools/call relay_trace");
    assert_eq!(server["kind"], 2, "SERVER: {server}");
    let attrs = &server["attributes"];
    assert_eq!(attrs["mcp.method.name"], "tools/call");
    assert_eq!(attrs["gen_ai.tool.name"], "relay_trace");
    assert_eq!(attrs["mcp.session.id"], sid.as_str());
    assert_eq!(attrs["mcp.protocol.version"], "2025-11-25");
    assert_eq!(server["service"], "quiver");
    let dispatch = child(&spans, id(server), "execute_tool relay_trace");
    assert_eq!(
        dispatch["attributes"]["gen_ai.operation.name"],
        "execute_tool"
    );
    assert_eq!(dispatch["attributes"]["quiver.outcome"], "ok");
    assert_eq!(dispatch["attributes"]["quiver.call.depth"], 0);
    let timeout = child(&spans, id(dispatch), "quiver.timeout");
    let run = child(&spans, id(timeout), "quiver.sandbox.run");
    assert_eq!(run["attributes"]["quiver.custom_tool"], "relay_trace");
    assert_eq!(run["attributes"]["quiver.sandbox.host_calls"], 1);
    let nested = child(&spans, id(run), "execute_tool mcp__traced__whoami");
    assert_eq!(nested["attributes"]["quiver.call.depth"], 1);
    assert_eq!(nested["attributes"]["quiver.server"], "traced");
    assert_eq!(nested["attributes"]["gen_ai.tool.type"], "extension");
    assert_eq!(
        nested["attributes"]["quiver.call.parent_id"],
        dispatch["attributes"]["gen_ai.tool.call.id"]
    );
    let nested_timeout = child(&spans, id(nested), "quiver.timeout");
    let upstream_call = child(&spans, id(nested_timeout), "tools/call whoami");
    assert_eq!(upstream_call["kind"], 3, "CLIENT: {upstream_call}");
    assert_eq!(upstream_call["attributes"]["quiver.server"], "traced");
    let sent = format!("00-{CLIENT_TRACE}-{}-01", id(upstream_call));
    assert_eq!(
        seen,
        json!({"header": sent, "meta": sent}),
        "what the upstream received"
    );
    for span in &spans {
        let text = span.to_string();
        assert!(
            !text.contains("secret-argument"),
            "arguments are off: {text}"
        );
        assert!(
            span["attributes"]
                .get("gen_ai.tool.call.arguments")
                .is_none()
        );
    }

    // The same, with the client's context in `_meta` rather than a header.
    let answer = rpc(
        &addr,
        &[("Mcp-Session-Id", &sid), ("Quiver-Conversation", "traces")],
        &format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"mcp__traced__whoami","arguments":{{}},"_meta":{{"traceparent":"00-{META_TRACE}-{META_SPAN}-01"}}}}}}"#
        ),
    );
    let seen = tool_text(&answer);
    let spans = spans_of(&receiver_addr, META_TRACE, 4);
    let server = child(&spans, META_SPAN, "tools/call mcp__traced__whoami");
    let dispatch = child(&spans, id(server), "execute_tool mcp__traced__whoami");
    let timeout = child(&spans, id(dispatch), "quiver.timeout");
    let upstream_call = child(&spans, id(timeout), "tools/call whoami");
    let sent = format!("00-{META_TRACE}-{}-01", id(upstream_call));
    assert_eq!(seen, json!({"header": sent, "meta": sent}));

    // The execution log names each call's trace: the custom tool's row and its nested
    // call's row carry the client's trace id.
    let deadline = Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["log", "--json", "--limit", "10"])
            .current_dir(&dir)
            .output()
            .unwrap();
        let rows: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if rows.len() >= 3 {
            break rows;
        }
        assert!(Instant::now() < deadline, "rows: {rows:#?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let trace_of = |tool: &str, trace: &str| {
        rows.iter()
            .filter(|r| r["tool"] == tool && r["trace_id"] == trace)
            .count()
    };
    assert_eq!(trace_of("relay_trace", CLIENT_TRACE), 1, "{rows:#?}");
    assert_eq!(
        trace_of("mcp__traced__whoami", CLIENT_TRACE),
        1,
        "{rows:#?}"
    );
    assert_eq!(trace_of("mcp__traced__whoami", META_TRACE), 1, "{rows:#?}");

    let exports = received(&receiver_addr)["exports"].clone();
    assert!(
        exports
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["api_key"] == "collector-key" && e["protocol"] == "http"),
        "every export came over HTTP with the configured header: {exports}"
    );
    stop(quiver);
}

/// Over gRPC, with `record_payloads`: a call's arguments and result are on its dispatch
/// span; a call with no client context starts a trace of its own (a root span); a call
/// refused before it runs is an error on the MCP server span, with `error.type`.
#[test]
fn over_grpc_payloads_are_recorded_when_configured_and_a_call_without_context_starts_a_trace() {
    let python = python();
    let (_receiver, receiver_addr, grpc_addr) = receiver(&python);
    let (_upstream, upstream_addr) = upstream(&python);
    let dir = crate::Scratch::new("traces-payloads");
    config(
        &dir,
        &grpc_addr,
        &upstream_addr,
        "protocol = \"grpc\"\nservice_name = \"quiver-test\"\nrecord_payloads = true\n",
    );
    assert_eq!(
        status_traces(&dir),
        format!(
            "traces: `quiver serve` exports them over OTLP (gRPC) to http://{grpc_addr}, with arguments and results"
        )
    );
    let (quiver, addr) = start_with(&dir, &[], &[], &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);
    let sid = open(&addr, "payloads");
    let headers = [
        ("Mcp-Session-Id", sid.as_str()),
        ("Quiver-Conversation", "payloads"),
    ];
    tool_text(&rpc(
        &addr,
        &headers,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"relay_trace","arguments":{"note":"visible-argument"}}}"#,
    ));
    // `note` must be a string: the dispatcher refuses the call before it runs, and the
    // MCP server span is an error.
    rpc(
        &addr,
        &headers,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"relay_trace","arguments":{"note":7}}}"#,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let (ok, server, refused) = loop {
        let all = received(&receiver_addr)["spans"]
            .as_array()
            .unwrap()
            .clone();
        let ok = all.iter().find(|s| {
            s["name"] == "execute_tool relay_trace" && s["attributes"]["quiver.outcome"] == "ok"
        });
        let server = ok.and_then(|ok| all.iter().find(|s| s["span_id"] == ok["parent_span_id"]));
        let refused = all
            .iter()
            .find(|s| s["name"] == "tools/call relay_trace" && s["status"] == 2);
        if let (Some(ok), Some(server), Some(refused)) = (ok, server, refused) {
            break (ok.clone(), server.clone(), refused.clone());
        }
        assert!(Instant::now() < deadline, "spans: {all:#?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(server["name"], "tools/call relay_trace");
    assert_eq!(server["parent_span_id"], "", "a root span: {server}");
    assert_eq!(server["service"], "quiver-test");
    let args = ok["attributes"]["gen_ai.tool.call.arguments"]
        .as_str()
        .unwrap();
    assert!(args.contains("visible-argument"), "{ok}");
    let result = ok["attributes"]["gen_ai.tool.call.result"]
        .as_str()
        .unwrap();
    assert!(result.contains("header"), "the rendered result: {ok}");
    assert_eq!(refused["parent_span_id"], "", "{refused}");
    assert!(refused["attributes"]["error.type"].is_string(), "{refused}");
    let exports = received(&receiver_addr)["exports"].clone();
    assert!(
        exports
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["api_key"] == "collector-key" && e["protocol"] == "grpc"),
        "every export came over gRPC with the configured metadata: {exports}"
    );
    stop(quiver);
}

/// `quiver status`'s line about traces.
fn status_traces(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("status")
        .current_dir(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.starts_with("traces: "))
        .unwrap_or_else(|| panic!("a traces line: {text}"))
        .to_owned()
}

/// Without `[telemetry]`, no exporter thread runs, and `quiver status` says traces are off.
#[test]
fn without_telemetry_no_exporter_thread_runs() {
    let dir = crate::Scratch::new("traces-off");
    std::fs::write(dir.join("quiver.toml"), "[surface]\nanchors = []\n").unwrap();
    assert_eq!(
        status_traces(&dir),
        "traces: off (set [telemetry] otlp_endpoint to export them)"
    );
    let (quiver, _addr) = start_with(&dir, &[], &[], &[]);
    let names = threads(quiver.id());
    assert!(names.iter().any(|t| t.starts_with("tokio")), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|t| t.starts_with("OpenTelemetry") || t.starts_with("reqwest")),
        "{names:?}"
    );
    stop(quiver);
}
