use super::*;

fn env(k: &str) -> Option<String> {
    match k {
        "HOST" => Some("mcp.example.com".to_owned()),
        "BIN" => Some("/opt/bin".to_owned()),
        _ => None,
    }
}

/// A file of the wrong shape is said to be so in its own words, not serde's ("expected
/// struct Entry").
#[test]
fn a_file_of_the_wrong_shape_names_the_shape() {
    for (text, says) in [
        (
            "[]",
            "c.json: the file is an array, not an object: expected {\"mcpServers\"",
        ),
        (
            r#"{"mcpServers": []}"#,
            "\"mcpServers\" is an array, not an object of servers by name",
        ),
        (
            r#"{"mcpServers": {"a": "x"}}"#,
            "server \"a\" is a string, not an object: give {\"command\": ..., \"args\": [...]}",
        ),
        (
            r#"{"servers": {"b": null}}"#,
            "server \"b\" is null, not an object",
        ),
    ] {
        let err = format!("{:#}", parse_mcp_servers(text, "c.json", &env).unwrap_err());
        assert!(err.contains(says), "{text}: {err}");
        assert!(!err.contains("struct"), "{text}: {err}");
    }
}

/// The servers come in the file's order, not by name: where two servers offer one tool
/// name or resource URI, the first in the file has it.
#[test]
fn servers_keep_the_files_order() {
    let text = r#"{"mcpServers": {"zeta": {"command": "z"}, "alpha": {"command": "a"}, "mid": {"command": "m"}}}"#;
    let names: Vec<String> = parse_mcp_servers(text, "c.json", &env)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["zeta", "alpha", "mid"]);
}

#[test]
fn reads_the_desktop_clients_format() {
    let text = r#"{"mcpServers": {
        "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"], "env": {"A": "1"}},
        "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Key": "k"}},
        "off": {"command": "x", "disabled": true},
        "events": {"type": "sse", "url": "https://events.example/sse"}
    }}"#;
    // A disabled server and one on the legacy SSE transport are skipped (warned); the
    // rest load.
    let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0].name, "everything");
    assert_eq!(servers[0].command.as_deref(), Some("npx"));
    assert_eq!(servers[0].env.get("A").map(String::as_str), Some("1"));
    assert_eq!(
        servers[1].url.as_deref(),
        Some("https://mcp.example.com/mcp")
    );
    assert_eq!(
        servers[1].headers.get("X-Key").map(String::as_str),
        Some("k")
    );
}

/// `${env:VAR}` works in every string field, as in `quiver.toml` (`env` and `headers`
/// values are replaced when the servers are set up).
#[test]
fn env_references_work_in_every_field() {
    let text = r#"{"mcpServers": {
        "local": {"command": "${env:BIN}/server", "args": ["--root", "${env:BIN}/data"], "cwd": "${env:BIN}", "env": {"K": "${env:BIN}"}},
        "remote": {"url": "https://${env:HOST}/mcp", "headers": {"X-Key": "${env:BIN}"}}
    }}"#;
    let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
    assert_eq!(servers[0].command.as_deref(), Some("/opt/bin/server"));
    assert_eq!(servers[0].args, ["--root", "/opt/bin/data"]);
    assert_eq!(
        servers[0].cwd.as_deref(),
        Some(std::path::Path::new("/opt/bin"))
    );
    assert_eq!(
        servers[1].url.as_deref(),
        Some("https://mcp.example.com/mcp")
    );
    let resolved = quiver_mcp_adapter::validate_all(&servers, &env);
    assert!(resolved.is_ok(), "{:?}", resolved.err());
    let err = format!(
        "{:#}",
        parse_mcp_servers(
            r#"{"mcpServers": {"r": {"url": "https://${env:NOPE}/mcp"}}}"#,
            "c.json",
            &env
        )
        .unwrap_err()
    );
    assert!(
        err.contains("c.json: server \"r\": url: environment variable NOPE is not set"),
        "{err}"
    );
}

