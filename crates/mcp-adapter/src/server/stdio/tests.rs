//! The stdio transport's tests: lines it cannot take are answered, batches and ids in flight.

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;

/// A client's `initialize` (id 0) asking for `version`.
fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
}

/// A transport on pipes: what the client writes, what it reads back, and the token the
/// end of input cancels.
fn pipes(
    max_line: usize,
) -> (
    LineTransport<tokio::io::DuplexStream, tokio::io::DuplexStream>,
    tokio::io::DuplexStream,
    tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
    CancellationToken,
) {
    let (client_in, server_in) = tokio::io::duplex(1 << 16);
    let (server_out, client_out) = tokio::io::duplex(1 << 16);
    let ct = CancellationToken::new();
    let transport = LineTransport::new(server_in, server_out, ct.clone()).with_max_line(max_line);
    (transport, client_in, BufReader::new(client_out).lines(), ct)
}

async fn answer(out: &mut tokio::io::Lines<BufReader<tokio::io::DuplexStream>>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(5), out.next_line())
        .await
        .expect("an answer")
        .unwrap()
        .expect("a line");
    serde_json::from_str(&line).unwrap()
}

/// Each line the server cannot take is answered (with the request's id when it can be
/// read), and the next good line is still read. rmcp's own transport ignored the text that
/// is not JSON, answered the shape errors without an `id`, and dropped an over-long line
/// unanswered.
#[tokio::test]
async fn lines_that_cannot_be_read_are_answered_and_reading_goes_on() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    // A new id each time: the pings are never answered, so an id stays in flight.
    let cases: Vec<(String, i64, &str, Value)> = vec![
        ("hello".into(), -32700, "not valid JSON", Value::Null),
        (
            "Content-Length: 52".into(),
            -32700,
            "no `Content-Length` header",
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#.into(),
            -32600,
            "`jsonrpc` must be \"2.0\"",
            Value::from(5),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"a","method":7}"#.into(),
            -32600,
            "`method` must be a string",
            Value::from("a"),
        ),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.into(),
            -32600,
            "a batch",
            Value::Null,
        ),
        (
            "x".repeat(10_000),
            -32600,
            "longer than 4096 bytes",
            Value::Null,
        ),
        // Valid JSON too deep for the parser: said so, with its id (not "not valid
        // JSON", id null).
        (
            format!(
                r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}1{}}}}}}}"#,
                "[".repeat(150),
                "]".repeat(150)
            ),
            -32600,
            "nests arrays and objects more than 128 levels deep",
            Value::from(9),
        ),
        // A number past what a 64-bit float holds: valid JSON, said to be too large.
        (
            r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"t","arguments":{"a":1e400}}}"#.into(),
            -32600,
            "holds a number too large for Quiver to read",
            Value::from(11),
        ),
        // A lone surrogate: not JSON serde reads, but its id is there.
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"ping","params":{"x":"\ud800"}}"#.into(),
            -32700,
            "not valid JSON",
            Value::from(10),
        ),
    ];
    for (n, (line, code, says, id)) in cases.into_iter().enumerate() {
        let ping = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, 42 + n);
        input
            .write_all(format!("{line}\n{ping}\n").as_bytes())
            .await
            .unwrap();
        let taken = transport.receive().await.expect("the ping is read");
        assert_eq!(
            serde_json::to_value(&taken).unwrap()["id"],
            42 + n,
            "after {line:.40}"
        );
        let refusal = answer(&mut out).await;
        assert_eq!(refusal["error"]["code"], code, "{line:.40}: {refusal}");
        assert!(
            refusal["error"]["message"].as_str().unwrap().contains(says),
            "{line:.40}: {refusal}"
        );
        assert_eq!(refusal["id"], id, "{line:.40}: {refusal}");
        assert!(refusal.as_object().unwrap().contains_key("id"), "{refusal}");
    }
}

