//! Tests of the upstream configuration: its parsing, interpolation and validation.

use super::*;

/// A header value with a line break is refused saying so, and where it came from,
/// without quoting it (not in http's words, "failed to parse header value").
#[test]
fn a_header_value_with_a_control_character_is_named() {
    let crlf = ServerConfig::http("h", "https://a.example/mcp").with_header("X-Key", "${env:K}");
    let err = validate_all(&[crlf], &|_| Some("abc\r\nEvil: 1".to_owned()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("header \"X-Key\": the value contains the control character '\\r' (its value comes from `${env:K}`)"),
        "{err}"
    );
    assert!(!err.contains("Evil"), "{err}");
    // The same for the token from MCP_<NAME>_TOKEN, which was retried forever.
    let token = ServerConfig::http("h", "https://a.example/mcp");
    let err = validate_all(&[token], &|k| {
        (k == "MCP_H_TOKEN").then(|| "tok\r\nEvil: 1".to_owned())
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("the token in MCP_H_TOKEN contains the control character '\\r'"),
        "{err}"
    );
    assert!(!err.contains("Evil"), "{err}");
}

/// A stdio server gets the allowed part of Quiver's environment and the names its
/// `inherit_env` matches, nothing else.
#[test]
fn a_child_inherits_only_the_allowed_environment() {
    let names = |inherit: &[String]| -> Vec<String> {
        inherited_env(inherit)
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    };
    // Cargo sets these for every test process.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let plain = names(&[]);
    assert!(plain.iter().any(|n| n == "PATH"), "{plain:?}");
    assert!(!plain.iter().any(|n| n.starts_with("CARGO")), "{plain:?}");
    let more = names(&["CARGO_MANIFEST_*".to_owned()]);
    assert!(more.iter().any(|n| n == "CARGO_MANIFEST_DIR"), "{more:?}");
    assert!(!more.iter().any(|n| n == "CARGO_PKG_NAME"), "{more:?}");
    let spaced = ServerConfig::stdio("a", "x", vec![]).with_inherit_env(["a b"]);
    assert!(validate_all(&[spaced], &|_| None).is_err());
    let bad = ServerConfig::stdio("a", "x", vec![]).with_inherit_env(["A=B"]);
    let err = validate_all(&[bad], &|_| None).unwrap_err().to_string();
    assert!(
        err.contains("inherit_env: `A=B` is not an environment variable name"),
        "{err}"
    );
}

/// What a config file's durations read as, and what a wrong one is told: `off` offered
/// only where it is taken, fractions of seconds taken, no serde type names.
#[test]
fn configured_durations_say_what_they_take() {
    let server = |key: &str, value: serde_json::Value| {
        serde_json::from_value::<ServerConfig>(
            serde_json::json!({"name": "s", "command": "x", key: value}),
        )
    };
    let ok = |key: &str, value: serde_json::Value| server(key, value).unwrap();
    assert_eq!(
        ok("call_timeout", serde_json::json!(2.5)).call_timeout,
        Some(Duration::from_millis(2500))
    );
    assert_eq!(
        ok("connect_timeout", serde_json::json!(3)).connect_timeout,
        Some(Duration::from_secs(3))
    );
    assert_eq!(
        ok("liveness", serde_json::json!(0.5)).liveness,
        Some(Liveness::Every(Duration::from_millis(500)))
    );
    assert_eq!(
        ok("liveness", serde_json::json!("off")).liveness,
        Some(Liveness::Off)
    );
    let err = |key: &str, value: serde_json::Value| server(key, value).unwrap_err().to_string();
    let off = err("call_timeout", serde_json::json!("off"));
    assert!(
        off.contains("invalid duration \"off\"") && !off.contains("`off`"),
        "{off}"
    );
    let negative = err("call_timeout", serde_json::json!(-5));
    assert!(
        negative.contains("must be a positive number of seconds"),
        "{negative}"
    );
    let wrong = err("connect_timeout", serde_json::json!(true));
    assert!(
        wrong.contains("a duration: seconds (30, 2.5) or a string such as")
            && !wrong.contains("variant"),
        "{wrong}"
    );
    let zero = err("liveness", serde_json::json!(0));
    assert!(zero.contains("to turn it off, write \"off\""), "{zero}");
}

#[test]
fn interpolation() {
    let env = |k: &str| (k == "A").then(|| "x".to_owned());
    assert_eq!(
        interpolate("s", "v", "a${env:A}b${env:A}", &env).unwrap(),
        "axbx"
    );
    assert!(
        interpolate("s", "v", "${env:B}", &env)
            .unwrap_err()
            .to_string()
            .contains("B is not set")
    );
}

/// `scope = "session"` and the keys only it takes: what cannot be per session is refused
/// saying why, an unknown scope names the two there are, and the defaults apply.
#[test]
fn a_per_session_server_is_checked_for_what_it_cannot_be() {
    let refused = |s: ServerConfig| validate_all(&[s], &|_| None).unwrap_err().to_string();
    let fs = || ServerConfig::stdio("fs", "mcp-server-filesystem", vec![]);
    let ok = validate_all(&[fs().per_session()], &|_| None).expect("a stdio server may be");
    assert_eq!(ok[0].scope, ServerScope::Session);
    assert_eq!(ok[0].idle_timeout, SESSION_IDLE_TIMEOUT);
    assert_eq!(ok[0].max_per_principal, SESSION_MAX_PER_PRINCIPAL);
    let http = refused(ServerConfig::http("web", "https://a.example/mcp").per_session());
    assert!(
        http.contains("`scope = \"session\"` cannot apply: it is an http server")
            && http.contains("remove `scope` to share it"),
        "{http}"
    );
    let required = refused(fs().per_session().required());
    assert!(
        required.contains("`required = true` makes start-up wait"),
        "{required}"
    );
    let mut bare = fs().per_session();
    bare.bare_prompts = true;
    assert!(refused(bare).contains("`bare_prompts = true` has nothing to serve"));
    let mut zero = fs().per_session();
    zero.max_per_principal = Some(0);
    assert!(refused(zero).contains("`max_per_principal = 0` would refuse every session"));
    for key in ["idle_timeout", "max_per_principal"] {
        let value = if key == "idle_timeout" {
            serde_json::json!("5m")
        } else {
            serde_json::json!(2)
        };
        let shared: ServerConfig =
            serde_json::from_value(serde_json::json!({"name": "fs", "command": "x", key: value}))
                .expect("it parses");
        let err = refused(shared);
        assert!(
            err.contains(&format!(
                "`{key}` applies to per-session servers only; add `scope = \"session\"`"
            )),
            "{err}"
        );
    }
    let unknown = serde_json::from_value::<ServerConfig>(
        serde_json::json!({"name": "fs", "command": "x", "scope": "process"}),
    )
    .unwrap_err()
    .to_string();
    assert!(
        unknown.contains("unknown variant `process`, expected `shared` or `session`"),
        "{unknown}"
    );
    let set: ServerConfig = serde_json::from_value(serde_json::json!({
        "name": "fs", "command": "x", "scope": "session",
        "idle_timeout": "90s", "max_per_principal": 3,
    }))
    .expect("it parses");
    let set = validate_all(&[set], &|_| None).expect("valid");
    assert_eq!(set[0].idle_timeout, Duration::from_secs(90));
    assert_eq!(set[0].max_per_principal, 3);
}

/// Whose credentials a server's calls carry: every configuration that could send a user's
/// token where it does not belong is refused, naming the server and the key.
#[test]
fn a_users_token_goes_only_where_its_audience_allows() {
    let check = |s: ServerConfig, resource: Option<&str>, exchange_client: bool| {
        validate_all(&[s], &|_| None)
            .and_then(|r| check_delegation(&r, resource, exchange_client).map(|()| r))
            .map_err(|e| e.to_string())
    };
    let quiver = Some("https://quiver.example.com/mcp");
    let http = |auth, audience: Option<&str>| {
        ServerConfig::http("up", "https://tools.example.com/mcp")
            .with_auth(auth, audience.map(str::to_owned))
    };
    type Checked = Result<Vec<ResolvedServer>, String>;
    let cases: Vec<(&str, Checked, &str)> = vec![
        (
            "passthrough of Quiver's audience",
            check(http(UpstreamAuth::Passthrough, quiver), quiver, false),
            "",
        ),
        (
            "passthrough to another audience",
            check(
                http(
                    UpstreamAuth::Passthrough,
                    Some("https://tools.example.com/mcp"),
                ),
                quiver,
                false,
            ),
            "MCP server \"up\": `auth = \"passthrough\"` with `audience = \"https://tools.example.com/mcp\"`, which is not Quiver's own audience",
        ),
        (
            "passthrough without an audience",
            check(http(UpstreamAuth::Passthrough, None), quiver, false),
            "MCP server \"up\": `auth = \"passthrough\"` needs `audience`",
        ),
        (
            "passthrough without [auth.oidc]",
            check(http(UpstreamAuth::Passthrough, quiver), None, false),
            "MCP server \"up\": `auth = \"passthrough\"` acts for the user, but there is no `[auth.oidc]`",
        ),
        (
            "exchange without Quiver's client",
            check(http(UpstreamAuth::Exchange, None), quiver, false),
            "`auth = \"exchange\"` needs Quiver's own client at the issuer",
        ),
        (
            "exchange for the server's url",
            check(http(UpstreamAuth::Exchange, None), quiver, true),
            "",
        ),
        (
            "passthrough to a stdio server",
            check(
                ServerConfig::stdio("up", "server", vec![])
                    .with_auth(UpstreamAuth::Passthrough, quiver.map(str::to_owned)),
                quiver,
                false,
            ),
            "MCP server \"up\": `auth = \"passthrough\"` applies to http servers only",
        ),
        (
            "exchange over cleartext http",
            check(
                ServerConfig::http("up", "http://tools.example.com/mcp")
                    .with_auth(UpstreamAuth::Exchange, None)
                    .insecure_http(),
                quiver,
                true,
            ),
            "would send users' access tokens in cleartext",
        ),
        (
            "an audience on a static server",
            check(http(UpstreamAuth::Static, quiver), quiver, false),
            "`audience` applies only to a server that acts for the user",
        ),
        (
            "an audience that is not a URL",
            check(http(UpstreamAuth::Exchange, Some("tools")), quiver, true),
            "`audience = \"tools\"` is not an absolute URL",
        ),
    ];
    for (what, got, expected) in cases {
        match got {
            Ok(r) => {
                assert!(expected.is_empty(), "{what}: accepted");
                assert!(
                    !r[0].resources && !r[0].prompts,
                    "{what}: a server acting for the user serves tools only"
                );
                assert_eq!(
                    r[0].audience.as_deref(),
                    Some(match r[0].auth {
                        UpstreamAuth::Exchange => "https://tools.example.com/mcp",
                        _ => "https://quiver.example.com/mcp",
                    }),
                    "{what}"
                );
            }
            Err(e) => assert!(!expected.is_empty() && e.contains(expected), "{what}: {e}"),
        }
    }
}