/// Fields of the other transport are ignored (with a warning, like an unknown key: the
/// file is a desktop client's, leftovers included), never passed on; a `"type"` that
/// contradicts `command` / `url` is an error naming the file and the server.
#[test]
fn fields_of_the_other_transport_are_ignored_and_a_contradicting_type_is_an_error() {
    let err = |t: &str| format!("{:#}", parse_mcp_servers(t, "c.json", &env).unwrap_err());
    let remote = parse_mcp_servers(
        r#"{"mcpServers": {"a": {"url": "https://h/mcp", "env": {"K": "v"}, "args": ["x"]}}}"#,
        "c.json",
        &env,
    )
    .unwrap();
    assert!(remote[0].env.is_empty() && remote[0].args.is_empty());
    let local = parse_mcp_servers(
        r#"{"mcpServers": {"a": {"command": "x", "headers": {"K": "v"}}}}"#,
        "c.json",
        &env,
    )
    .unwrap();
    assert!(local[0].headers.is_empty());
    let e = err(r#"{"mcpServers": {"a": {"type": "http", "command": "x"}}}"#);
    assert!(
        e.contains("c.json: server \"a\" has \"type\": \"http\" but a \"command\""),
        "{e}"
    );
    let e = err(r#"{"mcpServers": {"a": {"type": "stdio", "url": "https://h/mcp"}}}"#);
    assert!(
        e.contains("c.json: server \"a\" has \"type\": \"stdio\" but a \"url\""),
        "{e}"
    );
    let e = err(r#"{"mcpServers": {"a": {"type": "websocket", "url": "wss://h"}}}"#);
    assert!(
        e.contains("c.json: server \"a\": unknown \"type\" \"websocket\""),
        "{e}"
    );
    let ok = r#"{"mcpServers": {"a": {"type": "streamable-http", "url": "https://h/mcp"}, "b": {"type": "stdio", "command": "x"}}}"#;
    assert_eq!(parse_mcp_servers(ok, "c.json", &env).unwrap().len(), 2);
}

/// A server's configuration error names the file it is in, without a doubled prefix;
/// a name configured twice names both files.
#[test]
fn server_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, json: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, json).unwrap();
        p
    };
    let toml = |t: &str| Config::parse(t, "q.toml", &env).unwrap();
    let err = |config: &Config, files: &[std::path::PathBuf]| {
        format!("{:#}", resolve_servers(config, files, &env).unwrap_err())
    };
    let a = file("a.json", r#"{"mcpServers": {"a": {"command": "x"}}}"#);
    let a2 = file("a2.json", r#"{"mcpServers": {"a": {"command": "y"}}}"#);
    let ftp = file(
        "ftp.json",
        r#"{"mcpServers": {"f": {"url": "ftp://h/mcp"}}}"#,
    );
    let stdio_a = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\n";

    let e = err(&toml(stdio_a), std::slice::from_ref(&a));
    assert_eq!(
        e,
        format!(
            "MCP server \"a\" is configured in q.toml and in {}; remove one, or rename one (the name is part of every tool name, mcp__<name>__<tool>)",
            a.display()
        )
    );
    let e = err(&Config::default(), &[a.clone(), a2.clone()]);
    assert!(
        e.contains(&format!("in {} and in {}", a.display(), a2.display())),
        "{e}"
    );
    let e = err(&Config::default(), std::slice::from_ref(&ftp));
    assert_eq!(
        e,
        format!(
            "{}: MCP server \"f\": url scheme \"ftp\" is not http or https",
            ftp.display()
        )
    );
    let e = err(
        &toml(
            "[[mcp.servers]]\nname = \"t\"\ntransport = \"stdio\"\ncommand = \"x\"\nurl = \"http://h\"\n",
        ),
        &[],
    );
    assert!(e.starts_with("q.toml: MCP server \"t\": `url`"), "{e}");
    assert!(!e.contains("MCP configuration"), "{e}");
    let e = err(
        &toml("[mcp]\ninsecure_http = [\"nope\"]\n"),
        std::slice::from_ref(&a),
    );
    assert!(
        e.contains("q.toml: [mcp] insecure_http names \"nope\", which is not a configured MCP server (configured: a)"),
        "{e}"
    );
    assert_eq!(
        resolve_servers(&toml(""), &[a, ftp.with_file_name("none.json")], &env)
            .map(|_| ())
            .unwrap_err()
            .to_string(),
        format!("cannot read {}", ftp.with_file_name("none.json").display())
    );
}

#[test]
fn other_clients_keys_are_ignored() {
    let text = r#"{"mcpServers": {
        "fs": {"command": "x", "alwaysAllow": ["read"], "autoApprove": [], "timeout": 60,
               "envFile": "${workspaceFolder}/.env", "description": "files",
               "comment": "mine", "enabled": true, "headersHelper": "h", "serverUrl": "u"}
    }}"#;
    let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].command.as_deref(), Some("x"));
}