/// Each `tools/call` the transport refuses is told to the hook that records its row (none
/// had one): a line nested too deeply (its deep part cut), text that is not JSON, a
/// message that is not JSON-RPC, an id in flight, a batch's shared ids. A refused
/// message that is no call is not.
#[tokio::test]
async fn each_tools_call_refused_here_is_told_for_its_row() {
    let (transport, mut input, mut out, _ct) = pipes(4096);
    let told = Arc::new(Mutex::new(Vec::new()));
    let mut transport = transport.with_refused_calls(Arc::new({
        let told = told.clone();
        move |call: invalid::RefusedCall, refusal: &Refusal| {
            let input = match crate::lines::holds_cut(&call.input) {
                true => json!("cut"),
                false => call.input,
            };
            lock(&told).push((call.name, input, refusal.kind()));
        }
    }));
    let init = initialize("2025-03-26");
    input
        .write_all(format!("{init}\n").as_bytes())
        .await
        .unwrap();
    transport.receive().await.expect("the initialize is read");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let lines = [
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":{deep}}}}}}}"#
        ),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo""#.into(),
        r#"{"jsonrpc":"1.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"y":3}}}"#.into(),
        r#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#.into(),
        json!([
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"a": 1}}},
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": "other", "arguments": {"b": 2}}},
        ])
        .to_string(),
        // In flight from here (never answered), then sent again.
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"slow","arguments":{}}}"#.into(),
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"z":6}}}"#.into(),
        r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#.into(),
    ];
    input
        .write_all(format!("{}\n", lines.join("\n")).as_bytes())
        .await
        .unwrap();
    for id in [6, 7] {
        let taken = transport.receive().await.expect("a request is read");
        assert_eq!(serde_json::to_value(&taken).unwrap()["id"], id);
    }
    // Five refusals written: three lines, the batch's answer, the reused id.
    for _ in 0..5 {
        answer(&mut out).await;
    }
    let told = lock(&told).clone();
    assert_eq!(
        told,
        vec![
            ("echo".to_owned(), json!("cut"), "too_deep"),
            ("echo".to_owned(), Value::Null, "parse_error"),
            ("echo".to_owned(), json!({"y": 3}), "invalid_request"),
            ("echo".to_owned(), json!({"a": 1}), "invalid_request"),
            ("other".to_owned(), json!({"b": 2}), "invalid_request"),
            ("echo".to_owned(), json!({"z": 6}), "invalid_request"),
        ]
    );
}

/// A request before `initialize` without the 2026-07-28 `_meta` fields is told both
/// ways in (rmcp named only the `_meta` fields), a `tools/call` so refused is told for
/// its row; a ping passes, and so does a 2026-07-28 request with its `_meta`.
#[tokio::test]
async fn a_request_before_initialize_is_told_to_initialize() {
    let (transport, mut input, mut out, _ct) = pipes(4096);
    let told = Arc::new(Mutex::new(Vec::new()));
    let mut transport = transport.with_refused_calls(Arc::new({
        let told = told.clone();
        move |call: invalid::RefusedCall, refusal: &Refusal| {
            lock(&told).push((call.name, refusal.kind()));
        }
    }));
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "tool_search", "arguments": {"query": "weather"}}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}),
    ];
    for line in &lines {
        input
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    for id in [2, 3] {
        let taken = transport.receive().await.expect("a request is read");
        assert_eq!(serde_json::to_value(&taken).unwrap()["id"], id);
    }
    let refusal = answer(&mut out).await;
    assert_eq!(refusal["id"], 1, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid Request: `tools/call` before the session is initialized: send `initialize` first"),
        "{refusal}"
    );
    assert_eq!(
        *lock(&told),
        [("tool_search".to_owned(), "invalid_request")]
    );
}

