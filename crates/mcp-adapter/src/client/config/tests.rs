//! Tests of the upstream configuration: its parsing, interpolation and validation.

use super::*;

/// A header value with a line break is refused saying so, and where it came from,
/// without quoting it (QA-13 C-13: http's "failed to parse header value").
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
/// `inherit_env` matches, nothing else (QA-13 C-2).
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

#[test]
fn durations_parse() {
    assert!(
        parse_duration("0s", false)
            .unwrap_err()
            .contains("more than 0")
    );
    assert!(
        parse_duration("99999999999999999h", false)
            .unwrap_err()
            .contains("longer than a year")
    );
    assert_eq!(parse_duration("8760h", false).unwrap(), MAX_DURATION);
    assert_eq!(
        parse_duration("30s", false).unwrap(),
        Duration::from_secs(30)
    );
    assert_eq!(
        parse_duration("250ms", false).unwrap(),
        Duration::from_millis(250)
    );
    assert_eq!(
        parse_duration("2m", false).unwrap(),
        Duration::from_secs(120)
    );
    assert_eq!(
        parse_duration("2.5s", false).unwrap(),
        Duration::from_millis(2500)
    );
    assert!(parse_duration("fast", false).is_err());
    // Positive but under 1 ms: said so (it was "must be more than 0").
    for tiny in ["0.0001ms", "0.0000001", "0.000000000001"] {
        let e = parse_duration(tiny, false).unwrap_err();
        assert!(e.contains("is shorter than 1 ms"), "{tiny}: {e}");
    }
    assert_eq!(
        parse_duration("1ms", false).unwrap(),
        Duration::from_millis(1)
    );
    // A float is quoted back short, whatever its size.
    for (secs, shown) in [(1e300, "\"1e300\""), (1e-12, "\"1e-12\"")] {
        let Raw::Secs(v, written) = serde::de::Visitor::visit_f64::<serde::de::value::Error>(
            RawDuration { off: false },
            secs,
        )
        .unwrap() else {
            panic!()
        };
        let e = seconds(v, &written, false).unwrap_err();
        assert!(e.contains(shown), "{e}");
        assert!(!e.contains("more than 0"), "{e}");
    }
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

#[test]
fn urls_are_shown_without_user_password_or_query() {
    assert_eq!(
        redact_urls(
            "error sending request for url (http://me:pw@example.com:8/mcp?api_key=sekrit#x): refused"
        ),
        "error sending request for url (http://…@example.com:8/mcp?…): refused"
    );
    assert_eq!(
        redact_urls("to https://h/mcp, then http://[::1]:9/p#frag and back"),
        "to https://h/mcp, then http://[::1]:9/p?… and back"
    );
    assert_eq!(redact_urls("no url here"), "no url here");
    assert_eq!(
        redact_urls("http://é.example/ü?ß=1"),
        "http://é.example/ü?…"
    );
    // A query or password with `,` or `)`; an upper-case scheme.
    assert_eq!(
        redact_urls("url (https://h/search?fields=a,b&api_key=SEKRIT): refused"),
        "url (https://h/search?…): refused"
    );
    assert_eq!(
        redact_urls("to https://user:pa,s)s@host/mcp now"),
        "to https://…@host/mcp now"
    );
    assert_eq!(
        redact_urls("HTTP://u:pw@example.com/mcp?key=S"),
        "HTTP://…@example.com/mcp?…"
    );
    // A value without a scheme (a typo in the config).
    assert_eq!(
        redact_one("mcp.example.com/sse?key=S"),
        "mcp.example.com/sse?…"
    );
    assert_eq!(redact_urls("https://"), "https://");
    // A key in the path, as hosted servers put it.
    assert_eq!(
        redact_urls("url (https://mcp.example.com/api/s/a1b2c3d4e5f6g7h8i9j0k1/sse): refused"),
        "url (https://mcp.example.com/api/s/…/sse): refused"
    );
    assert_eq!(
        redact_urls("https://h/mcp/tools_for_everyone_here"),
        "https://h/mcp/tools_for_everyone_here"
    );
}
