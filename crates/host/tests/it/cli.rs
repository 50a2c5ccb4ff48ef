use std::process::{Command, Output};

use crate::ONE_TOOL_SERVER;

fn workdir(name: &str) -> crate::Scratch {
    crate::Scratch::new(&format!("cli-{name}"))
}

fn quiver(args: &[&str]) -> Output {
    let name = args
        .join("_")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(40)
        .collect::<String>();
    quiver_in(&workdir(&name), args)
}

pub(crate) fn quiver_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .current_dir(dir)
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
    for limit in ["0", "51"] {
        let out = quiver(&["search", "csv", "--limit", limit]);
        assert_eq!(out.status.code(), Some(2), "--limit {limit}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("1..=50"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
    // JSON that does not parse is a usage error (2), not a result: a script can tell it
    // from a hint. The hint is still shown, and for a tool that does not exist the answer
    // is that it does not exist.
    let malformed = quiver(&["call", "tool_search", "{nope"]);
    assert_eq!(malformed.status.code(), Some(2));
    assert!(stdout(&malformed).contains("not valid JSON"));
    assert!(
        String::from_utf8_lossy(&malformed.stderr).contains("the JSON argument is not valid JSON")
    );
    let nowhere = quiver(&["call", "no_such_tool", r#"{"a": 1"#]);
    assert_eq!(nowhere.status.code(), Some(2));
    assert!(
        stdout(&nowhere).contains("undefined_tool"),
        "{}",
        stdout(&nowhere)
    );
}

#[test]
fn check_lints_and_rejects_a_broken_config() {
    let ok = quiver(&["check"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    assert!(stdout(&ok).contains("0 finding(s)"));
    // Nothing was compared without --against, and the summary says so.
    assert!(
        stdout(&ok).contains("breaking changes not checked (--against DB)"),
        "{}",
        stdout(&ok)
    );
    let dir = workdir("bad");
    let cfg = dir.join("quiver.toml");
    std::fs::write(&cfg, "[surface]\ntarget_flor = 3\n").unwrap();
    let bad = quiver(&["--config", cfg.to_str().unwrap(), "check"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("quiver.toml") && err.contains("did you mean `target_floor`?"),
        "{err}"
    );
    // Inbound tokens `serve` would refuse fail `check` too, naming the file and the token.
    let auth = dir.join("auth.toml");
    std::fs::write(&auth, "[[auth.tokens]]\nname = \"a:b\"\ntoken = \"s\"\n").unwrap();
    let bad = quiver(&["--config", auth.to_str().unwrap(), "check"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("auth.toml: [[auth.tokens]]") && err.contains("tokens[0]: the name `a:b`"),
        "{err}"
    );
    // A server name Quiver refuses gets a valid one to rename it to, as in an mcpServers
    // file.
    let named = dir.join("named.toml");
    std::fs::write(
        &named,
        "[[mcp.servers]]\nname = \"server-git\"\ncommand = \"true\"\n",
    )
    .unwrap();
    let bad = quiver(&["--config", named.to_str().unwrap(), "check"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("invalid server name \"server-git\"")
            && err.contains("rename it, e.g. to \"server_git\""),
        "{err}"
    );
    // A name or pattern that matches no tool is a finding (a typo'd deny rule never fires),
    // with a did-you-mean for a near name; one under a server that is not connected is a
    // note.
    let typo = dir.join("typo.toml");
    std::fs::write(
        &typo,
        "[[policy.rules]]\nid = \"no-search\"\ntool = \"tool_serch\"\naction = \"deny\"\nmessage = \"no\"\n\n[[policy.rules]]\nid = \"net\"\ntool = \"mcp__*__drop_table\"\naction = \"deny\"\nmessage = \"no\"\n\n[limits.tool_timeouts]\ntool_search = 5\n\"mcp__gone__*\" = 9\n\"mcp__down__x\" = 9\n\n[[mcp.servers]]\nname = \"down\"\ntransport = \"stdio\"\ncommand = \"/nonexistent/quiver-test-server\"\n\n[[mcp.servers]]\nname = \"nocwd\"\ntransport = \"stdio\"\ncommand = \"python3\"\ncwd = \"/nonexistent/quiver-test-dir\"\n\n[[mcp.servers]]\nname = \"dies\"\ntransport = \"stdio\"\ncommand = \"sh\"\nargs = [\"-c\", \"echo boom: no database >&2; exit 2\"]\n",
    )
    .unwrap();
    let told = quiver(&["--config", typo.to_str().unwrap(), "check"]);
    let text = stdout(&told);
    assert_eq!(told.status.code(), Some(1), "{text}");
    assert!(
        text.contains("policy.rules[no-search].tool: [unmatched] `tool_serch` matches no tool in the catalog; did you mean `tool_search`?"),
        "{text}"
    );
    assert!(
        text.contains("limits.tool_timeouts: [unmatched] `mcp__gone__*` matches no tool in the catalog (this key takes exact names"),
        "{text}"
    );
    assert!(
        text.contains(
            "limits.tool_timeouts: [note] `mcp__down__x` not checked: server down is not connected"
        ),
        "{text}"
    );
    // A pattern that matches nothing yet is a safety net: a note, not counted.
    assert!(
        text.contains(
            "policy.rules[net].tool: [note] pattern `mcp__*__drop_table` matches no tool in the catalog now"
        ),
        "{text}"
    );
    assert!(!text.contains("`tool_search` matches no tool"), "{text}");
    assert!(text.contains("2 unmatched name(s)"), "{text}");
    // A server whose command cannot be started is a finding, required or not.
    assert!(
        text.contains("mcp server down: [cannot start] `/nonexistent/quiver-test-server`: No such file or directory"),
        "{text}"
    );
    // A server whose command cannot start is one finding, counted once in the summary
    // (it was counted again as not connected).
    let ghost = dir.join("ghost.toml");
    std::fs::write(
        &ghost,
        "[[mcp.servers]]\nname = \"ghost\"\ncommand = \"/nonexistent/mcp-ghost\"\n",
    )
    .unwrap();
    let one = quiver(&["--config", ghost.to_str().unwrap(), "check"]);
    assert_eq!(one.status.code(), Some(1), "{}", stdout(&one));
    let lines = stdout(&one);
    assert_eq!(lines.matches("[cannot start]").count(), 1, "{lines}");
    assert!(lines.contains(" 1 finding(s)"), "{lines}");
    // A reason that already says what to fix is not told it twice.
    let liar = dir.join("liar.toml");
    std::fs::write(
        &liar,
        "[[mcp.servers]]\nname = \"liar\"\ncommand = \"python3\"\nargs = [\"-c\", \"import sys, json\\nm = json.loads(sys.stdin.readline())\\nprint(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': 'nope'}), flush=True)\\nsys.stdin.read()\"]\n",
    )
    .unwrap();
    let lied = stdout(&quiver(&["--config", liar.to_str().unwrap(), "check"]));
    assert!(
        lied.contains("mcp server liar: [not connected] rejected: the server's initialize result cannot be read")
            && lied.contains("; fix the server (`quiver status` shows its state)"),
        "{lied}"
    );
    assert!(!lied.contains("fix the server; fix"), "{lied}");
    // A server that starts and dies is a finding that says why.
    assert!(
        text.contains("mcp server dies: [not connected] connect failed:")
            && text.contains(
                "connect failed: the process exited with code 2 before it answered `initialize`; its stderr ended with: boom: no database"
            )
            // Where to look when it needed a variable it no longer inherits.
            && text.contains("(it runs with its `env` and only part of Quiver's environment: a variable it needs goes in `env` or `inherit_env`)"),
        "{text}"
    );
    // A missing working directory is named as such, not as a missing command.
    assert!(
        text.contains("mcp server nocwd: [cannot start] `python3`: its working directory `/nonexistent/quiver-test-dir` (`cwd`) is not a directory"),
        "{text}"
    );
    let help = quiver(&["check", "--help"]);
    assert!(
        stdout(&help).contains("tool name that matches no tool (`[unmatched]`"),
        "{}",
        stdout(&help)
    );
    // Settings that do not fit together are a finding.
    let misfit = dir.join("misfit.toml");
    std::fs::write(&misfit, "[surface]\nmax_surface = 4\n").unwrap();
    let told = quiver(&["--config", misfit.to_str().unwrap(), "check"]);
    let text = stdout(&told);
    assert_eq!(told.status.code(), Some(1), "{text}");
    assert!(
        text.contains("surface: [config] max_surface (4) is below round.max_definitions (32)"),
        "{text}"
    );
    assert!(text.contains("1 finding(s)"), "{text}");
    // Logged too, without terminal colour codes (stderr is a pipe here).
    let logged = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["--config", misfit.to_str().unwrap(), "tools"])
        .current_dir(&dir)
        .env("QUIVER_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&logged.stderr);
    assert!(err.contains("max_surface (4)"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
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

#[test]
fn every_call_lands_in_the_log_and_log_filters_it() {
    let dir = workdir("log");
    quiver_in(
        &dir,
        &[
            "call",
            "tool_search",
            r#"{"query": "describe tools"}"#,
            "--session",
            "a",
        ],
    );
    quiver_in(&dir, &["call", "missing_tool", "{}", "--session", "b"]);
    quiver_in(
        &dir,
        &["call", "tool_search", r#"{"query": 5}"#, "--session", "a"],
    );
    let all = quiver_in(&dir, &["log"]);
    assert!(
        all.status.success(),
        "{}",
        String::from_utf8_lossy(&all.stderr)
    );
    assert!(stdout(&all).contains("3 call(s)"), "{}", stdout(&all));
    let errs = quiver_in(&dir, &["log", "--outcome", "err", "--json"]);
    let rows: Vec<serde_json::Value> = stdout(&errs)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["tool"], "missing_tool");
    assert_eq!(rows[0]["err_kind"], "undefined_tool");
    // A kind of its own (`input_too_large`) is a string too (it was `{"other": ...}`).
    let big = workdir("log-other-kind");
    std::fs::write(big.join("quiver.toml"), "[limits]\nmax_input_bytes = 10\n").unwrap();
    quiver_in(
        &big,
        &[
            "call",
            "tool_search",
            r#"{"query": "a query longer than ten bytes"}"#,
        ],
    );
    let row: serde_json::Value =
        serde_json::from_str(stdout(&quiver_in(&big, &["log", "--json"])).trim()).unwrap();
    assert_eq!(row["err_kind"], "input_too_large", "{row}");
    let session_a = quiver_in(&dir, &["log", "--session", "a", "--json"]);
    let kinds: Vec<String> = stdout(&session_a)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["outcome"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, vec!["hint", "ok"], "newest first");
    // The table's columns stretch to a long tool name; JSON durations have whole
    // microseconds (no `0.045000000000000005`).
    quiver_in(
        &dir,
        &[
            "call",
            "mcp__some_server__a_rather_long_tool_name",
            "{}",
            "--session",
            "c",
        ],
    );
    let table = stdout(&quiver_in(&dir, &["log"]));
    let mut lines = table.lines();
    let head = lines.next().unwrap();
    assert!(head.starts_with("AT (UTC) "), "{table}");
    let at = head.find("OUTCOME").unwrap();
    // Each row says when, in UTC, as the JSON's `at` (seconds since the epoch) does.
    let when = |row: &str| row.get(..19).unwrap_or_default().to_owned();
    let day = |ago: u64| {
        let t = std::time::SystemTime::now() - std::time::Duration::from_secs(ago);
        chrono::DateTime::<chrono::Utc>::from(t)
            .format("%Y-%m-%d ")
            .to_string()
    };
    for row in lines.clone().filter(|l| !l.ends_with("call(s)")) {
        let when = when(row);
        // The test's calls were made in the last minutes (today, or yesterday at midnight).
        assert!(
            when.starts_with(&day(0)) || when.starts_with(&day(600)),
            "{when}: {table}"
        );
        assert_eq!(when.as_bytes()[13], b':', "{table}");
    }
    for row in lines.filter(|l| !l.ends_with("call(s)")) {
        let rest = row.get(at..).unwrap_or_default();
        assert!(
            ["ok ", "hint ", "err "].iter().any(|o| rest.starts_with(o)),
            "{table}"
        );
    }
    for line in stdout(&quiver_in(&dir, &["log", "--json"])).lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        for key in ["took_ms", "queued_ms"] {
            let ms = row[key].as_f64().unwrap();
            assert_eq!(ms, (ms * 1000.0).round() / 1000.0, "{key}: {line}");
        }
    }
}

#[tokio::test]
async fn check_against_a_database_reports_breaking_changes() {
    use quiver_registry::store::{DefinitionStore, ToolDefinition, ToolType};
    let dir = workdir("against");
    let db = dir.join("old.db");
    {
        let store = quiver_store_sqlite::SqliteStore::open(&db).unwrap();
        // An older tool_search that took a `scope` argument, and a tool that is gone now.
        let old =
            quiver_contract::ToolSpec::new("tool_search", "Finds tools. Use it to find tools.")
                .with_schema(serde_json::json!({
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "scope": {"type": "string"}},
                    "required": ["query"]
                }));
        store
            .put_definition(ToolDefinition::from_spec(
                &old,
                ToolType::System,
                "system:tool_search",
            ))
            .await
            .unwrap();
        // The resource meta-tools, recorded by a `serve` that had a server with resources:
        // not registered now (no such server), which is not a removal.
        for meta in ["list_mcp_resources", "read_mcp_resource"] {
            let spec = quiver_contract::ToolSpec::new(meta, "Resources. Use it to read them.");
            store
                .put_definition(ToolDefinition::from_spec(
                    &spec,
                    ToolType::Mcp,
                    format!("mcp:resources:{meta}"),
                ))
                .await
                .unwrap();
        }
        let gone = quiver_contract::ToolSpec::new("list_everything", "Lists. Use it rarely.");
        store
            .put_definition(ToolDefinition::from_spec(
                &gone,
                ToolType::System,
                "system:list_everything",
            ))
            .await
            .unwrap();
        // Never served: a custom draft, one rejected, and a disabled tool; none is a
        // removal a caller could notice.
        for (name, status, enabled) in [
            ("draft_one", quiver_contract::Lifecycle::Draft, true),
            ("turned_down", quiver_contract::Lifecycle::Rejected, true),
            ("switched_off", quiver_contract::Lifecycle::Approved, false),
        ] {
            let spec = quiver_contract::ToolSpec::new(name, "Adds. Use it to add.");
            let mut def =
                ToolDefinition::from_spec(&spec, ToolType::Custom, format!("custom:{name}"))
                    .with_status(status);
            def.enabled = enabled;
            store.put_definition(def).await.unwrap();
        }
        store.close().await.unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let out = quiver_in(&dir, &["check", "--against", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        std::fs::read(&db).unwrap() == before,
        "the database compared with is only read"
    );
    let text = stdout(&out);
    assert!(
        text.contains("tool_search: [breaking: removed_field] field `scope` was removed"),
        "{text}"
    );
    assert!(
        text.contains("list_everything: [breaking: removed_tool]"),
        "{text}"
    );
    assert!(text.contains("2 breaking change(s)"), "{text}");
    for never_served in ["draft_one", "turned_down", "switched_off"] {
        assert!(!text.contains(never_served), "{text}");
    }
    assert!(
        text.contains("list_mcp_resources, read_mcp_resource: [note] not checked"),
        "{text}"
    );
    assert!(
        !text.contains("[breaking: removed_tool] tool `list_mcp"),
        "{text}"
    );
}

/// A server the `mcpServers` file disables is not started, and that is said (it was left
/// out without a word, as if the file had no such server).
#[test]
fn a_disabled_server_is_reported_and_not_started() {
    let dir = workdir("disabled");
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"off": {"command": "no-such-command-xyz",
            "disabled": true}}})
        .to_string(),
    )
    .unwrap();
    // Warnings shown, as by default (the other tests run at `error`).
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["--mcp-config", "mcp.json", "check"])
        .current_dir(&dir)
        .env_remove("QUIVER_LOG")
        .output()
        .expect("quiver runs");
    let (text, err) = (stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    assert!(
        err.contains(r#"mcp.json: server "off" is disabled ("disabled": true): not started"#),
        "{err}"
    );
    // Not started: its missing command is not an error.
    assert!(!text.contains("no-such-command-xyz"), "{text}");
}

#[test]
fn check_counts_refused_and_malformed_definitions_and_needs_an_existing_database() {
    let dir = workdir("refused");
    // Its one tool's schema does not compile (`"type": "strin"`).
    let server = ONE_TOOL_SERVER;
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"broken": {"command": "python3", "args": [server],
            "env": {"TYPE": "strin", "MALFORMED": "1"}}}})
        .to_string(),
    )
    .unwrap();
    let out = quiver_in(&dir, &["--mcp-config", "mcp.json", "check"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("mcp__broken__t: [not registered]"), "{text}");
    // The client itself skips a tool too malformed to become a spec: counted as well.
    assert!(
        text.contains("stringly: [not registered] malformed upstream definition"),
        "{text}"
    );
    assert!(text.contains("2 not registered"), "{text}");

    let missing = quiver_in(&dir, &["check", "--against", "no-such.db"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no-such.db: no such database"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    assert!(!dir.join("no-such.db").exists(), "nothing was created");
}

/// A server's `allow_tools` and `deny_tools` are checked against the names the server
/// lists: a catalog name in them, or a typo, is a finding (the allow list hid every tool of
/// the server, the deny let the tool through), and neither was reported.
#[test]
fn check_names_allow_and_deny_entries_the_server_does_not_list() {
    let dir = workdir("allowdeny");
    let server = ONE_TOOL_SERVER;
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nallow_tools = [\"mcp__one__t\"]\ndeny_tools = [\"tt\"]\n\n[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-long-enough-1\"\nallowed_servers = [\"onee\", \"o*\", \"z*\"]\n\n[[auth.tokens]]\nname = \"docs\"\ntoken = \"docs-secret-1\"\nallowed_tools = [\"*_mcp_resource*\"]\n"
        ),
    )
    .unwrap();
    let out = quiver_in(&dir, &["check"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("mcp.servers[one].allow_tools: [unmatched] `mcp__one__t` is not a tool server one lists; this key takes the server's own names: `t`, not `mcp__one__t`"),
        "{text}"
    );
    assert!(
        text.contains("mcp.servers[one].deny_tools: [unmatched] `tt` is not a tool server one lists; did you mean `t`?"),
        "{text}"
    );
    assert!(
        text.contains("auth.tokens[ci].allowed_servers: [unmatched] `onee` is not a configured MCP server; did you mean `one`?"),
        "{text}"
    );
    assert!(
        text.contains(
            "auth.tokens[ci].allowed_servers: [note] pattern `z*` matches no configured MCP server"
        ),
        "{text}"
    );
    assert!(!text.contains("`o*`"), "{text}");
    assert!(
        text.contains("auth.tokens[docs]: [note] allowed_tools lets it call the resource meta-tools, but without allowed_servers it reaches no server's resources"),
        "{text}"
    );
    assert!(!text.contains("auth.tokens[ci]: [note]"), "{text}");
    // A secret short enough to guess.
    assert!(
        text.contains("auth.tokens[docs]: [note] its secret is 13 character(s) long, short enough to guess; use at least 16 random ones"),
        "{text}"
    );
    // Without tool_search the token can find nothing beyond the round it is allowed.
    assert!(
        text.contains("auth.tokens[docs]: [note] allowed_tools does not allow tool_search, so its callers cannot find tools: they see only the tools it names one by one and the resident floor's tools its patterns allow (none now)"),
        "{text}"
    );
    assert!(text.contains("3 unmatched name(s)"), "{text}");
}

/// `requires_prior` holds across processes: each `quiver call --session S` is a new
/// process, and the session's earlier calls come back from the execution log.
#[test]
fn a_required_earlier_call_counts_across_cli_processes() {
    let dir = workdir("prior");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[policy.rules]]\nid = \"search-first\"\ntool = \"describe_tool\"\naction = \"deny\"\nmessage = \"search first\"\nrequires_prior = \"tool_search\"\n",
    )
    .unwrap();
    let describe = |session: &str| {
        quiver_in(
            &dir,
            &[
                "call",
                "describe_tool",
                r#"{"name": "tool_search"}"#,
                "--session",
                session,
            ],
        )
    };
    let denied = describe("s1");
    assert_eq!(denied.status.code(), Some(1), "{}", stdout(&denied));
    assert!(
        stdout(&denied).contains("search first"),
        "{}",
        stdout(&denied)
    );
    let search = quiver_in(
        &dir,
        &[
            "call",
            "tool_search",
            r#"{"query": "describe a tool"}"#,
            "--session",
            "s1",
        ],
    );
    assert_eq!(search.status.code(), Some(0), "{}", stdout(&search));
    let allowed = describe("s1");
    assert_eq!(allowed.status.code(), Some(0), "{}", stdout(&allowed));
    // Another session has not searched.
    assert_eq!(describe("s2").status.code(), Some(1));
}

/// `[skills] dirs`: the skills load into one `skill` tool that every command sees (found by
/// `tool_search`, called and logged like any tool); a broken `SKILL.md` is a `check` finding
/// with its path, and the skills that load still work.
#[test]
fn skills_directories_feed_the_skill_tool() {
    let dir = workdir("skills");
    let skill = |name: &str, description: &str| {
        let at = dir.join("skills").join(name);
        std::fs::create_dir_all(at.join("scripts")).unwrap();
        std::fs::write(
            at.join("SKILL.md"),
            format!(
                "---\nname: {name}\ndescription: {description}\n---\n# {name}\nRun scripts/run.py first.\n"
            ),
        )
        .unwrap();
        std::fs::write(at.join("scripts/run.py"), "print('hi')\n").unwrap();
    };
    skill(
        "invoice-pdf",
        "Turns an invoice spreadsheet into a PDF invoice. Use when asked to bill a customer.",
    );
    skill("meeting-notes", "Writes meeting minutes from a transcript.");
    std::fs::write(dir.join("quiver.toml"), "[skills]\ndirs = [\"skills\"]\n").unwrap();

    let check = quiver_in(&dir, &["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));

    let found = quiver_in(&dir, &["search", "bill a customer invoice"]);
    assert!(stdout(&found).contains("skill"), "{}", stdout(&found));

    let called = quiver_in(
        &dir,
        &[
            "call",
            "skill",
            r#"{"name": "invoice-pdf"}"#,
            "--session",
            "s",
        ],
    );
    assert_eq!(called.status.code(), Some(0), "{}", stdout(&called));
    let text = stdout(&called);
    assert!(text.contains("Run scripts/run.py first."), "{text}");
    assert!(text.contains("scripts/run.py"), "{text}");
    let wrong = quiver_in(&dir, &["call", "skill", r#"{"name": "invoice"}"#]);
    assert!(stdout(&wrong).contains("invoice-pdf"), "{}", stdout(&wrong));
    let log = quiver_in(&dir, &["log", "--session", "s", "--json"]);
    let row: serde_json::Value =
        serde_json::from_str(stdout(&log).lines().next().expect("a row")).unwrap();
    assert_eq!(row["tool"], "skill");
    assert_eq!(row["outcome"], "ok");

    // A broken skill is a finding naming its file; the others still load.
    std::fs::create_dir_all(dir.join("skills/broken")).unwrap();
    std::fs::write(dir.join("skills/broken/SKILL.md"), "no front matter\n").unwrap();
    let check = quiver_in(&dir, &["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    let out = stdout(&check);
    assert!(
        out.contains("broken/SKILL.md: [not registered] no front matter"),
        "{out}"
    );
    let still = quiver_in(&dir, &["call", "skill", r#"{"name": "meeting-notes"}"#]);
    assert_eq!(still.status.code(), Some(0), "{}", stdout(&still));

    // A skill longer than a result may be is a finding: it would be served cut.
    std::fs::remove_dir_all(dir.join("skills/broken")).unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        "[skills]\ndirs = [\"skills\"]\n\n[limits]\nmax_result_chars = 1000\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("skills/meeting-notes/SKILL.md"),
        format!(
            "---\nname: meeting-notes\ndescription: Writes meeting minutes.\n---\n{}\n",
            "Step.\n".repeat(300)
        ),
    )
    .unwrap();
    let check = quiver_in(&dir, &["check"]);
    let out = stdout(&check);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(
        out.contains("skill meeting-notes: [too long] its instructions are 1799 characters, more than a result carries (limits.max_result_chars = 1000)"),
        "{out}"
    );
}

/// `[skills]` tiers: the project tier is read only when trusted, a name in two tiers goes
/// to the higher and `check` reports the one shadowed (with its file); an asset is read
/// by name through the `skill` tool, and a link beside the skill is no asset.
#[test]
fn skill_tiers_stack_behind_the_trust_gate() {
    let dir = workdir("skill-tiers");
    let skill = |tier: &str, name: &str, body: &str| {
        let at = dir.join(tier).join(name);
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(
            at.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: The {tier} {name}.\n---\n{body}\n"),
        )
        .unwrap();
        at
    };
    skill("project", "review", "Review the project way.");
    let user = skill("user", "review", "Review the user way.");
    skill("user", "notes", "Take notes.");
    std::fs::write(user.join("checklist.md"), "1. Read it.\n").unwrap();
    std::os::unix::fs::symlink(dir.join("quiver.toml"), user.join("config.md")).unwrap();
    let config = |trust: bool| {
        std::fs::write(
            dir.join("quiver.toml"),
            format!(
                "[skills]\nproject_dirs = [\"project\"]\nuser_dirs = [\"user\"]\ntrust_project = {trust}\n"
            ),
        )
        .unwrap();
    };
    let review = || {
        stdout(&quiver_in(
            &dir,
            &["call", "skill", r#"{"name": "review"}"#],
        ))
    };

    config(false);
    let text = review();
    assert!(text.contains("Review the user way."), "{text}");
    assert!(
        text.contains("checklist.md") && !text.contains("config.md"),
        "{text}"
    );
    let check = quiver_in(&dir, &["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    let asset = quiver_in(
        &dir,
        &[
            "call",
            "skill",
            r#"{"name": "review", "asset": "checklist.md"}"#,
        ],
    );
    assert!(stdout(&asset).contains("1. Read it."), "{}", stdout(&asset));
    let link = quiver_in(
        &dir,
        &[
            "call",
            "skill",
            r#"{"name": "review", "asset": "config.md"}"#,
        ],
    );
    assert!(
        stdout(&link).contains("has no asset \"config.md\"; its assets are: checklist.md"),
        "{}",
        stdout(&link)
    );

    config(true);
    assert!(review().contains("Review the project way."), "{}", review());
    let check = quiver_in(&dir, &["check"]);
    let out = stdout(&check);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(
        out.contains("user/review/SKILL.md: [not registered] skill `review` (user tier) is shadowed by the project tier's skill of that name, which is served"),
        "{out}"
    );
}

/// The host sets the catalog's family order: an upstream tool named `skill` (a server
/// configured with an empty prefix) that registers after the skills takes the name, since
/// MCP comes before skills; the skills' tool is back when the upstream lets go.
#[tokio::test]
async fn an_upstream_that_connects_late_comes_before_the_skills() {
    struct Upstream(quiver_contract::ToolSpec);
    #[async_trait::async_trait]
    impl quiver_contract::Tool for Upstream {
        fn spec(&self) -> &quiver_contract::ToolSpec {
            &self.0
        }
        async fn call(
            &self,
            _: serde_json::Value,
            _: &quiver_contract::CallContext,
        ) -> quiver_contract::ToolResult {
            Ok(quiver_contract::Envelope::text("upstream"))
        }
    }
    let dir = workdir("skill-order");
    let at = dir.join("skills/notes");
    std::fs::create_dir_all(&at).unwrap();
    std::fs::write(
        at.join("SKILL.md"),
        "---\nname: notes\ndescription: Takes notes.\n---\nWrite them down.\n",
    )
    .unwrap();
    let toml = format!(
        "[store]\npath = \"{}\"\n[skills]\ndirs = [\"{}\"]\n",
        dir.join("q.db").display(),
        dir.join("skills").display()
    );
    let config = quiver_host::Config::parse(&toml, "test.toml", &|_| None).unwrap();
    let app = quiver_host::App::build(&config, &[]).await.unwrap();
    assert_eq!(&*app.catalog.lookup("skill").unwrap().family, "skills");
    let upstream: std::sync::Arc<dyn quiver_contract::Tool> = std::sync::Arc::new(Upstream(
        quiver_contract::ToolSpec::new("skill", "An upstream's own skill tool."),
    ));
    let report = app.catalog.register_all("mcp:skillz", vec![upstream]);
    assert_eq!(report.registered, ["skill"]);
    assert_eq!(&*app.catalog.lookup("skill").unwrap().family, "mcp:skillz");
    let shadowed = app.catalog.shadowed();
    assert_eq!(shadowed.len(), 1);
    assert_eq!(shadowed[0].family, "skills");
    app.catalog.remove_family("mcp:skillz");
    assert_eq!(&*app.catalog.lookup("skill").unwrap().family, "skills");
    app.shutdown().await.unwrap();
}

/// The resident floor comes from the execution log's usage and is stored: `quiver floor
/// --rederive` ranks the calls of earlier processes, later processes read it back, and
/// `quiver tools` lists it.
#[test]
fn the_floor_is_ranked_from_the_log_and_stored() {
    let dir = workdir("floor");
    let at = dir.join("skills/invoice-pdf");
    std::fs::create_dir_all(&at).unwrap();
    std::fs::write(
        at.join("SKILL.md"),
        "---\nname: invoice-pdf\ndescription: Turns an invoice spreadsheet into a PDF. Use when asked to bill a customer.\n---\nSteps.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        "[skills]\ndirs = [\"skills\"]\n\n[surface]\nanchors = [\"not_a_tool\"]\nfallback_floor = [\"tool_search\"]\n",
    )
    .unwrap();
    let before = stdout(&quiver_in(&dir, &["floor"]));
    assert!(before.contains("the static fallback"), "{before}");
    assert!(
        before.contains("not_a_tool") && before.contains("anchor  (not registered now"),
        "{before}"
    );
    for _ in 0..2 {
        let called = quiver_in(&dir, &["call", "skill", r#"{"name": "invoice-pdf"}"#]);
        assert_eq!(called.status.code(), Some(0), "{}", stdout(&called));
    }
    let derived = quiver_in(&dir, &["floor", "--rederive"]);
    assert_eq!(derived.status.code(), Some(0));
    let text = stdout(&derived);
    assert!(text.contains("derived from usage"), "{text}");
    assert!(
        text.contains("skill") && text.contains("score 6.0"),
        "{text}"
    );
    // Another process reads the stored ranking: a third call changes the log, not the
    // floor (until it is derived again). A call of a name no tool can have is not ranked.
    let third = quiver_in(&dir, &["call", "skill", r#"{"name": "invoice-pdf"}"#]);
    assert_eq!(third.status.code(), Some(0), "{}", stdout(&third));
    quiver_in(&dir, &["call", "no such tool!", "{}"]);
    let again = stdout(&quiver_in(&dir, &["floor"]));
    assert!(again.contains("score 6.0"), "{again}");
    let rederived = stdout(&quiver_in(&dir, &["floor", "--rederive"]));
    assert!(rederived.contains("score 9.0"), "{rederived}");
    let db = rusqlite::Connection::open(dir.join("quiver.db")).unwrap();
    let stored = |db: &rusqlite::Connection| -> String {
        db.query_row(
            "SELECT value FROM surface_state WHERE key = 'tool_surface_tier0_v1'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let value = stored(&db);
    assert!(!value.contains("no such tool"), "{value}");
    // A stored value that is not JSON is derived again: in memory by every command, and
    // stored again by `serve` or `floor --rederive` (the other commands do not write).
    db.execute(
        "UPDATE surface_state SET value = '{\"version\":1,' WHERE key = 'tool_surface_tier0_v1'",
        [],
    )
    .unwrap();
    let repaired = stdout(&quiver_in(&dir, &["floor"]));
    assert!(repaired.contains("score 9.0"), "{repaired}");
    assert_eq!(stored(&db), "{\"version\":1,");
    let rederived = quiver_in(&dir, &["floor", "--rederive"]);
    assert_eq!(rederived.status.code(), Some(0));
    assert!(stored(&db).contains("\"ranked\""), "{}", stored(&db));
    let tools = stdout(&quiver_in(&dir, &["tools", "--format", "json"]));
    let names: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&tools)
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["tool_search", "describe_tool", "skill"], "{tools}");
}

/// `[store] retention_days` deletes old execution-log rows only in the commands that write
/// the store: reading commands (`log`, `tools`, `check`, `status`) leave them, so a look
/// at the log never empties it.
#[tokio::test]
async fn retention_applies_only_in_commands_that_write() {
    use quiver_registry::{CallRecord, ToolCallRecorder};
    let dir = workdir("retention");
    {
        let store = quiver_store_sqlite::SqliteStore::open(dir.join("quiver.db")).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(10 * 86_400);
        store
            .record(
                CallRecord::new(
                    "tool_search",
                    "old-call",
                    serde_json::json!({"query": "old"}),
                    quiver_contract::Envelope::text("old result"),
                )
                .with_at(old),
            )
            .await;
        store.close().await.unwrap();
    }
    std::fs::write(dir.join("quiver.toml"), "[store]\nretention_days = 1\n").unwrap();
    let rows = |dir: &std::path::Path| {
        let out = quiver_in(dir, &["log", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["call_id"].clone())
            .collect::<Vec<_>>()
    };
    for reading in [&["tools"][..], &["check"], &["status"], &["log"]] {
        quiver_in(&dir, reading);
        assert_eq!(rows(&dir), ["old-call"], "after {reading:?}");
    }
    let called = quiver_in(&dir, &["call", "tool_search", r#"{"query": "time"}"#]);
    assert_eq!(called.status.code(), Some(0), "{}", stdout(&called));
    let after = rows(&dir);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0], "old-call", "the old row is past retention");
    // `log` reads without writing: a store it may only read is shown, and a path with no
    // store is an error that creates nothing there.
    // (The writer, which `log` no longer opens, announces itself in `quiver.db-lock`.)
    let lock = dir.join("quiver.db-lock");
    let _ = std::fs::remove_file(&lock);
    let before = std::fs::read(dir.join("quiver.db")).unwrap();
    assert_eq!(rows(&dir).len(), 1);
    assert!(!lock.exists(), "log opened the store for writing");
    assert_eq!(std::fs::read(dir.join("quiver.db")).unwrap(), before);
    let empty = workdir("log-nowhere");
    std::fs::write(
        empty.join("quiver.toml"),
        "[store]\npath = \"./prod/quiver.bd\"\n",
    )
    .unwrap();
    let nowhere = quiver_in(&empty, &["log"]);
    assert_eq!(nowhere.status.code(), Some(2));
    let err = String::from_utf8_lossy(&nowhere.stderr);
    assert!(
        err.contains("there is no store at ./prod/quiver.bd"),
        "{err}"
    );
    assert!(!empty.join("prod").exists(), "nothing is created");
    // 0 would empty the log on every start: refused, with the way to keep everything.
    std::fs::write(dir.join("quiver.toml"), "[store]\nretention_days = 0\n").unwrap();
    let zero = quiver_in(&dir, &["log"]);
    assert_eq!(zero.status.code(), Some(2));
    let err = String::from_utf8_lossy(&zero.stderr);
    assert!(
        err.contains("quiver.toml: [store] retention_days = 0") && err.contains("remove the key"),
        "{err}"
    );
}

/// A required server whose command cannot start fails a command at once, saying why:
/// waiting out the connect timeout (30 s) would not change a missing executable.
#[test]
fn a_required_server_that_cannot_start_is_not_waited_for() {
    let dir = workdir("ghost-required");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"ghost\"\ncommand = \"/nonexistent/mcp-ghost\"\nrequired = true\n",
    )
    .unwrap();
    let out = quiver_in(&dir, &["tools"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("its command cannot start") && err.contains("/nonexistent/mcp-ghost"),
        "{err}"
    );
    assert!(!err.contains("after 30 s"), "it waited: {err}");
}

/// The help a user reads first says what Quiver is; `bench-search --help` describes the
/// files itself; `search --help` says that it pages tools in and is logged.
#[test]
fn help_texts_describe_the_commands() {
    let help = stdout(&quiver(&["--help"]));
    assert!(
        help.starts_with("Quiver: one catalog, one dispatch pipeline"),
        "{help}"
    );
    let bench = stdout(&quiver(&["bench-search", "--help"]));
    assert!(
        bench.contains("one inner list per tool the query needs") && !bench.contains("README"),
        "{bench}"
    );
    let search = stdout(&quiver(&["search", "--help"]));
    assert!(
        search.contains("paged into the session's working set")
            && search.contains("recorded in the execution log")
            && search.contains("--session"),
        "{search}"
    );
}

/// `serve --listen` takes a host name (resolved) as well as an IP address; a name that
/// does not resolve, or no port, is an error that says what to give.
#[test]
fn serve_listens_on_a_host_name() {
    use std::io::BufRead;
    let dir = workdir("listen-name");
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["serve", "--listen", "localhost:0"])
        .current_dir(&dir)
        .env("QUIVER_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let url = rx.recv_timeout(std::time::Duration::from_secs(60));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let url = url.expect("quiver serve prints its URL");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(status.success(), "{status}");
    let bad = quiver(&["serve", "--listen", "localhost"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("`localhost` has no port: give HOST:PORT"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// `status` tells a server that is down and retried from one that failed for good: the
/// next attempt, and why the last one failed, in plain words (no Rust type names).
#[test]
fn status_shows_retrying_servers_with_the_next_attempt_and_a_plain_reason() {
    let dir = workdir("status");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"web\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n\n[[mcp.servers]]\nname = \"gone\"\ncommand = \"/nonexistent/quiver-test-server\"\n"
        ),
    )
    .unwrap();
    let out = quiver_in(&dir, &["status"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    for name in ["web", "gone"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} line in {text}"));
        assert!(line.contains(" down "), "{line}");
        assert!(
            line.contains("`quiver serve` keeps retrying it in the background"),
            "{line}"
        );
        assert!(!line.contains("next attempt in"), "{line}");
        assert!(!line.contains("::"), "{line}");
    }
    assert!(text.contains("Connection refused"), "{text}");
    assert!(
        text.contains("cannot start `/nonexistent/quiver-test-server`"),
        "{text}"
    );
    // rmcp's own log line for the refused connection (type names) is not on stderr.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("rmcp::"), "{err}");
}

/// A per-session server is configured but runs only inside `quiver serve`'s sessions:
/// `status` says so rather than "no upstream MCP servers configured", and `check` takes it.
#[test]
fn status_names_a_per_session_server() {
    let dir = workdir("per-session");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"fs\"\ncommand = \"/nonexistent/quiver-test-server\"\nscope = \"session\"\n",
    )
    .unwrap();
    let out = quiver_in(&dir, &["status"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("no upstream MCP servers configured"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("fs "))
        .unwrap_or_else(|| panic!("no fs line in {text}"));
    assert!(
        line.contains("per session") && line.contains("one process per MCP session"),
        "{line}"
    );
    // No session has started it, and `check` looks for its command all the same.
    let out = quiver_in(&dir, &["check"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("mcp server fs: [cannot start]"),
        "{}",
        stdout(&out)
    );
}

/// A `required` server that is down stops `serve` and the working commands, but `status`
/// and `check`, which are how an operator finds out why, still show what they know (the
/// table, the findings) and exit 1 rather than 2 (a configuration error). Each waits out the
/// 30 s start-up wait.
#[test]
fn status_and_check_still_report_when_a_required_server_is_down() {
    let dir = workdir("required-down");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"must\"\ncommand = \"/nonexistent/quiver-required\"\nrequired = true\n",
    )
    .unwrap();
    // Side by side: each waits the 30 s.
    let (status, check, call) = std::thread::scope(|s| {
        let check = s.spawn(|| quiver_in(&dir, &["check"]));
        let call = s.spawn(|| quiver_in(&dir, &["call", "describe_tool", r#"{"name": "x"}"#]));
        (
            quiver_in(&dir, &["status"]),
            check.join().unwrap(),
            call.join().unwrap(),
        )
    });
    // A call, whatever server its tool is on, cannot be made without a required server:
    // exit 2, as its help says.
    let err = String::from_utf8_lossy(&call.stderr);
    assert_eq!(call.status.code(), Some(2), "{err}");
    assert!(err.contains("a required MCP server is not ready"), "{err}");
    let help = stdout(&quiver(&["call", "--help"]));
    assert!(
        help.contains("2 when the call cannot be made: the JSON does not parse, the configuration is invalid, or a `required` MCP server is not ready"),
        "{help}"
    );
    let text = stdout(&status);
    let err = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(1), "{text}\n{err}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("must") && l.contains(" down ")),
        "{text}"
    );
    assert!(err.contains("a required MCP server is not ready"), "{err}");
    let text = stdout(&check);
    assert_eq!(check.status.code(), Some(1), "{text}");
    assert!(text.contains("config ok"), "{text}");
}

/// A call to a tool of a configured server that is not connected is `not_available` naming
/// the server, not an unknown tool with look-alikes from another server (which may do
/// something else).
#[test]
fn a_tool_of_a_server_that_is_down_is_not_available() {
    let dir = workdir("server-down-call");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"gone\"\ncommand = \"/nonexistent/quiver-gone\"\n",
    )
    .unwrap();
    let out = quiver_in(&dir, &["call", "mcp__gone__describe_tool", "{}"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("(not_available)")
            && text.contains(
                "`mcp__gone__describe_tool` is not available: MCP server \"gone\" cannot be started (its command is missing or cannot run); an operator must install it or fix its configuration"
            ),
        "{text}"
    );
    assert!(!text.contains("Did you mean"), "{text}");
    // Under another prefix the name is unknown as before, with its look-alike.
    let out = quiver_in(&dir, &["call", "describe_tol", "{}"]);
    assert!(
        stdout(&out).contains("Did you mean `describe_tool`"),
        "{}",
        stdout(&out)
    );
}

/// A definition too large for what a round has left after the system tools is never
/// shown, so `check` names it (here the `skill` tool, which lists a long skill description,
/// under a small budget); with 100 bytes more it fits, and `check` is clean. (The boundary
/// is the surface's own: at these two budgets `quiver search` reports it `over_budget`,
/// then loads it.)
#[test]
fn check_names_a_definition_too_large_to_be_shown() {
    let dir = workdir("too-large");
    let at = dir.join("skills/long-story");
    std::fs::create_dir_all(&at).unwrap();
    let description = format!(
        "Use when a long story is wanted. {}",
        "Very long. ".repeat(80)
    );
    std::fs::write(
        at.join("SKILL.md"),
        format!("---\nname: long-story\ndescription: {description}\n---\n# Long story\nTell it.\n"),
    )
    .unwrap();
    let budget = |bytes: usize| {
        std::fs::write(
            dir.join("quiver.toml"),
            format!("[skills]\ndirs = [\"skills\"]\n\n[surface.round]\nmax_definitions = 40\nmax_bytes = {bytes}\n"),
        )
        .unwrap();
        quiver_in(&dir, &["check"])
    };
    let check = budget(2700);
    let text = stdout(&check);
    assert_eq!(check.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("skill: [too large]"))
        .unwrap_or_else(|| panic!("no [too large] line for the skill tool: {text}"));
    assert!(
        line.contains("more than what a round's tool budget (`surface.round.max_bytes`) has left after the system tools (")
            && line.contains("so it is never shown"),
        "{line}"
    );
    let search = quiver_in(&dir, &["search", "long story"]);
    assert!(
        stdout(&search).contains("\"reason\": \"over_budget\""),
        "{}",
        stdout(&search)
    );
    let check = budget(2800);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    let search = stdout(&quiver_in(&dir, &["search", "long story"]));
    // The JSON body, then the notes (a hit the round could not list is explained).
    let found: serde_json::Value =
        serde_json::Deserializer::from_str(&search[search.find('{').expect("a JSON body")..])
            .into_iter()
            .next()
            .expect("a JSON body")
            .unwrap();
    assert_eq!(found["exposed"][0], "skill", "{search}");
    assert!(
        !found["failed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "skill"),
        "{search}"
    );
}

/// `tools`, `status`, `check` and `floor` only read the store: a `[store] path` with no
/// store behind it (mistyped, or not yet created) gets none, and an existing store keeps its
/// bytes (no migration, no clean-shutdown marker rewritten, no working set written back, no
/// writer announced) while its stored working sets are still shown.
#[test]
fn reading_commands_neither_create_nor_change_the_store() {
    let skill = |dir: &std::path::Path| {
        let at = dir.join("skills/invoice-pdf");
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(
            at.join("SKILL.md"),
            "---\nname: invoice-pdf\ndescription: Turns an invoice spreadsheet into a PDF. Use when asked to bill a customer.\n---\nSteps.\n",
        )
        .unwrap();
    };
    let readers: [&[&str]; 6] = [
        &["tools"],
        &["tools", "--session", "s1", "--format", "json"],
        &["status"],
        &["check"],
        &["floor"],
        &["tools", "--mode", "plan"],
    ];
    let nowhere = workdir("read-nowhere");
    skill(&nowhere);
    std::fs::write(
        nowhere.join("quiver.toml"),
        "[store]\npath = \"./prod/quiver.bd\"\n\n[skills]\ndirs = [\"skills\"]\n",
    )
    .unwrap();
    // They run without the store; `check` and `status`, which diagnose, fail (exit 1) on
    // a store `serve` could not create: its directory `prod` does not exist.
    for args in readers {
        let out = quiver_in(&nowhere, args);
        let diagnoses = matches!(args[0], "check" | "status");
        assert_eq!(
            out.status.code(),
            Some(if diagnoses { 1 } else { 0 }),
            "{args:?}: {}{}",
            stdout(&out),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = stdout(&quiver_in(&nowhere, &["status"]));
    assert!(
        status
            .contains("store: ./prod/quiver.bd (cannot be created: its directory does not exist)"),
        "{status}"
    );
    assert!(
        !nowhere.join("prod").exists(),
        "a reading command created the store"
    );

    let dir = workdir("read-only");
    skill(&dir);
    std::fs::write(
        dir.join("quiver.toml"),
        "[skills]\ndirs = [\"skills\"]\n\n[surface]\nfallback_floor = [\"tool_search\"]\n",
    )
    .unwrap();
    let found = quiver_in(&dir, &["search", "bill a customer", "--session", "s1"]);
    assert_eq!(found.status.code(), Some(0), "{}", stdout(&found));
    let lock = dir.join("quiver.db-lock");
    std::fs::remove_file(&lock).unwrap();
    let db = dir.join("quiver.db");
    let marker = || -> String {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT value FROM quiver_meta WHERE key = 'clean_shutdown'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    let before = (std::fs::read(&db).unwrap(), marker());
    let names = |args: &[&str]| -> Vec<String> {
        serde_json::from_str::<Vec<serde_json::Value>>(&stdout(&quiver_in(&dir, args)))
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&["tools", "--session", "s1", "--format", "json"]),
        ["tool_search", "describe_tool", "skill"],
        "the stored working set of s1 is read"
    );
    assert_eq!(
        names(&["tools", "--format", "json"]),
        ["tool_search", "describe_tool"]
    );
    for args in readers {
        let out = quiver_in(&dir, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stdout(&out));
    }
    assert!(
        !lock.exists(),
        "a reading command opened the store for writing"
    );
    assert_eq!(
        (std::fs::read(&db).unwrap(), marker()),
        before,
        "the store changed"
    );
    // A command that writes still creates and announces it.
    let called = quiver_in(&dir, &["call", "tool_search", r#"{"query": "invoice"}"#]);
    assert_eq!(called.status.code(), Some(0), "{}", stdout(&called));
    assert_ne!(marker(), before.1);
}

/// What an upstream writes cannot drive the operator's terminal: `call` prints a result's
/// escape sequences (clear the screen, retitle the window, write the clipboard) and
/// bidirectional overrides escaped, and keeps its newlines; a description's control
/// characters never reach a client at all (taken out when the tool is registered), so
/// `tools` and its JSON show the text without them.
#[test]
fn call_and_tools_print_an_upstreams_control_characters_escaped() {
    let dir = workdir("control-chars");
    let server = ONE_TOOL_SERVER;
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nanchors = [\"mcp__one__t\"]\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ DESCRIPTION = \"Takes \\u001b]0;PWNED\\u0007 one \\u001b[2J field.\" }}\n"
        ),
    )
    .unwrap();
    let raw = |text: &str| {
        text.chars()
            .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}')
    };
    let out = quiver_in(
        &dir,
        &[
            "call",
            "mcp__one__t",
            r#"{"x": "fail \u001b]52;c;SGVsbG8=\u0007 \u001b[31mred\u202e\nnext line"}"#,
        ],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!raw(&text), "{text:?}");
    assert!(
        text.contains(r"fail \u001b]52;c;SGVsbG8=\u0007 \u001b[31mred\u202e")
            && text.contains("\nnext line"),
        "{text}"
    );
    let out = quiver_in(&dir, &["tools"]);
    let text = stdout(&out);
    assert!(!raw(&text), "{text:?}");
    assert!(text.contains("Takes ]0;PWNED one [2J field."), "{text}");
    let out = quiver_in(&dir, &["tools", "--format", "json"]);
    let text = stdout(&out);
    assert!(!raw(&text), "{text:?}");
    let specs: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        specs
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["description"] == "[MCP: one] Takes ]0;PWNED one [2J field."),
        "{text}"
    );
}

/// A `[store] path` that names a directory is said to be one, by every command, before
/// SQLite is asked (it answered "unable to open" or "disk I/O error").
#[test]
fn a_store_path_that_is_a_directory_is_named_so() {
    let dir = workdir("store-dir");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("quiver.toml"), "[store]\npath = \"data\"\n").unwrap();
    for args in [
        &["call", "tool_search", r#"{"query": "csv"}"#][..],
        &["log"],
        &["tools"],
        &["status"],
    ] {
        let out = quiver_in(&dir, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(
                "[store] path data is a directory: name the database file, e.g. data/quiver.db"
            ),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.join("data")).unwrap().count(), 0);
}

/// A `[store] path` in a directory that does not exist stops `call` (exit 2) and fails
/// `check` and `status` (exit 1), each saying so: not "config ok", nor that `serve` would
/// create the file, which it could not.
#[test]
fn a_store_path_in_a_missing_directory_is_named_so() {
    let dir = workdir("store-nodir");
    std::fs::write(dir.join("quiver.toml"), "[store]\npath = \"nodir/q.db\"\n").unwrap();
    for (args, code) in [
        (&["check"][..], 1),
        (&["status"], 1),
        (&["call", "tool_search", r#"{"query": "csv"}"#], 2),
    ] {
        let out = quiver_in(&dir, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.contains(
                "[store] path nodir/q.db: its directory nodir does not exist, so the store cannot be created"
            ),
            "{args:?}: {err}"
        );
    }
    assert!(!dir.join("nodir").exists());
}

/// `QUIVER_LOG` that sets no level for everything (`quiver_host=debug`, or a typo read as a
/// target) keeps the warnings; one that is not a filter at all is said to be so; a level
/// of `error` does switch them off. Each skipped tool is warned of once.
#[test]
fn quiver_log_filters_keep_the_warnings_unless_they_ask_otherwise() {
    let dir = workdir("quiver-log");
    let server = ONE_TOOL_SERVER;
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ TYPE = \"strin\" }}\n"
        ),
    )
    .unwrap();
    let stderr = |filter: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .arg("tools")
            .current_dir(&dir)
            .env("QUIVER_LOG", filter)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let skipped = "mcp:one: skipped invalid tool(s) (1): mcp__one__t";
    for filter in ["", "degub", "quiver_host=debug", "nonsense==="] {
        let err = stderr(filter);
        assert_eq!(err.matches(skipped).count(), 1, "{filter:?}: {err}");
        assert_eq!(
            err.contains("is not a log filter"),
            filter == "nonsense===",
            "{filter:?}: {err}"
        );
    }
    assert!(!stderr("error").contains(skipped));
}

/// A tool a policy rule denies to every caller is never offered: not on the tool list
/// (even as an anchor), not found by `search`, not described; a call still gets the
/// rule's message. A rule with a condition (here a principal) leaves it offered.
#[test]
fn a_tool_denied_to_everyone_is_not_offered_but_its_call_is_explained() {
    let server = ONE_TOOL_SERVER;
    let write = |dir: &std::path::Path, condition: &str| {
        std::fs::write(
            dir.join("quiver.toml"),
            format!(
                "[surface]\nanchors = [\"mcp__one__t\"]\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ DESCRIPTION = \"Takes one field. Use it in tests.\" }}\n\n[[policy.rules]]\nid = \"no-one\"\ntool = \"mcp__one__*\"\naction = \"deny\"\nmessage = \"the one server is switched off today\"\n{condition}\n[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-1\"\n"
            ),
        )
        .unwrap();
    };
    let dir = workdir("denied-unoffered");
    write(&dir, "");
    let tools = stdout(&quiver_in(&dir, &["tools"]));
    assert!(!tools.contains("mcp__one__t"), "{tools}");
    let found = stdout(&quiver_in(&dir, &["search", "takes one field"]));
    assert!(!found.contains("mcp__one__t"), "{found}");
    let described = stdout(&quiver_in(
        &dir,
        &["call", "describe_tool", r#"{"name": "mcp__one__t"}"#],
    ));
    assert!(!described.contains("Takes one field"), "{described}");
    let out = quiver_in(&dir, &["call", "mcp__one__t", r#"{"x": "a"}"#]);
    let called = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{called}");
    assert!(
        called.contains("policy_denied") && called.contains("the one server is switched off today"),
        "{called}"
    );
    // Arguments that do not fit get the same refusal: a schema hint showed the definition
    // `describe_tool` hides, and invited a retry the policy refuses.
    // So do arguments that are not an object at all (they were told "must be a JSON
    // object" first).
    for args in ["{}", r#"{"x": 5}"#, "[]", "5"] {
        let out = quiver_in(&dir, &["call", "mcp__one__t", args]);
        let called = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{args}: {called}");
        assert!(
            called.contains("policy_denied") && !called.contains("Expected"),
            "{args}: {called}"
        );
    }
    let shape = stdout(&quiver_in(&dir, &["call", "mcp__one__tt", "[]"]));
    assert!(
        shape.contains("undefined_tool") && !shape.contains("JSON object"),
        "{shape}"
    );
    let typo = stdout(&quiver_in(&dir, &["call", "mcp__one__tt", "{}"]));
    assert!(
        typo.contains("undefined_tool") && !typo.contains("`mcp__one__t`"),
        "no look-alike every call of which is refused: {typo}"
    );

    let dir = workdir("denied-conditional");
    write(&dir, "principal = \"ci\"\n");
    let tools = stdout(&quiver_in(&dir, &["tools"]));
    assert!(tools.contains("mcp__one__t"), "{tools}");
    let found = stdout(&quiver_in(&dir, &["search", "takes one field"]));
    assert!(found.contains("mcp__one__t"), "{found}");
}

/// `quiver call` is a call as `quiver serve` makes it: one round of its session (a tool
/// `search` paged in leaves once idle past `idle_rounds`), refused when its mode does not
/// offer the tool, and, with `--token NAME`, made as that token (its mode, and the deny
/// rules for it); `tools` and `search` show that token's view. Before, a call counted no
/// round, ignored the mode, and the CLI had no way to act as a token.
#[test]
fn a_cli_call_is_a_round_in_its_mode_and_can_act_as_a_token() {
    let server = ONE_TOOL_SERVER;
    let dir = workdir("cli-rounds");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nidle_rounds = 1\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ DESCRIPTION = \"Takes one field. Use it in tests.\" }}\n\n[[policy.rules]]\nid = \"not-ci\"\ntool = \"mcp__one__*\"\naction = \"deny\"\nprincipal = \"ci\"\nmessage = \"ci may not use the one server\"\n\n[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-1\"\n\n[[auth.tokens]]\nname = \"planner\"\ntoken = \"plan-secret-1\"\nmode = \"plan\"\n\n[[auth.tokens]]\nname = \"narrow\"\ntoken = \"narrow-secret-1\"\nallowed_tools = [\"describe_tool\"]\n"
        ),
    )
    .unwrap();
    let session = ["--session", "s"];
    let found = stdout(&quiver_in(
        &dir,
        &[&["search", "takes one field"][..], &session].concat(),
    ));
    assert!(found.contains("mcp__one__t"), "{found}");
    let tools = stdout(&quiver_in(&dir, &[&["tools"][..], &session].concat()));
    assert!(tools.contains("mcp__one__t"), "paged in: {tools}");
    // Rounds of other tools: idle past one round, it leaves the working set.
    for _ in 0..3 {
        let out = quiver_in(
            &dir,
            &[
                &["call", "describe_tool", r#"{"name": "tool_search"}"#][..],
                &session,
            ]
            .concat(),
        );
        assert!(out.status.success(), "{}", stdout(&out));
    }
    let tools = stdout(&quiver_in(&dir, &[&["tools"][..], &session].concat()));
    assert!(
        !tools.contains("mcp__one__t"),
        "evicted after idle rounds: {tools}"
    );

    // The mode's lists hold: a tool that can change things is refused in plan mode (the
    // `--mode` given, or the token's), and the refusal is recorded.
    for how in [&["--mode", "plan"][..], &["--token", "planner"]] {
        let out = quiver_in(
            &dir,
            &[&["call", "mcp__one__t", r#"{"x": "a"}"#][..], how].concat(),
        );
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{how:?}: {text}");
        assert!(
            text.contains("forbidden")
                && text.contains("`mcp__one__t` is not available in plan mode"),
            "{how:?}: {text}"
        );
    }
    let log = stdout(&quiver_in(
        &dir,
        &["log", "--json", "--tool", "mcp__one__t"],
    ));
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(r#""err_kind":"forbidden""#))
            .count(),
        2,
        "{log}"
    );
    let ok = quiver_in(&dir, &["call", "mcp__one__t", r#"{"x": "a"}"#]);
    assert!(ok.status.success(), "{}", stdout(&ok));

    // A look-alike of a tool the mode refuses is not suggested in that mode.
    let typo = stdout(&quiver_in(
        &dir,
        &["call", "mcp__one__tt", "{}", "--mode", "plan"],
    ));
    assert!(
        typo.contains("undefined_tool") && !typo.contains("`mcp__one__t`"),
        "{typo}"
    );
    let typo = stdout(&quiver_in(&dir, &["call", "mcp__one__tt", "{}"]));
    assert!(typo.contains("Did you mean `mcp__one__t`"), "{typo}");
    // The same with arguments that do not parse (a usage error, exit 2): they went to the
    // dispatcher alone, whose look-alikes know no mode. Each call has one row, holding the
    // text as sent.
    let rows = |dir: &std::path::Path| {
        stdout(&quiver_in(
            dir,
            &["log", "--json", "--tool", "mcp__one__tt"],
        ))
        .lines()
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let before = rows(&dir).len();
    let out = quiver_in(&dir, &["call", "mcp__one__tt", "{x", "--mode", "plan"]);
    let typo = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{typo}");
    assert!(
        typo.contains("undefined_tool") && !typo.contains("`mcp__one__t`"),
        "{typo}"
    );
    let typo = stdout(&quiver_in(&dir, &["call", "mcp__one__tt", "{x"]));
    assert!(typo.contains("Did you mean `mcp__one__t`"), "{typo}");
    // A tool plan mode refuses is refused as such, whatever the arguments (they were
    // explained first); stderr says what is wrong with the JSON itself.
    let out = quiver_in(&dir, &["call", "mcp__one__t", "{x", "--mode", "plan"]);
    let text = stdout(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("forbidden") && text.contains("`mcp__one__t` is not available in plan mode"),
        "{text}"
    );
    assert!(
        err.contains(
            "the JSON argument is not valid JSON (key must be a string at line 1 column 2)"
        ),
        "{err}"
    );
    let after = rows(&dir);
    assert_eq!(after.len(), before + 2, "{after:?}");
    assert!(
        after
            .iter()
            .filter(|r| r.contains(r#""input":"{x""#))
            .count()
            == 2,
        "{after:?}"
    );

    // As the token `ci`, which a deny rule refuses the one server: not listed, not found,
    // and its call gets the rule's message; without the token, all three work.
    let succeeds = |args: &[&str]| {
        let out = quiver_in(&dir, args);
        let text = stdout(&out);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            text.contains("✓ ok.") || text.contains(" tool(s)"),
            "{args:?}: {text}"
        );
        text
    };
    let ci = ["--token", "ci", "--session", "view"];
    let found = succeeds(&[&["search", "takes one field"][..], &ci].concat());
    assert!(!found.contains("mcp__one__t"), "{found}");
    let tools = succeeds(&[&["tools"][..], &ci].concat());
    assert!(
        tools.contains("tool_search") && !tools.contains("mcp__one__t"),
        "{tools}"
    );
    let out = quiver_in(
        &dir,
        &[&["call", "mcp__one__t", r#"{"x": "a"}"#][..], &ci].concat(),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("ci may not use the one server"), "{text}");
    // The token's calls are in the working set `serve` gives its conversation `view`.
    let log = stdout(&quiver_in(
        &dir,
        &["log", "--json", "--tool", "mcp__one__t", "--limit", "1"],
    ));
    assert!(
        log.contains(r#""session":"conv:ci:view""#) && log.contains(r#""principal":"ci""#),
        "{log}"
    );
    let plain = ["--session", "view"];
    assert!(
        succeeds(&[&["search", "takes one field"][..], &plain].concat()).contains("mcp__one__t")
    );
    assert!(succeeds(&[&["tools"][..], &plain].concat()).contains("mcp__one__t"));

    // A token's own mode is the one it gets, as in `serve`: another `--mode` is refused.
    let out = quiver_in(
        &dir,
        &[
            "call",
            "mcp__one__t",
            r#"{"x": "a"}"#,
            "--token",
            "planner",
            "--mode",
            "chat",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the token `planner` has mode plan, which `quiver serve` gives every request it makes: --mode chat cannot change it"),
        "{err}"
    );

    // A token that is not configured is a usage error naming the ones that are.
    let out = quiver_in(&dir, &["tools", "--token", "nobody"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "no inbound token is named `nobody`; the configured ones are: ci, planner, narrow"
        ),
        "{err}"
    );
    // A token that may not call tool_search cannot search, and is told so in those words.
    let out = quiver_in(&dir, &["search", "takes one field", "--token", "narrow"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "the token `narrow` may not call tool_search (its `allowed_tools` leave it out)"
        ),
        "{err}"
    );
}

/// Output into a pipe that is gone (`quiver log | head -1`) is dropped: the command ends
/// as it would have, without a panic (it exited 101 with "failed printing to stdout").
#[test]
fn output_into_a_closed_pipe_is_no_panic() {
    let dir = workdir("closed-pipe");
    quiver_in(
        &dir,
        &["call", "tool_search", r#"{"query": "describe tools"}"#],
    );
    for args in [&["log"][..], &["log", "--json"], &["tools"], &["status"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(args)
            .current_dir(&dir)
            .env("QUIVER_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// A stdio server Quiver closes (here at the end of a `quiver call`) is stopped as the MCP
/// lifecycle asks: its stdin is closed and it may exit by itself (it sees the end of its
/// input and can write what it keeps); one that stays gets SIGTERM before its process group
/// is killed. Before, the group got SIGKILL at once and neither mark was written.
#[test]
fn a_stdio_server_quiver_closes_is_stopped_gently() {
    let server = ONE_TOOL_SERVER;
    for (linger, expected) in [("", "eof\n"), (", LINGER = \"1\"", "eof\nterm\n")] {
        let dir = workdir("gentle-stop");
        let marks = dir.join("marks");
        std::fs::write(
            dir.join("quiver.toml"),
            format!(
                "[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ ON_EXIT = {marks:?}{linger} }}\n"
            ),
        )
        .unwrap();
        let out = quiver_in(&dir, &["call", "mcp__one__t", r#"{"x": "a"}"#]);
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
        let marked = std::fs::read_to_string(&marks).unwrap_or_default();
        assert_eq!(marked, expected, "linger {linger:?}");
    }
}

/// `[surface] search_default_limit` is what both the model and `quiver search` get without a
/// limit, and what `tool_search`'s schema says the default is. The schema said 8 whatever
/// the setting, and `quiver search` always asked for 8.
#[test]
fn the_configured_search_limit_is_the_default_everywhere() {
    let server = ONE_TOOL_SERVER;
    let dir = workdir("search-limit");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nsearch_default_limit = 3\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ MORE = \"9\" }}\n"
        ),
    )
    .unwrap();
    let found = stdout(&quiver_in(&dir, &["search", "takes one field"]));
    assert_eq!(found.matches("\"score\"").count(), 3, "{found}");
    let more = stdout(&quiver_in(
        &dir,
        &["search", "takes one field", "--limit", "5"],
    ));
    assert_eq!(more.matches("\"score\"").count(), 5, "{more}");
    let described = stdout(&quiver_in(
        &dir,
        &["call", "describe_tool", r#"{"name": "tool_search"}"#],
    ));
    assert!(
        described.contains("How many tools to return (default 3)."),
        "{described}"
    );
}

/// `quiver check` names a system tool or an anchor that a deny rule refuses everyone: the
/// system tool stayed on every list with every call refused, the anchor was dropped
/// silently, and check said "config ok".
#[test]
fn check_names_system_tools_and_anchors_denied_to_everyone() {
    let server = ONE_TOOL_SERVER;
    let dir = workdir("denied-system");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nsystem = [\"mcp__one__t\"]\nanchors = [\"mcp__one__t1\"]\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ MORE = \"1\" }}\n\n[[policy.rules]]\nid = \"off\"\ntool = \"mcp__one__*\"\naction = \"deny\"\nmessage = \"off today\"\n"
        ),
    )
    .unwrap();
    let out = quiver_in(&dir, &["check"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("surface: [config] system tool `mcp__one__t` is denied to every caller by policy rule `off`"),
        "{text}"
    );
    assert!(
        text.contains("surface: [config] anchor `mcp__one__t1` is denied to every caller by policy rule `off`, so it is never offered"),
        "{text}"
    );
    // A rule needing an earlier call of a tool everyone is refused can never be met.
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ MORE = \"1\" }}\n\n[[policy.rules]]\nid = \"off\"\ntool = \"mcp__one__t1\"\naction = \"deny\"\nmessage = \"off today\"\n\n[[policy.rules]]\nid = \"after\"\ntool = \"mcp__one__t\"\naction = \"deny\"\nrequires_prior = \"mcp__one__t1\"\nmessage = \"call t1 first\"\n"
        ),
    )
    .unwrap();
    let out = quiver_in(&dir, &["check"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("policy: [config] policy rule `after` needs a call of `mcp__one__t1` first, which policy rule `off` refuses every caller, so `mcp__one__t` can never be called"),
        "{text}"
    );
}

/// Two servers whose prefixed tool names collide (`a` + `_t` and `a_` + `t` are both
/// `mcp__a___t`): the server configured first has the name, even when it connects last. The
/// first to connect had it, so a restart could move the name to the other server.
#[test]
fn a_name_two_servers_take_is_the_first_configured_servers() {
    let server = ONE_TOOL_SERVER;
    let dir = workdir("collision-order");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"a\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ NAME = \"_t\", DELAY = \"1\", DESCRIPTION = \"Served by first. Use it in tests.\" }}\n\n[[mcp.servers]]\nname = \"a_\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ NAME = \"t\", DESCRIPTION = \"Served by second. Use it in tests.\" }}\n"
        ),
    )
    .unwrap();
    let described = stdout(&quiver_in(
        &dir,
        &["call", "describe_tool", r#"{"name": "mcp__a___t"}"#],
    ));
    assert!(
        described.contains("Served by first") && !described.contains("Served by second"),
        "{described}"
    );
}

/// A session of an admin token proposes a custom tool through `create_custom_tool`: it lands
/// as a draft (never served until approved); a bad source is a hint naming line and
/// column; a token that is not admin is not shown the tool and its call is refused.
#[test]
fn an_admin_token_proposes_a_custom_tool_as_a_draft() {
    let dir = workdir("custom-propose");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"lead\"\ntoken = \"lead-secret-123456\"\nadmin = true\n\n[[auth.tokens]]\nname = \"intern\"\ntoken = \"intern-secret-12345\"\n",
    )
    .unwrap();
    let proposal = serde_json::json!({
        "name": "double_it",
        "description": "Doubles a number.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
        "source": "async function main(inputs) { return inputs.n * 2; }",
        "tests": [{"inputs": {"n": 2}, "expect": 4}],
    })
    .to_string();
    let out = quiver_in(
        &dir,
        &["call", "create_custom_tool", &proposal, "--token", "lead"],
    );
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("\"status\": \"draft\""),
        "{}",
        stdout(&out)
    );
    let list = stdout(&quiver_in(&dir, &["custom", "list"]));
    assert!(
        list.contains("double_it") && list.contains("draft"),
        "{list}"
    );
    // Not served: a draft is nobody's tool yet.
    let call = quiver_in(&dir, &["call", "double_it", r#"{"n": 3}"#]);
    assert_eq!(call.status.code(), Some(1), "{}", stdout(&call));

    let broken = serde_json::json!({
        "name": "broken_one",
        "description": "Breaks.",
        "input_schema": {"type": "object"},
        "source": "async function main(inputs) {\n  return inputs.(;\n}",
    })
    .to_string();
    let out = stdout(&quiver_in(
        &dir,
        &["call", "create_custom_tool", &broken, "--token", "lead"],
    ));
    assert!(
        out.contains("error (invalid_proposal)")
            && out.contains("line 2")
            && out.contains("Fix it and call create_custom_tool again.")
            && !out.contains("schema hint"),
        "a syntax error is the model's to fix, and said as what it is: {out}"
    );

    let out = quiver_in(
        &dir,
        &["call", "create_custom_tool", &proposal, "--token", "intern"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("forbidden") && stdout(&out).contains("admin"),
        "refused to a token that is not admin: {}",
        stdout(&out)
    );
    // tool_search finds it for the admin token only.
    let query = "propose a new custom tool in javascript";
    let lead = stdout(&quiver_in(&dir, &["search", query, "--token", "lead"]));
    assert!(lead.contains("create_custom_tool"), "{lead}");
    let intern = stdout(&quiver_in(&dir, &["search", query, "--token", "intern"]));
    assert!(!intern.contains("create_custom_tool"), "{intern}");
}

/// `quiver custom add` refuses bad input naming the file (and for JSON and source errors
/// the line and column), stores nothing, then takes a good tool through test and approve.
#[test]
fn custom_add_names_what_is_wrong_and_stores_nothing() {
    let dir = workdir("custom-add");
    std::fs::write(
        dir.join("ok.js"),
        "async function main(inputs) { return inputs.n + 1; }",
    )
    .unwrap();
    std::fs::write(
        dir.join("bad.js"),
        "async function main(inputs) {\n  return inputs.(;\n}",
    )
    .unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {"n": {"type": "number"}}}"#,
    )
    .unwrap();
    std::fs::write(dir.join("broken.json"), "{\"type\": \"object\",\n").unwrap();
    std::fs::write(
        dir.join("tests.json"),
        r#"[{"inputs": {"n": 1}, "expect": 2}]"#,
    )
    .unwrap();
    let add = |file: &str, name: &str, schema: &str| {
        quiver_in(
            &dir,
            &[
                "custom",
                "add",
                file,
                "--name",
                name,
                "--description",
                "Adds one.",
                "--schema",
                schema,
                "--tests",
                "tests.json",
            ],
        )
    };
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    for (out, wants) in [
        (
            add("nope.js", "add_one", "schema.json"),
            vec!["nope.js", "existing"],
        ),
        (
            add("ok.js", "add_one", "broken.json"),
            vec!["broken.json", "line 2", "not valid JSON"],
        ),
        (
            add("bad.js", "add_one", "schema.json"),
            vec!["bad.js", "line 2", "does not compile"],
        ),
        (add("ok.js", "Add One", "schema.json"), vec!["Add One"]),
    ] {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        for w in wants {
            assert!(stderr(&out).contains(w), "wants {w:?}: {}", stderr(&out));
        }
    }
    let list = stdout(&quiver_in(&dir, &["custom", "list"]));
    assert!(list.contains("no custom tools"), "nothing stored: {list}");

    assert!(add("ok.js", "add_one", "schema.json").status.success());
    let test = quiver_in(&dir, &["custom", "test", "add_one"]);
    assert!(test.status.success(), "{}", stdout(&test));
    assert!(
        quiver_in(&dir, &["custom", "approve", "add_one"])
            .status
            .success()
    );
    let call = stdout(&quiver_in(&dir, &["call", "add_one", r#"{"n": 41}"#]));
    assert!(call.contains("42"), "{call}");
}

/// `quiver tools` shows one session's surface and ends by saying how many more tools the
/// catalog holds and how to list them; `--all` lists every one with its family (and
/// server) in each format.
#[test]
fn tools_all_lists_the_whole_catalog_and_the_surface_says_it_exists() {
    let dir = workdir("tools-all");
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"one": {"command": "python3",
            "args": [ONE_TOOL_SERVER], "env": {"MORE": "3"}}}})
        .to_string(),
    )
    .unwrap();
    let surface = quiver_in(&dir, &["--mcp-config", "mcp.json", "tools"]);
    let text = stdout(&surface);
    assert!(surface.status.success(), "{text}");
    assert!(
        !text.contains("mcp__one__t1"),
        "the surface holds only the system tools: {text}"
    );
    assert!(
        text.contains("more tool(s) in the catalog, found through tool_search: `quiver tools --all` lists every one"),
        "{text}"
    );
    // Plan mode's search finds none of the server's tools (none says it is read-only): the
    // count says how many this mode can find, not the whole catalog's.
    let plan = stdout(&quiver_in(
        &dir,
        &["--mcp-config", "mcp.json", "tools", "--mode", "plan"],
    ));
    assert!(
        plan.contains("of them found through tool_search in plan mode (the rest are not offered to this caller in it)"),
        "{plan}"
    );
    // A token that cannot search is listed the tool it names, and told it cannot reach the
    // rest rather than sent to tool_search.
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-long-enough-1\"\nallowed_tools = [\"mcp__one__t1\"]\n",
    )
    .unwrap();
    let narrow = quiver_in(
        &dir,
        &["--mcp-config", "mcp.json", "tools", "--token", "ci"],
    );
    let text = stdout(&narrow);
    assert!(narrow.status.success(), "{text}");
    assert!(text.contains("mcp__one__t1 "), "{text}");
    assert!(
        text.contains("more tool(s) in the catalog, which this caller cannot find (tool_search is not among its allowed tools)"),
        "{text}"
    );
    // A deny rule on every tool takes tool_search from every caller: said by the listing,
    // and by `quiver check` as a note.
    std::fs::write(
        dir.join("quiver.toml"),
        "[[policy.rules]]\nid = \"freeze\"\ntool = \"*\"\naction = \"deny\"\nmessage = \"frozen\"\n",
    )
    .unwrap();
    let frozen = stdout(&quiver_in(&dir, &["--mcp-config", "mcp.json", "tools"]));
    assert!(
        frozen.contains("which this caller cannot find (policy rule `freeze` refuses tool_search)"),
        "{frozen}"
    );
    let checked = quiver_in(&dir, &["--mcp-config", "mcp.json", "check"]);
    let text = stdout(&checked);
    assert!(
        text.contains("policy: [note] policy rule `freeze` refuses tool_search to every caller"),
        "{text}"
    );
    std::fs::remove_file(dir.join("quiver.toml")).unwrap();
    let all = quiver_in(&dir, &["--mcp-config", "mcp.json", "tools", "--all"]);
    let text = stdout(&all);
    assert!(all.status.success(), "{text}");
    for name in ["mcp__one__t", "mcp__one__t1", "mcp__one__t3", "tool_search"] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} is listed: {text}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("mcp__one__t1 ") && l.contains("mcp:one")),
        "each tool with its family: {text}"
    );
    let json = quiver_in(
        &dir,
        &[
            "--mcp-config",
            "mcp.json",
            "tools",
            "--all",
            "--format",
            "json",
        ],
    );
    let listed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("one JSON array");
    let t2 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__one__t2")
        .expect("mcp__one__t2 in the JSON");
    assert_eq!(t2["family"], "mcp:one");
    assert_eq!(t2["server"], "one");
    let openai = quiver_in(
        &dir,
        &[
            "--mcp-config",
            "mcp.json",
            "tools",
            "--all",
            "--format",
            "openai",
        ],
    );
    let listed: serde_json::Value = serde_json::from_slice(&openai.stdout).expect("one JSON array");
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "mcp__one__t3"),
        "{listed}"
    );
}

/// A command waiting for a server that does not answer says so after a few seconds, and
/// for how long it waits, rather than staying silent until the wait ends.
#[test]
fn a_wait_for_a_slow_server_is_said_while_it_lasts() {
    let dir = workdir("slow-server");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"hang\"\ncommand = \"sleep\"\nargs = [\"60\"]\nconnect_timeout = \"5s\"\n",
    )
    .unwrap();
    let out = quiver_in(&dir, &["tools"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let notice = err
        .find("upstream MCP server hang: still connecting after 3 s; waiting up to")
        .unwrap_or_else(|| panic!("{err}"));
    let down = err
        .find("upstream MCP server hang: down (connect failed: no answer to initialize within 5 s)")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(notice < down, "the notice comes first: {err}");
}

/// `quiver custom add` refuses what could never work, saying what would: a name Quiver's own
/// tools hold (the core family's names are exactly `CORE_TOOL_NAMES`), an `expect_error`
/// kind no run ends in (the kinds are listed, in `--help` too), and a source over the limit
/// (its size, the limit and the key); `custom show` gives the limits results were recorded
/// under as the `[sandbox]` keys.
#[test]
fn custom_add_refuses_taken_names_unknown_error_kinds_and_says_the_source_limit() {
    let dir = workdir("custom-refusals");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"lead\"\ntoken = \"lead-secret-123456\"\nadmin = true\n",
    )
    .unwrap();
    let all = quiver_in(&dir, &["tools", "--all", "--format", "json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&all.stdout).unwrap();
    let mut core: Vec<&str> = listed
        .iter()
        .filter(|t| t["family"] == "core")
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    core.sort_unstable();
    let mut reserved = quiver_host::CORE_TOOL_NAMES.to_vec();
    reserved.sort_unstable();
    assert_eq!(
        core, reserved,
        "the core family holds exactly CORE_TOOL_NAMES"
    );

    std::fs::write(
        dir.join("ok.js"),
        "async function main(inputs) { return inputs.n + 1; }",
    )
    .unwrap();
    std::fs::write(dir.join("big.js"), "//".repeat(35_000)).unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {"n": {"type": "number"}}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("tests.json"),
        r#"[{"inputs": {"n": 1}, "expect": 2}]"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("odd.json"),
        r#"[{"inputs": {"n": 1}, "expect_error": "nonsense_kind"}]"#,
    )
    .unwrap();
    let add = |file: &str, name: &str, tests: &str| {
        quiver_in(
            &dir,
            &[
                "custom",
                "add",
                file,
                "--name",
                name,
                "--description",
                "Adds one. Use it when testing.",
                "--schema",
                "schema.json",
                "--tests",
                tests,
            ],
        )
    };
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    for (out, wants) in [
        (
            add("ok.js", "tool_search", "tests.json"),
            vec![
                "the name `tool_search` is taken by Quiver's own tool `tool_search` (the `core` family",
                "choose another name",
            ],
        ),
        (
            add("ok.js", "read_result", "tests.json"),
            vec!["taken by Quiver's own tool `read_result`"],
        ),
        (
            add("ok.js", "add_one", "odd.json"),
            vec![
                "odd.json",
                "`expect_error` is `nonsense_kind`",
                "`timeout`, `memory`, `stack`, `input_too_large`, `output_too_large`, `invalid_result`, `call_limit`, `depth_limit`, `exception`",
            ],
        ),
        (
            add("big.js", "add_one", "tests.json"),
            vec![
                "big.js",
                "70000 bytes, larger than the source limit of 64 KiB",
                "`[sandbox] source_kib`",
            ],
        ),
    ] {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        for w in wants {
            assert!(stderr(&out).contains(w), "wants {w:?}: {}", stderr(&out));
        }
    }
    let help = stdout(&quiver_in(&dir, &["custom", "add", "--help"]));
    for kind in quiver_registry::sandbox::SandboxError::CASE_KINDS {
        assert!(help.contains(&format!("`{kind}`")), "{kind}: {help}");
    }
    assert!(help.contains("`tool_search`"), "{help}");
    let list = stdout(&quiver_in(&dir, &["custom", "list"]));
    assert!(list.contains("no custom tools"), "nothing stored: {list}");

    assert!(add("ok.js", "add_one", "tests.json").status.success());
    assert!(
        quiver_in(&dir, &["custom", "approve", "add_one"])
            .status
            .success()
    );
    let shown: serde_json::Value =
        serde_json::from_slice(&quiver_in(&dir, &["custom", "show", "add_one"]).stdout).unwrap();
    assert_eq!(
        shown["test_results"]["limits"],
        serde_json::json!({"wall_time_ms": 5000, "heap_mib": 64, "stack_kib": 1024,
            "source_kib": 64, "input_kib": 1024, "output_kib": 1024, "log_kib": 64,
            "result_depth": 64, "max_calls": 100, "max_depth": 4}),
        "{shown}"
    );
    assert!(shown.get("not_served").is_none(), "{shown}");
}

/// A tool an operator disabled is listed by `tools --all`, marked, in every format (the
/// provider formats, which a provider takes as they are, name it on stderr); a CLI call of
/// it says it is disabled and how to enable it; the session's surface never shows it.
#[tokio::test]
async fn a_disabled_tool_is_listed_as_disabled_and_its_call_says_how_to_enable_it() {
    use quiver_registry::store::{DefinitionStore, ToolDefinition, ToolType};
    let dir = workdir("disabled-listed");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{ONE_TOOL_SERVER:?}]\n"
        ),
    )
    .unwrap();
    {
        // As `quiver serve` records the tools its servers list.
        let store = quiver_store_sqlite::SqliteStore::open(dir.join("quiver.db")).unwrap();
        let spec = quiver_contract::ToolSpec::new("mcp__one__t", "Takes one field.");
        store
            .put_definition(ToolDefinition::from_spec(&spec, ToolType::Mcp, "mcp:one:t"))
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let off = quiver_in(&dir, &["custom", "disable", "mcp__one__t"]);
    assert!(off.status.success(), "{}", stderr(&off));

    let table = stdout(&quiver_in(&dir, &["tools", "--all"]));
    let row = table
        .lines()
        .find(|l| l.starts_with("mcp__one__t "))
        .unwrap_or_else(|| panic!("listed: {table}"));
    assert!(row.contains("mcp:one (disabled)"), "{row}");
    assert!(
        table.contains("1 disabled by an operator (not offered to models): `quiver custom enable NAME` serves one again"),
        "{table}"
    );
    let json = quiver_in(&dir, &["tools", "--all", "--format", "json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&json.stdout).unwrap();
    let entry = listed
        .iter()
        .find(|t| t["name"] == "mcp__one__t")
        .expect("listed");
    assert_eq!(
        (&entry["disabled"], &entry["family"]),
        (&serde_json::json!(true), &serde_json::json!("mcp:one"))
    );
    assert!(
        listed
            .iter()
            .filter(|t| t["name"] != "mcp__one__t")
            .all(|t| t.get("disabled").is_none())
    );
    for format in ["openai", "anthropic"] {
        let out = quiver_in(&dir, &["tools", "--all", "--format", format]);
        assert!(!stdout(&out).contains("mcp__one__t"), "{}", stdout(&out));
        assert!(
            stderr(&out).contains(
                "disabled by an operator, so left out (not offered to models): `mcp__one__t`"
            ),
            "{format}: {}",
            stderr(&out)
        );
    }
    let surface = stdout(&quiver_in(&dir, &["tools"]));
    assert!(!surface.contains("mcp__one__t"), "{surface}");

    let call = quiver_in(&dir, &["call", "mcp__one__t", r#"{"x": "a"}"#]);
    assert_eq!(call.status.code(), Some(1), "{}", stderr(&call));
    assert!(
        stderr(&call).contains("`mcp__one__t` (mcp:one) is disabled by an operator")
            && stderr(&call).contains("`quiver custom enable mcp__one__t` serves it again"),
        "{}",
        stderr(&call)
    );
    assert!(
        !stdout(&call).contains("no tool named"),
        "{}",
        stdout(&call)
    );

    assert!(
        quiver_in(&dir, &["custom", "enable", "mcp__one__t"])
            .status
            .success()
    );
    let table = stdout(&quiver_in(&dir, &["tools", "--all"]));
    assert!(!table.contains("(disabled)"), "{table}");
    let call = quiver_in(&dir, &["call", "mcp__one__t", r#"{"x": "a"}"#]);
    assert!(call.status.success(), "{}", stdout(&call));
}

/// `custom list`, `custom jobs` and `custom show` only read: in a fresh directory they
/// create no store and say there is nothing.
#[test]
fn custom_listings_create_no_store() {
    let dir = workdir("custom-read-only");
    let list = quiver_in(&dir, &["custom", "list"]);
    assert!(list.status.success());
    assert!(
        stdout(&list).contains("no custom tools"),
        "{}",
        stdout(&list)
    );
    let jobs = quiver_in(&dir, &["custom", "jobs"]);
    assert!(jobs.status.success());
    assert!(
        stdout(&jobs).contains("no custom-tool jobs"),
        "{}",
        stdout(&jobs)
    );
    let show = quiver_in(&dir, &["custom", "show", "nothing"]);
    assert_eq!(show.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&show.stderr).contains("there is no custom tool named `nothing`")
    );
    let left: Vec<_> = std::fs::read_dir(&*dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "created: {left:?}");
}

/// `quiver model install` that fails leaves no target folder behind and says an OS error
/// once.
#[test]
fn a_failed_model_install_leaves_no_folder_and_says_the_error_once() {
    let dir = workdir("model-install-fails");
    std::fs::create_dir(dir.join("empty")).unwrap();
    std::fs::write(dir.join("junk.whl"), "not a zip").unwrap();
    for (from, to) in [("nonexistent", "x"), ("empty", "m3"), ("junk.whl", "m2")] {
        let out = quiver_in(&dir, &["model", "install", "--from", from, "--to", to]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(!dir.join(to).exists(), "{to} left behind: {err}");
        if from == "nonexistent" {
            assert_eq!(err.matches("os error 2").count(), 1, "{err}");
        }
    }
}

/// `--allow-host` names a Host an HTTP listener accepts: with `--stdio` and no metrics
/// listener there is none, so it is refused rather than accepted and ignored.
#[test]
fn allow_host_without_an_http_listener_is_refused() {
    let out = quiver(&["serve", "--stdio", "--allow-host", "example.org"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}{}", stdout(&out));
    assert!(
        err.contains("--allow-host applies to HTTP listeners, and `--stdio` has none"),
        "{err}"
    );
}

/// JSON nested past what the parser reads is said to be so, not called a quoting slip.
#[test]
fn a_json_argument_nested_too_deeply_is_said_so() {
    let deep = format!("{{\"query\": {}{}}}", "[".repeat(200), "]".repeat(200));
    let out = quiver(&["call", "tool_search", &deep]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nests arrays and objects more than 128 levels deep")
            && !err.contains("quote it whole"),
        "{err}"
    );
}

/// A port another program listens on: the refusal says what to do, not only the OS error.
#[test]
fn a_port_in_use_says_how_to_listen_elsewhere() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = quiver(&["serve", "--listen", &addr]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("binding {addr}: Address already in use"))
            && err.contains("give --listen another port; port 0 picks a free one"),
        "{err}"
    );
}

/// `check --against` a PostgreSQL URL other than the configured store's is refused with
/// what it takes, and the URL's password is masked.
#[test]
fn check_against_a_foreign_database_url_says_what_it_takes_and_masks_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let out = quiver_in(
        dir.path(),
        &[
            "check",
            "--against",
            "postgres://quiver:s3cret-pw@127.0.0.1:1/x",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("`--against` takes a SQLite file, or this configuration's own `[store] url`"),
        "{err}"
    );
    assert!(err.contains("postgres://quiver:***@127.0.0.1:1/x"), "{err}");
    assert!(!err.contains("s3cret-pw"), "{err}");
}

/// `quiver store migrate` walks the SQLite log's hash chain before it copies anything: a
/// log changed behind Quiver's back is refused (the copy would chain the changed rows anew,
/// and they would verify intact), naming the first problem and the way on; with
/// `--accept-broken-chain` it goes on, saying what it carries over.
#[test]
fn migrate_refuses_a_log_whose_chain_is_broken() {
    let dir = workdir("migrate-broken");
    for i in 0..3 {
        let out = quiver_in(
            &dir,
            &["call", "tool_search", &format!(r#"{{"query": "q{i}"}}"#)],
        );
        assert!(out.status.success(), "{out:?}");
    }
    let db = dir.join("quiver.db");
    let conn = rusqlite::Connection::open(&db).expect("open");
    // Backdated by 100 days, behind Quiver's back.
    conn.execute(
        "UPDATE execution_log SET created_at = created_at - 8640000000000 WHERE chain_seq = 2",
        [],
    )
    .expect("tamper");
    drop(conn);
    // Nothing listens on port 1: a copy that went ahead would fail to connect.
    let to = "postgres://quiver:secret@127.0.0.1:1/quiver";
    let migrate = |extra: &[&str]| {
        let mut args = vec!["store", "migrate", "--from", "quiver.db", "--to", to];
        args.extend_from_slice(extra);
        let out = quiver_in(&dir, &args);
        let text = stdout(&out) + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = migrate(&[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("quiver.db fails its hash-chain check: 1 problem(s) in 3 row(s)"),
        "{text}"
    );
    assert!(text.contains("row 2 (id 2, call "), "{text}");
    assert!(text.contains("nothing was copied"), "{text}");
    assert!(text.contains("--accept-broken-chain"), "{text}");
    assert!(!text.contains("secret"), "{text}");

    let (ok, text) = migrate(&["--accept-broken-chain"]);
    assert!(!ok, "the database is not there: {text}");
    assert!(
        text.contains("copying anyway (--accept-broken-chain)"),
        "{text}"
    );
    assert!(text.contains("row 2 (id 2, call "), "{text}");
    assert!(text.contains("opening postgres://"), "{text}");
}

/// `quiver log --verify` on a chain with more problems than it lists says how many there
/// are in all, in how many rows, and that only the first are listed.
#[test]
fn verify_counts_the_problems_it_does_not_list() {
    let dir = workdir("verify-many");
    for i in 0..55 {
        let out = quiver_in(
            &dir,
            &["call", "tool_search", &format!(r#"{{"query": "q{i}"}}"#)],
        );
        assert!(out.status.success(), "{out:?}");
    }
    let conn = rusqlite::Connection::open(dir.join("quiver.db")).expect("open");
    conn.execute("UPDATE execution_log SET reasoning = 'edited'", [])
        .expect("tamper");
    drop(conn);
    let out = quiver_in(&dir, &["log", "--verify"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "chain BROKEN: 55 problem(s) in 55 row(s) checked (rows 1 to 55); the first 50 are listed;"
        ),
        "{text}"
    );
    assert!(
        text.contains("  ... and 5 more problem(s) not listed"),
        "{text}"
    );
}

/// `quiver call` keeps nothing past its own process: a shortened result says so and does
/// not name `read_result` pages no later command could read.
#[test]
fn a_shortened_result_of_quiver_call_names_no_pages_to_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let skill = dir.path().join("skills/big");
    std::fs::create_dir_all(&skill).unwrap();
    let mut body = String::from(
        "---\nname: big\ndescription: A long skill. Use it to test long results.\n---\n",
    );
    for i in 1..=400 {
        body.push_str(&format!("Step {i}: do the thing number {i} carefully.\n"));
    }
    std::fs::write(skill.join("SKILL.md"), body).unwrap();
    std::fs::write(
        dir.path().join("quiver.toml"),
        "[limits]\nresult_tokens = 320\n\n[skills]\ndirs = [\"./skills\"]\n",
    )
    .unwrap();
    let out = quiver_in(dir.path(), &["call", "skill", r#"{"name": "big"}"#]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("The whole result was not kept (this command ends with the call"),
        "{text}"
    );
    assert!(!text.contains("read_result {"), "{text}");
}

/// `quiver status` with a database it cannot reach says so on the store's line, with the
/// password masked, and still shows the upstreams (exit 1): the moment an operator needs it.
#[test]
fn status_with_the_database_down_still_shows_the_upstreams() {
    let dir = workdir("status-db-down");
    std::fs::write(
        dir.join("quiver.toml"),
        "[store]\nurl = \"postgres://quiver:s3cret-pw@127.0.0.1:1/quiver\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"one": {"command": "python3",
            "args": [ONE_TOOL_SERVER]}}})
        .to_string(),
    )
    .unwrap();
    let out = quiver_in(&dir, &["--mcp-config", "mcp.json", "status"]);
    let text = stdout(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}{err}");
    assert!(
        text.contains("store: postgres://quiver:***@127.0.0.1:1/quiver (PostgreSQL, shared): cannot be opened:")
            && text.contains("cannot reach the server"),
        "{text}"
    );
    assert!(
        text.contains("one ") && text.contains("connected"),
        "{text}"
    );
    assert!(!text.contains("s3cret-pw") && !err.contains("s3cret-pw"));
}

/// `quiver check` asks the `[auth.oidc]` provider for its discovery document: one it cannot
/// read fails the check before any user's token does.
#[test]
fn check_reads_the_oidc_providers_discovery_document() {
    let dir = workdir("check-oidc");
    std::fs::write(
        dir.join("quiver.toml"),
        "[auth.oidc]\nissuer = \"http://127.0.0.1:1\"\nresource = \"http://127.0.0.1:7345/mcp\"\n",
    )
    .unwrap();
    let out = quiver_in(&dir, &["check"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("[auth.oidc] issuer http://127.0.0.1:1: [tokens cannot be checked]"),
        "{text}"
    );
}

/// `custom add` says the definition's lints as it stores the draft (a description that
/// does not say when to use the tool, a property with no description), so the author
/// learns them at once rather than when `quiver check` fails in CI; a clean one says none.
#[test]
fn custom_add_says_the_definitions_lints() {
    let dir = workdir("custom-add-lints");
    std::fs::write(
        dir.join("sum.js"),
        "async function main(inputs) { return inputs.n + 1; }",
    )
    .unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}"#,
    )
    .unwrap();
    let add = |name: &str, description: &str| {
        quiver_in(
            &dir,
            &[
                "custom",
                "add",
                "sum.js",
                "--name",
                name,
                "--description",
                description,
                "--schema",
                "schema.json",
            ],
        )
    };
    let out = add("sum_numbers", "Adds one to a number.");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("quiver: lint (`quiver check` fails on it): sum_numbers: [when_to_use]")
            && said.contains("sum_numbers at /properties/n: [property_description]"),
        "{said}"
    );
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {"n": {"type": "number", "description": "The number."}}, "required": ["n"]}"#,
    )
    .unwrap();
    let out = add(
        "add_one",
        "Adds one to a number. Use it when asked to add one.",
    );
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("lint"), "{said}");
}

/// `quiver call` prints what the model reads: every row of a list (a preview of 20 rows
/// would hide rows from a model whose client shows it only the text); with `--json-result`
/// it prints the envelope as JSON.
#[test]
fn call_prints_the_whole_result_as_json_when_asked() {
    let dir = workdir("call-json-result");
    std::fs::write(
        dir.join("many.js"),
        "async function main() { return Array.from({length: 65}, (_, i) => `item ${i}`); }",
    )
    .unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {}}"#,
    )
    .unwrap();
    let out = quiver_in(
        &dir,
        &[
            "custom",
            "add",
            "many.js",
            "--name",
            "many_items",
            "--description",
            "Lists 65 items. Use it when testing.",
            "--schema",
            "schema.json",
        ],
    );
    assert!(out.status.success(), "{}", stdout(&out));
    let out = quiver_in(&dir, &["custom", "approve", "many_items", "--force"]);
    assert!(out.status.success(), "{}", stdout(&out));
    let shown = stdout(&quiver_in(&dir, &["call", "many_items"]));
    assert!(
        shown.contains("65 rows") && shown.contains("- \"item 64\"") && !shown.contains("more"),
        "{shown}"
    );
    let out = quiver_in(&dir, &["call", "many_items", "{}", "--json-result"]);
    assert!(out.status.success(), "{}", stdout(&out));
    let whole: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(whole["kind"], "ok", "{whole}");
    let items = whole["data"].as_array().expect("the list");
    assert_eq!(items.len(), 65);
    assert_eq!(items[64], "item 64");
}

/// `quiver check` reports a per-session server whose command is not found, as it does a
/// shared one that cannot start (no session has started it to find out); one whose command
/// is on `PATH` passes.
#[test]
fn check_reports_a_per_session_server_whose_command_is_missing() {
    let dir = workdir("session-command");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"fs\"\ncommand = \"no-such-mcp-server-xyz\"\nscope = \"session\"\n\n[[mcp.servers]]\nname = \"py\"\ncommand = \"python3\"\nargs = [\"-c\", \"pass\"]\nscope = \"session\"\n",
    )
    .unwrap();
    let out = quiver_in(&dir, &["check"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("mcp server fs: [cannot start] `no-such-mcp-server-xyz` is not found"),
        "{text}"
    );
    assert!(!text.contains("mcp server py:"), "{text}");
}