/// Blank lines, a byte-order mark and CRLF get no answer: the next message is read.
#[tokio::test]
async fn blank_lines_a_bom_and_crlf_are_not_answered() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    input
        .write_all(
            concat!(
                "\n   \r\n\u{feff}",
                r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
                "\r\n",
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let taken = transport.receive().await.expect("the ping is read");
    assert_eq!(serde_json::to_value(&taken).unwrap()["id"], 1);
    // Nothing was written: the next line out is the one this test sends now.
    transport
        .send(ServerJsonRpcMessage::error(
            rmcp::model::ErrorData::internal_error("marker", None),
            Some(rmcp::model::NumberOrString::Number(9)),
        ))
        .await
        .unwrap();
    assert_eq!(answer(&mut out).await["id"], 9);
}

/// A client that asked for 2025-03-26 may send a batch: its messages are taken one by
/// one, and the answers to its requests go back as one array line once all are in, with
/// the answer to an element that cannot be read. An empty batch is one -32600.
#[tokio::test]
async fn a_batch_of_a_2025_03_26_client_is_answered_in_one_line() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    let init = initialize("2025-03-26");
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "two", "method": "ping"},
        {"jsonrpc": "1.0", "id": 3, "method": "ping"},
        {"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": [1]},
        {"jsonrpc": "2.0", "id": 12, "method": "ping"},
        {"jsonrpc": "2.0", "id": 13, "method": "initialize"},
    ]);
    input
        .write_all(format!("{init}\n[]\n{batch}\n").as_bytes())
        .await
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..4 {
        let m = transport.receive().await.expect("a message");
        taken.push(serde_json::to_value(&m).unwrap());
    }
    assert_eq!(taken[0]["method"], "initialize");
    assert_eq!(
        taken[1..]
            .iter()
            .map(|m| m["id"].clone())
            .collect::<Vec<_>>(),
        [json!(1), Value::Null, json!("two")]
    );
    // The empty batch is refused at once.
    let empty = answer(&mut out).await;
    assert_eq!(empty["error"]["code"], -32600, "{empty}");
    assert!(
        empty["error"]["message"]
            .as_str()
            .unwrap()
            .contains("an empty batch")
    );
    let reply = |id: Value| {
        serde_json::from_value::<ServerJsonRpcMessage>(
            json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        )
        .unwrap()
    };
    // One answer in: nothing written yet; the last one sends the array.
    transport.send(reply(json!("two"))).await.unwrap();
    transport.send(reply(json!(1))).await.unwrap();
    let answers = answer(&mut out).await;
    let answers = answers.as_array().expect("one array line");
    let mut ids: Vec<String> = answers.iter().map(|a| a["id"].to_string()).collect();
    ids.sort();
    assert_eq!(
        ids,
        ["\"two\"", "1", "12", "12", "13", "3", "4"],
        "{answers:?}"
    );
    // A malformed request still holds its id: neither it nor the ping sharing it runs
    // (the ping was answered too, with the same id as the refusal).
    let twelve: Vec<&str> = answers
        .iter()
        .filter(|a| a["id"] == 12)
        .map(|a| a["error"]["message"].as_str().unwrap_or("a result"))
        .collect();
    assert_eq!(
        twelve,
        ["Invalid Request: 2 requests of this batch carry the id 12, and none of them was run; give each request its own id";
            2],
        "{twelve:?}"
    );
    // An `initialize` without params is refused as one, not as malformed.
    let thirteen = answers.iter().find(|a| a["id"] == 13).unwrap();
    assert!(
        thirteen["error"]["message"]
            .as_str()
            .unwrap()
            .contains("an `initialize` must not be part of a batch"),
        "{thirteen}"
    );
    let bad = answers.iter().find(|a| a["id"] == 3).unwrap();
    assert_eq!(bad["error"]["code"], -32600, "{bad}");
    // An `initialize` must not be part of a batch (it was answered, claiming 2025-06-18
    // while batches were still taken).
    let init = answers.iter().find(|a| a["id"] == 4).unwrap();
    assert_eq!(
        init["error"]["message"],
        "Invalid Request: an `initialize` must not be part of a batch; send it alone, as the session's first message",
        "{init}"
    );
    // An answer outside any batch goes out alone, as before.
    transport.send(reply(json!(7))).await.unwrap();
    assert_eq!(answer(&mut out).await["id"], 7);
}

/// A cancelled request of a batch is not waited for: the batch's other answers go out
/// once they are in (it waited for an answer a cancelled request never gets).
#[tokio::test]
async fn a_cancelled_request_does_not_hold_its_batch() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    let init = initialize("2025-03-26");
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "slow"}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]);
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1}});
    input
        .write_all(format!("{init}\n{batch}\n{cancel}\n").as_bytes())
        .await
        .unwrap();
    for _ in 0..4 {
        transport.receive().await.expect("a message");
    }
    let reply = serde_json::from_value::<ServerJsonRpcMessage>(
        json!({"jsonrpc": "2.0", "id": 2, "result": {}}),
    )
    .unwrap();
    transport.send(reply).await.unwrap();
    let answers = answer(&mut out).await;
    assert_eq!(answers, json!([{"jsonrpc": "2.0", "id": 2, "result": {}}]));
}

