use quiver_mcp_adapter::{ClientOptions, Liveness, McpClient, ServerConfig, validate_all};
use serde_json::json;
use std::{sync::Arc, time::Instant};
fn p50(mut v: Vec<i128>) -> i128 {
    v.sort();
    v[v.len() / 2]
}
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args().nth(1).unwrap();
    let catalog = Arc::new(quiver_registry::Catalog::new());
    let servers = validate_all(&[ServerConfig::http("a", url.clone()).required()], &|_| {
        None
    })
    .unwrap();
    let c = McpClient::start(
        catalog.clone(),
        servers,
        ClientOptions::default().with_liveness(Liveness::Off),
    );
    c.wait_ready(std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let t = catalog.lookup("mcp__a__echo").unwrap();
    let http = reqwest::Client::builder().build().unwrap();
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}});
    let r = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let _ = r.bytes().await.unwrap();
    let r = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", "2025-11-25")
        .body(json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string())
        .send()
        .await
        .unwrap();
    let _ = r.bytes().await.unwrap();
    let ctx = quiver_contract::CallContext::default();
    let (mut va, mut vb, mut d) = (vec![], vec![], vec![]);
    for i in 0..3000u64 {
        let s = Instant::now();
        let e = t.tool.call(json!({"message":"hi"}), &ctx).await.unwrap();
        assert!(e.is_ok());
        let x = s.elapsed().as_micros() as i128;
        let s = Instant::now();
        let r = http.post(&url).header("accept","application/json, text/event-stream").header("content-type","application/json").header("mcp-session-id", &sid).header("mcp-protocol-version","2025-11-25").body(json!({"jsonrpc":"2.0","id":i+10,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"}}}).to_string()).send().await.unwrap();
        let b = r.bytes().await.unwrap();
        assert!(b.len() > 10);
        let y = s.elapsed().as_micros() as i128;
        if i >= 300 {
            va.push(x);
            vb.push(y);
            d.push(x - y);
        }
    }
    println!(
        "adapter p50 {}  reqwest-raw p50 {}  median(adapter-raw) {}",
        p50(va),
        p50(vb),
        p50(d)
    );
}
