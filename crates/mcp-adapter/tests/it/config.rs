//! Configuration validation: names, tokens, https, the insecure opt-in, TOML shape.

use std::collections::BTreeMap;

use quiver_mcp_adapter::{McpClientConfig, ServerConfig, validate_all};

fn check(servers: &[ServerConfig], env: &[(&str, &str)], expect: Result<(), &str>) {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let got = validate_all(servers, &|k| env.get(k).cloned());
    match (got, expect) {
        (Ok(_), Ok(())) => {}
        (Err(e), Err(fragment)) => {
            assert!(e.to_string().contains(fragment), "`{e}` lacks `{fragment}`")
        }
        (Ok(_), Err(f)) => panic!("expected an error containing `{f}`"),
        (Err(e), Ok(())) => panic!("unexpected error: {e}"),
    }
}

fn http(name: &str, url: &str) -> ServerConfig {
    ServerConfig::http(name, url)
}

#[test]
fn names() {
    let s = |n: &str| ServerConfig::stdio(n, "true", vec![]);
    check(&[s("git"), s("My_Server2")], &[], Ok(()));
    check(&[s("bad-name")], &[], Err("[A-Za-z0-9_]"));
    check(&[s("a__b")], &[], Err("__"));
    check(&[s("")], &[], Err("empty"));
    check(&[s("Git"), s("git")], &[], Err("differ only in case"));
    // `mcp:resources` is the resource tools' family.
    check(&[s("Resources")], &[], Err("\"Resources\" is reserved"));
    check(&[s("resources_server")], &[], Ok(()));
}

#[test]
fn tokens_and_https() {
    let tok = [("MCP_REMOTE_TOKEN", "secret")];
    check(
        &[http("remote", "https://mcp.example.com/mcp")],
        &tok,
        Ok(()),
    );
    check(&[http("remote", "http://localhost:8080/mcp")], &tok, Ok(()));
    check(&[http("remote", "http://127.0.0.5/mcp")], &tok, Ok(()));
    check(&[http("remote", "http://[::1]:9/mcp")], &tok, Ok(()));
    // The token variable is derived from the uppercased name.
    check(
        &[http("Remote", "http://mcp.example.com/mcp")],
        &tok,
        Err("insecure_http = true"),
    );
    let err = validate_all(&[http("remote", "http://mcp.example.com/mcp")], &|k| {
        (k == "MCP_REMOTE_TOKEN").then(|| "t".to_owned())
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("\"remote\"") && err.contains("insecure_http = true"),
        "{err}"
    );
    // An empty token counts as none.
    check(
        &[http("remote", "http://mcp.example.com/mcp")],
        &[("MCP_REMOTE_TOKEN", "")],
        Ok(()),
    );
    check(&[http("remote", "http://mcp.example.com/mcp")], &[], Ok(()));
    // A configured Authorization header is a credential too.
    check(
        &[http("remote", "http://mcp.example.com/mcp").with_header("Authorization", "Bearer x")],
        &[],
        Err("insecure_http"),
    );
    // So is any header named for one (it must not go out in the clear), named in the
    // refusal; a header that is not one is not.
    for header in ["X-API-Key", "Cookie", "Proxy-Authorization", "X-Auth-Token"] {
        check(
            &[http("remote", "http://mcp.example.com/mcp").with_header(header, "v")],
            &[],
            Err(&format!(
                "the credential in header `{header}` would travel in cleartext"
            )),
        );
    }
    check(
        &[http("remote", "http://mcp.example.com/mcp").with_header("X-Tenant", "acme")],
        &[],
        Ok(()),
    );
}

#[test]
fn insecure_opt_in() {
    let tok = [("MCP_REMOTE_TOKEN", "secret")];
    check(
        &[http("remote", "http://mcp.internal/mcp").insecure_http()],
        &tok,
        Ok(()),
    );
    check(
        &[http("remote", "https://mcp.example.com/mcp").insecure_http()],
        &tok,
        Err("already https"),
    );
    check(
        &[http("remote", "http://localhost/mcp").insecure_http()],
        &tok,
        Err("already a loopback"),
    );
    // The list form must name a configured server; order does not matter.
    let cfg: McpClientConfig = serde_json::from_value(serde_json::json!({
        "insecure_http": ["ghost"],
        "servers": [{"name": "remote", "url": "http://mcp.internal/mcp"}]
    }))
    .unwrap();
    assert!(
        cfg.finalize(&|_| None)
            .unwrap_err()
            .to_string()
            .contains("\"ghost\"")
    );
    let cfg: McpClientConfig = serde_json::from_value(serde_json::json!({
        "insecure_http": ["remote"],
        "servers": [{"name": "remote", "url": "http://mcp.internal/mcp"}]
    }))
    .unwrap();
    assert!(
        cfg.finalize(&|k| (k == "MCP_REMOTE_TOKEN").then(|| "t".into()))
            .is_ok()
    );
}

#[test]
fn env_interpolation_and_shape() {
    let s = ServerConfig::stdio("x", "true", vec![]).with_env("TOKEN", "${env:HOME_TOKEN}");
    check(std::slice::from_ref(&s), &[("HOME_TOKEN", "v")], Ok(()));
    check(&[s], &[], Err("HOME_TOKEN is not set"));
    // Another `${...}` is not passed on as text (VS Code's `${input:...}` would reach the
    // server as its key).
    let vs = ServerConfig::stdio("x", "true", vec![]).with_env("KEY", "${input:api-key}");
    check(
        &[vs],
        &[],
        Err("KEY: `${input:api-key}` is not something Quiver fills in"),
    );
    let shell = ServerConfig::stdio("x", "true", vec![]).with_env("KEY", "${HOME_TOKEN}");
    check(&[shell], &[], Err("write `${env:HOME_TOKEN}`"));
    let bad: Result<ServerConfig, _> =
        serde_json::from_value(serde_json::json!({"name": "x", "command": "c", "bogus": 1}));
    assert!(bad.unwrap_err().to_string().contains("bogus"));
    let ok: ServerConfig = serde_json::from_value(serde_json::json!({
        "name": "x", "transport": "http", "url": "https://a.example/mcp",
        "liveness": "off", "http_timeout": "30s", "headers": {"X-Key": "k"}
    }))
    .unwrap();
    check(&[ok], &[], Ok(()));
    check(
        &[ServerConfig::http("x", "ftp://a.example/")],
        &[],
        Err("not http or https"),
    );
    check(
        &[ServerConfig::stdio("x", " ", vec![])],
        &[],
        Err("`command` is empty"),
    );
}