/// Batched requests that share an id are all refused inside the batch's array, none of
/// them run (running the first would put a result and an error under its id in the
/// array); one reusing the id of a request in flight from an earlier line is refused
/// there too. The refusals go in the array, not on a line of their own beside it, and the
/// earlier request's answer is never taken into the batch.
#[tokio::test]
async fn a_batch_reusing_an_id_is_refused_inside_its_answer() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    let init = initialize("2025-03-26");
    let alone =
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "slow"}});
    let batch = json!([
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "slow"}},
        {"jsonrpc": "2.0", "id": 5, "method": "ping"},
        {"jsonrpc": "2.0", "id": 9, "method": "ping"},
        {"jsonrpc": "2.0", "id": 6, "method": "ping"},
        {"jsonrpc": "2.0", "id": 6.0, "method": "ping"},
        {"jsonrpc": "2.0", "id": 8, "method": "ping"},
    ]);
    // Every request of it refused: answered at once (the ping after it is read once it
    // has been).
    let refused = json!([{"jsonrpc": "2.0", "id": 9.0, "method": "ping"}]);
    let ping = json!({"jsonrpc": "2.0", "id": 11, "method": "ping"});
    input
        .write_all(format!("{init}\n{alone}\n{batch}\n{refused}\n{ping}\n").as_bytes())
        .await
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..4 {
        let m = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        taken.push((m["id"].clone(), m["method"].clone()));
    }
    assert_eq!(
        taken[1..],
        [
            (json!(9), json!("tools/call")),
            (json!(8), json!("ping")),
            (json!(11), json!("ping")),
        ]
    );
    let reply = |id: u64| {
        serde_json::from_value::<ServerJsonRpcMessage>(
            json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        )
        .unwrap()
    };
    // The batch whose every request is refused is answered at once, in an array.
    let all_refused = answer(&mut out).await;
    assert_eq!(
        (
            all_refused[0]["id"].clone(),
            all_refused[0]["error"]["code"].clone(),
            all_refused.as_array().map(Vec::len)
        ),
        (json!(9.0), json!(-32600), Some(1)),
        "{all_refused}"
    );
    transport.send(reply(8)).await.unwrap();
    // Then the first batch's array: its five refusals and the one that ran.
    let answers = answer(&mut out).await;
    let answers = answers.as_array().expect("the batch's array");
    assert_eq!(answers.len(), 6, "{answers:?}");
    let refusals: Vec<(Value, &str)> = answers
        .iter()
        .filter(|a| a["error"]["code"] == -32600)
        .map(|a| (a["id"].clone(), a["error"]["message"].as_str().unwrap()))
        .collect();
    let shared = |id: u64| {
        format!(
            "Invalid Request: 2 requests of this batch carry the id {id}, and none of them was run; give each request its own id"
        )
    };
    let (five, six) = (shared(5), shared(6));
    assert_eq!(
        refusals,
        [
            (json!(5), five.as_str()),
            (json!(5), five.as_str()),
            (
                json!(9),
                "Invalid Request: the id 9 is already used by a request in flight; give each request its own id"
            ),
            (json!(6), six.as_str()),
            (json!(6.0), six.as_str()),
        ],
        "{answers:?}"
    );
    let results: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("result").is_some())
        .map(|a| &a["id"])
        .collect();
    assert_eq!(results, [&json!(8)], "{answers:?}");
    // The request in flight from the earlier line is answered alone, not into a batch.
    transport.send(reply(9)).await.unwrap();
    assert_eq!(
        answer(&mut out).await,
        json!({"jsonrpc": "2.0", "id": 9, "result": {}})
    );
}

/// A malformed `initialize` is told what an `initialize` needs (rmcp read it as a 2026
/// request and asked for `_meta` fields), and a good one after it opens the session.
#[tokio::test]
async fn a_malformed_initialize_is_told_what_it_needs() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    let bad = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 20250618, "capabilities": {}}});
    let good = json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    input
        .write_all(format!("{bad}\n{good}\n").as_bytes())
        .await
        .unwrap();
    let taken = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(taken["id"], 2, "{taken}");
    let refusal = answer(&mut out).await;
    assert_eq!(refusal["id"], 1, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32602, "{refusal}");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid params: an `initialize` needs `params` with `protocolVersion`"),
        "{refusal}"
    );
}

