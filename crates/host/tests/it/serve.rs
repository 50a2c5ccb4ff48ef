//! `quiver serve` with inbound tokens from `quiver.toml`.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

fn post(addr: &str, token: Option<&str>) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn configured_tokens_guard_the_endpoint() {
    let dir = std::env::temp_dir().join(format!("quiver-serve-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"ci\"\ntoken = \"${env:QUIVER_TEST_TOKEN}\"\nmode = \"plan\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env("QUIVER_TEST_TOKEN", "s3cret-token-value")
        .env("QUIVER_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("quiver serve prints its URL");
    let addr = url
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let without = post(&addr, None);
    let wrong = post(&addr, Some("nope"));
    let right = post(&addr, Some("s3cret-token-value"));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(without.starts_with("HTTP/1.1 401"), "{without}");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    assert!(right.starts_with("HTTP/1.1 200"), "{right}");
    assert!(right.contains("\"protocolVersion\""), "{right}");
    assert!(
        status.success(),
        "quiver serve exits cleanly on SIGTERM: {status}"
    );
}