#[test]
fn bad_entries_are_clear_errors() {
    let err = |t: &str| format!("{:#}", parse_mcp_servers(t, "c.json", &env).unwrap_err());
    assert!(
        err(r#"{"mcpServers": {"server-git": {"command": "x"}}}"#)
            .contains("rename it in the file, e.g. to \"server_git\"")
    );
    assert!(err(r#"{"mcpServers": {"a": {}}}"#).contains("neither \"command\""));
    assert!(err(r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#).contains("both"));
    assert!(
        err(r#"{"mcpServers": {"a": {"comand": "x"}}}"#)
            .contains("c.json: server \"a\": unknown key \"comand\"; did you mean \"command\"?")
    );
    assert!(err(r#"{"other": 1}"#).contains("no \"mcpServers\""));
    // VS Code's files: JSONC comments, and both keys at once.
    assert!(
        err("// my servers\n{\"servers\": {}}").contains(
            "it has comments (`//` or `/* */`, as VS Code's JSONC allows), which JSON does not; remove them"
        )
    );
    assert!(
        err(r#"{"servers": {}, "mcpServers": {"a": {"command": "x"}}}"#).contains(
            "the file has both \"mcpServers\" (Claude Desktop, Cursor) and \"servers\" (VS Code)"
        )
    );
    assert!(
        err(r#"{"servers": {"a": {"command": "x", "args": ["${workspaceFolder}/x"]}}}"#).contains(
            "c.json: server \"a\": args[0]: `${workspaceFolder}` is not something Quiver fills in"
        )
    );
    // A value of the wrong type is named by its server and key, a huge float quoted
    // short.
    assert_eq!(
        err(r#"{"mcpServers": {"a": {"command": "x", "args": [1e300]}}}"#),
        "c.json: server \"a\": \"args\" must be an array of strings, e.g. [\"-y\", \"pkg\"]; \"args\"[0] is a number"
    );
    assert_eq!(
        err(r#"{"mcpServers": {"a": {"command": "x", "disabled": 1}}}"#),
        "c.json: server \"a\": \"disabled\" must be true or false; it is a number"
    );
    // `${` in an `env` or `headers` name is refused, as in a value.
    assert_eq!(
        err(r#"{"mcpServers": {"a": {"command": "x", "env": {"${X}": "1"}}}}"#),
        "c.json: server \"a\": env.${X}: a key cannot hold `${...}`: keys are taken as written, and `${env:NAME}` works in values only; write the name itself"
    );
    assert!(
        err(r#"{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"X-${env:A}": "1"}}}}"#)
            .contains("headers.X-${env:A}: a key cannot hold")
    );
    assert!(err("[1,").contains("not an mcpServers JSON file"));
    // A key given twice is refused with its path, not settled as last-wins.
    assert_eq!(
        err(r#"{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}"#),
        "c.json: \"mcpServers\".\"a\" is given twice (JSON keeps only the last); keep one at line 1 column 42"
    );
    let e = err(
        "{\"mcpServers\": {\"a\": {\"command\": \"x\",\n \"env\": {\"K\": \"1\", \"K\": \"2\"}}}}",
    );
    assert!(
        e.contains("\"mcpServers\".\"a\".\"env\".\"K\" is given twice") && e.contains("line 2"),
        "{e}"
    );
}

/// `"scope": "session"` (Quiver's own key) runs one process per MCP session, as `scope` of
/// a `[[mcp.servers]]` entry; a value that is neither scope is named with the two there are,
/// and an http server cannot be per session.
#[test]
fn scope_makes_a_server_per_session() {
    let text = r#"{"mcpServers": {
        "fs": {"command": "mcp-server-filesystem", "scope": "session"},
        "git": {"command": "mcp-server-git", "scope": "shared"},
        "time": {"command": "mcp-server-time"}
    }}"#;
    let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
    let scopes: Vec<_> = servers.iter().map(|s| s.scope).collect();
    assert_eq!(
        scopes,
        [
            quiver_mcp_adapter::ServerScope::Session,
            quiver_mcp_adapter::ServerScope::Shared,
            quiver_mcp_adapter::ServerScope::Shared
        ]
    );
    let err = format!(
        "{:#}",
        parse_mcp_servers(
            r#"{"mcpServers": {"fs": {"command": "x", "scope": "per-session"}}}"#,
            "c.json",
            &env
        )
        .unwrap_err()
    );
    assert!(
        err.contains("server \"fs\": \"scope\"") && err.contains("`session`"),
        "{err}"
    );
    let http = parse_mcp_servers(
        r#"{"mcpServers": {"r": {"url": "https://mcp.example.com/mcp", "scope": "session"}}}"#,
        "c.json",
        &env,
    )
    .unwrap();
    let err = validate_all(&http, &env).unwrap_err().to_string();
    assert!(err.contains("scope = \"session\"` cannot apply"), "{err}");
}

/// A value of the wrong type is said in JSON's terms, with what to write, naming the file,
/// the server and the key: never serde's "invalid type: ..., expected a sequence". A file
/// that is not JSON at all gets its syntax error, not a type serde met on the way.
#[test]
fn a_value_of_the_wrong_type_says_what_to_write_in_json() {
    let err = |text: &str| format!("{:#}", parse_mcp_servers(text, "c.json", &env).unwrap_err());
    for (text, says) in [
        (
            r#"{"mcpServers": {"a": {"command": "x", "args": "x y"}}}"#,
            r#"c.json: server "a": "args" must be an array of strings, e.g. ["-y", "pkg"]; it is a string"#,
        ),
        (
            r#"{"mcpServers": {"a": {"command": "x", "args": ["-y", 2]}}}"#,
            r#"c.json: server "a": "args" must be an array of strings, e.g. ["-y", "pkg"]; "args"[1] is a number"#,
        ),
        (
            r#"{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}"#,
            r#"c.json: server "a": "env" must be an object of variable name to string, e.g. {"API_KEY": "${env:API_KEY}"}; "env"."K" is a number"#,
        ),
        (
            r#"{"mcpServers": {"a": {"command": "x", "env": ["K=1"]}}}"#,
            r#"c.json: server "a": "env" must be an object of variable name to string, e.g. {"API_KEY": "${env:API_KEY}"}; it is an array"#,
        ),
        (
            r#"{"mcpServers": {"a": {"url": "https://h/mcp", "headers": "Bearer x"}}}"#,
            r#"c.json: server "a": "headers" must be an object of header name to string, e.g. {"Authorization": "Bearer ${env:TOKEN}"}; it is a string"#,
        ),
        (
            r#"{"mcpServers": {"a": {"command": ["npx", "-y"]}}}"#,
            r#"c.json: server "a": "command" must be a string, the program to run, e.g. "npx"; it is an array"#,
        ),
        (
            r#"{"mcpServers": {"a": {"command": "x", "scope": 1}}}"#,
            r#"c.json: server "a": "scope" must be "shared" or "session"; it is a number"#,
        ),
        (
            r#"{"mcpServers": [], "theme": 1,}"#,
            "c.json: not an mcpServers JSON file: trailing comma at line 1 column 31",
        ),
    ] {
        let got = err(text);
        assert_eq!(got, says, "{text}");
        for jargon in ["invalid type", "sequence", "a map"] {
            assert!(!got.contains(jargon), "{text}: {got}");
        }
    }
}