/// A request that reuses the id of one in flight is refused (one of the two answers was
/// lost); once the first is answered, or cancelled, its id may be used again.
#[tokio::test]
async fn a_request_reusing_an_id_in_flight_is_refused() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    let init = initialize("2025-11-25");
    input
        .write_all(format!("{init}\n").as_bytes())
        .await
        .unwrap();
    transport.receive().await.expect("the initialize is read");
    let call =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "slow"}});
    let ping = |id: u64| json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
    input
        .write_all(format!("{call}\n{}\n{}\n", ping(3), ping(4)).as_bytes())
        .await
        .unwrap();
    let first = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(first["method"], "tools/call");
    // The second 3 is refused; the 4 after it is taken.
    let next = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(next["id"], 4, "{next}");
    let refusal = answer(&mut out).await;
    assert_eq!(refusal["id"], 3, "{refusal}");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the id 3 is already used by a request in flight"),
        "{refusal}"
    );
    // Answered: the id is free again.
    let reply = serde_json::from_value::<ServerJsonRpcMessage>(
        json!({"jsonrpc": "2.0", "id": 3, "result": {}}),
    )
    .unwrap();
    transport.send(reply).await.unwrap();
    assert_eq!(answer(&mut out).await["id"], 3);
    input
        .write_all(format!("{}\n", ping(3)).as_bytes())
        .await
        .unwrap();
    let again = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(
        (again["id"].clone(), again["method"].clone()),
        (json!(3), json!("ping"))
    );
}

/// A second `initialize` is refused: it was answered, claiming the version it asked for,
/// while the transport kept the first one's (batches on or off).
#[tokio::test]
async fn a_second_initialize_is_refused() {
    let (mut transport, mut input, mut out, _ct) = pipes(4096);
    let init = |id: u64, version: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
    };
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    input
        .write_all(
            format!(
                "{}\n{}\n{ping}\n",
                init(1, "2025-06-18"),
                init(2, "2025-03-26")
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let first = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(first["id"], 1, "{first}");
    let next = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(next["id"], 3, "{next}");
    let refusal = answer(&mut out).await;
    assert_eq!(
        (refusal["id"].clone(), refusal["error"]["code"].clone()),
        (json!(2), json!(-32600)),
        "{refusal}"
    );
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this session is already initialized"),
        "{refusal}"
    );
}

/// A notification before the first request is dropped: rmcp's handshake ends the
/// session on one, so the `initialize` after it was never answered.
#[tokio::test]
async fn a_notification_before_initialize_is_dropped() {
    let (mut transport, mut input, _out, _ct) = pipes(4096);
    let early = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let init = initialize("2025-11-25");
    input
        .write_all(format!("{early}\n{init}\n{early}\n").as_bytes())
        .await
        .unwrap();
    let first = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(first["method"], "initialize", "{first}");
    // After the first request, notifications pass.
    let next = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
    assert_eq!(next["method"], "notifications/initialized", "{next}");
}

/// The end of input ends `receive` and cancels the calls still in flight after the grace.
#[tokio::test(start_paused = true)]
async fn the_end_of_input_cancels_after_the_grace() {
    let (mut transport, input, _out, ct) = pipes(4096);
    drop(input);
    assert!(transport.receive().await.is_none());
    assert!(!ct.is_cancelled());
    tokio::time::sleep(STDIN_CLOSED_GRACE + Duration::from_millis(10)).await;
    assert!(ct.is_cancelled());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
    ))]

    /// Whatever a line holds, the transport neither panics nor stops: the ping after it
    /// is read, and a line it did not take as a message is answered with a JSON-RPC error
    /// (parse error or invalid request).
    #[test]
    fn any_line_is_taken_or_answered_and_reading_goes_on(lines in proptest::collection::vec(crate::server::fuzz::any_line(), 1..6)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let (mut transport, mut input, mut out, _ct) = pipes(4096);
            for (n, line) in lines.iter().enumerate() {
                let ping = 1_000_000_000 + n;
                input
                    .write_all(format!("{line}\n{{\"jsonrpc\":\"2.0\",\"id\":{ping},\"method\":\"ping\"}}\n").as_bytes())
                    .await
                    .unwrap();
                let id_of = |m: &ClientJsonRpcMessage| serde_json::to_value(m).unwrap()["id"].clone();
                let first = tokio::time::timeout(Duration::from_secs(5), transport.receive())
                    .await
                    .expect("read in time")
                    .expect("the input is open");
                if id_of(&first) == ping {
                    // The line was not taken: it was answered.
                    let refusal = answer(&mut out).await;
                    let code = refusal["error"]["code"].as_i64();
                    assert!(
                        matches!(code, Some(-32700 | -32600 | -32602)),
                        "{line:.80}: {refusal}"
                    );
                } else {
                    let second = tokio::time::timeout(Duration::from_secs(5), transport.receive())
                        .await
                        .expect("read in time")
                        .expect("the input is open");
                    assert_eq!(id_of(&second), ping, "after {line:.80}");
                }
            }
        });
    }
}
