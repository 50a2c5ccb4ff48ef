use std::process::{Command, Output};

fn quiver(args: &[&str]) -> Output {
    let dir = std::env::temp_dir().join(format!("quiver-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .current_dir(&dir)
        .env("QUIVER_LOG", "error")
        .output()
        .expect("quiver runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn tools_lists_the_built_in_surface_in_every_format() {
    let table = quiver(&["tools"]);
    assert!(table.status.success());
    insta::assert_snapshot!("tools_table", stdout(&table));
    let openai = quiver(&["tools", "--format", "openai"]);
    insta::assert_snapshot!("tools_openai", stdout(&openai));
    let anthropic: serde_json::Value =
        serde_json::from_slice(&quiver(&["tools", "--format", "anthropic"]).stdout).unwrap();
    assert_eq!(anthropic[0]["name"], "tool_search");
    assert!(anthropic[0]["input_schema"]["properties"]["query"].is_object());
    let bad = quiver(&["tools", "--mode", "party"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("use chat, agentic, delegate or plan"));
}

#[test]
fn call_exits_by_envelope_kind() {
    let ok = quiver(&["call", "tool_search", r#"{"query": "describe a tool"}"#]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    assert!(stdout(&ok).starts_with("✓ ok."));
    let hint = quiver(&["call", "tool_search", r#"{"query": "the of and"}"#]);
    assert_eq!(hint.status.code(), Some(0));
    assert!(stdout(&hint).starts_with("⚠"), "{}", stdout(&hint));
    let err = quiver(&["call", "no_such_tool", "{}"]);
    assert_eq!(err.status.code(), Some(1));
    assert!(stdout(&err).contains("undefined_tool"));
    let malformed = quiver(&["call", "tool_search", "{nope"]);
    assert_eq!(malformed.status.code(), Some(0));
    assert!(stdout(&malformed).contains("not valid JSON"));
}

#[test]
fn check_lints_and_rejects_a_broken_config() {
    let ok = quiver(&["check"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    assert!(stdout(&ok).contains("0 finding(s)"));
    let dir = std::env::temp_dir().join(format!("quiver-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("quiver.toml");
    std::fs::write(&cfg, "[surface]\ntarget_flor = 3\n").unwrap();
    let bad = quiver(&["--config", cfg.to_str().unwrap(), "check"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("quiver.toml") && err.contains("did you mean `target_floor`?"),
        "{err}"
    );
    let missing = quiver(&["--config", "/nonexistent/q.toml", "tools"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("cannot read config /nonexistent/q.toml")
    );
}

#[test]
fn bench_search_prints_the_metrics() {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/bench/toolsearch/livemcpbench"
    );
    let out = quiver(&[
        "bench-search",
        "--tools",
        &format!("{root}/tools.jsonl"),
        "--queries",
        &format!("{root}/queries.jsonl"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["queries"], 94);
    for key in ["hit@1", "recall@5", "recall@10", "ndcg@10"] {
        assert!(v[key].as_f64().is_some(), "{key} in {v}");
    }
}
