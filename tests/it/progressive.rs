//! Progressive disclosure from config: a server marked `progressive = true` (or some of its
//! tools through `progressive_tools`) has its tools listed in their lightweight form (the
//! first sentence, an open schema, a pointer to `describe_tool`) until the session's
//! `describe_tool` loads the full definition; the upstream is the real server-everything,
//! behind `quiver serve --stdio`.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::mcp_server::{
    INITIALIZE, INITIALIZED, answer_to, everything_bin, fresh_dir, stdio_server,
};

/// One stdio session with `quiver serve`, a request at a time.
struct Session {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    id: u64,
}

impl Session {
    async fn start(extra: &str) -> Session {
        let dir = fresh_dir();
        std::fs::write(
            dir.join("quiver.toml"),
            format!(
                "[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\n{extra}\n",
                everything_bin().display().to_string()
            ),
        )
        .expect("config written");
        let mut child = stdio_server(&dir, Stdio::null());
        let mut stdin = child.stdin.take().expect("piped");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        stdin
            .write_all(format!("{INITIALIZE}\n").as_bytes())
            .await
            .expect("writes");
        answer_to(&mut lines, 1).await;
        stdin
            .write_all(format!("{INITIALIZED}\n").as_bytes())
            .await
            .expect("writes");
        Session {
            _child: child,
            stdin,
            lines,
            id: 1,
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let line = json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params});
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("writes");
        let answer: Value =
            serde_json::from_str(&answer_to(&mut self.lines, self.id).await).expect("JSON");
        answer["result"].clone()
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await
    }

    /// The listed tool called `name`.
    async fn listed(&mut self, name: &str) -> Option<Value> {
        let list = self.request("tools/list", json!({})).await;
        list["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
    }
}

fn summary_only(tool: &Value) -> bool {
    tool["description"]
        .as_str()
        .unwrap_or_default()
        .contains("Summary only: call describe_tool")
}

#[tokio::test]
async fn a_progressive_server_lists_summaries_until_describe_tool_loads_the_full_definition() {
    let mut s = Session::start("progressive = true").await;
    let echo = "mcp__everything__echo";
    s.call(
        "tool_search",
        json!({"query": "echo back the input message"}),
    )
    .await;
    let light = s.listed(echo).await.expect("echo is in the working set");
    assert!(summary_only(&light), "{light}");
    assert!(
        light["inputSchema"]["properties"].get("message").is_none(),
        "no schema until loaded: {light}"
    );
    let described = s.call("describe_tool", json!({"name": echo})).await;
    assert!(
        described.to_string().contains("message"),
        "describe_tool gives the full schema: {described}"
    );
    let full = s.listed(echo).await.expect("still listed");
    assert!(!summary_only(&full), "{full}");
    assert!(
        full["inputSchema"]["properties"]["message"].is_object(),
        "the full schema: {full}"
    );
}

#[tokio::test]
async fn progressive_tools_picks_tools_by_pattern_and_leaves_the_rest_whole() {
    let mut s = Session::start("progressive_tools = [\"ec*\"]").await;
    s.call(
        "tool_search",
        json!({"query": "echo back the input message; add two numbers"}),
    )
    .await;
    let list = s.request("tools/list", json!({})).await;
    let tools = list["tools"].as_array().expect("tools");
    let everything: Vec<&Value> = tools
        .iter()
        .filter(|t| {
            t["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("mcp__everything__"))
        })
        .collect();
    let echo = everything
        .iter()
        .find(|t| t["name"] == "mcp__everything__echo")
        .unwrap_or_else(|| panic!("echo is paged in: {list}"));
    assert!(summary_only(echo), "{echo}");
    let whole: Vec<_> = everything
        .iter()
        .filter(|t| t["name"] != "mcp__everything__echo")
        .collect();
    assert!(
        !whole.is_empty(),
        "another everything tool was paged in: {list}"
    );
    for t in whole {
        assert!(!summary_only(t), "{t}");
    }
}

/// Capability filtering from config: a server whose tools `requires = ["vision"]` is
/// offered only to a token whose `model_capabilities` declare it; to another token its
/// tools are neither found, listed nor callable (the answer an unknown tool gets).
#[test]
fn a_tool_that_needs_a_model_capability_is_offered_only_to_tokens_declaring_it() {
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nrequires = [\"vision\"]\n\n\
             [[auth.tokens]]\nname = \"seer\"\ntoken = \"s1\"\nmodel_capabilities = [\"vision\"]\n\n\
             [[auth.tokens]]\nname = \"blind\"\ntoken = \"s2\"\n",
            everything_bin().display().to_string()
        ),
    )
    .expect("config written");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::mcp_server::quiver_binary())
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("quiver runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let echo = "mcp__everything__echo";
    let (_, seen) = run(&["search", "--token", "seer", "echo back the input message"]);
    assert!(seen.contains(echo), "{seen}");
    let (_, unseen) = run(&["search", "--token", "blind", "echo back the input message"]);
    assert!(!unseen.contains(echo), "{unseen}");
    let (code, called) = run(&["call", "--token", "seer", echo, r#"{"message": "hi"}"#]);
    assert_eq!(code, Some(0), "{called}");
    assert!(called.contains("hi"), "{called}");
    let (code, refused) = run(&["call", "--token", "blind", echo, r#"{"message": "hi"}"#]);
    assert_eq!(code, Some(1), "{refused}");
    assert!(
        refused.contains("undefined_tool") || refused.contains("no tool"),
        "{refused}"
    );
}

/// A client without a token declares its model's capabilities itself, by header or in
/// `_meta`; a malformed declaration is refused with how to write it
/// (`tests/fixtures/mcp_server/model_caps.py`).
#[tokio::test]
async fn a_client_declares_its_models_capabilities_by_header_or_meta() {
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nrequires = [\"vision\"]\nrequired = true\n",
            everything_bin().display().to_string()
        ),
    )
    .expect("config written");
    let mut server = crate::mcp_server::Server::start_in(
        crate::mcp_server::quiver_binary(),
        &["serve", "--listen", "127.0.0.1:0"],
        &dir,
    )
    .await;
    crate::mcp_server::run_script("model_caps.py", &[&server.url]).await;
    assert!(server.terminate().await.success());
}
