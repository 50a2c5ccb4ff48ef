//! The configuration's tests: reading, `${env:...}`, validation and the errors each bad
//! value gets. Over 800 lines: test cases only, one per rule.

use super::*;

fn env(k: &str) -> Option<String> {
    match k {
        "HOME_DIR" => Some("/srv/q".to_owned()),
        "EMPTY" => Some(String::new()),
        "TRICKY" => Some("a${env:NOPE".to_owned()),
        "DB_PASSWORD" => Some("s3cret-pw".to_owned()),
        _ => None,
    }
}

#[test]
fn surface_settings_are_checked_with_the_file_named() {
    check(
        "[surface]\nfloor_min = 40\nfloor_max = 10\n",
        Err("quiver.toml: [surface]"),
    );
    let err = Config::parse(
        "[surface]\nfloor_min = 40\nfloor_max = 10\n",
        "q.toml",
        &env,
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("floor_min (40) is above floor_max (10)"),
        "{err:#}"
    );
}

#[test]
fn every_tool_pattern_is_listed_with_its_key() {
    let text = r#"
[limits.tool_timeouts]
slow_tool = 60
[limits.tool_concurrency]
"mcp__db__*" = 2
[[policy.rules]]
id = "r1"
tool = "*export*"
action = "deny"
message = "no"
requires_prior = "tool_search"
[surface]
anchors = ["a"]
agentic_allow = ["mcp__fs__*"]
[[auth.tokens]]
name = "ci"
token = "secret"
allowed_tools = ["t1", "t2"]
"#;
    let config = Config::parse(text, "quiver.toml", &env).unwrap();
    let got = config.tool_patterns();
    let got: Vec<(&str, &str, bool)> = got
        .iter()
        .map(|r| (r.key.as_str(), r.name, r.exact))
        .collect();
    assert_eq!(
        got,
        [
            ("limits.tool_timeouts", "slow_tool", true),
            ("limits.tool_concurrency", "mcp__db__*", true),
            ("policy.rules[r1].tool", "*export*", false),
            ("policy.rules[r1].requires_prior", "tool_search", false),
            ("surface.anchors", "a", true),
            ("surface.agentic_allow", "mcp__fs__*", false),
            ("auth.tokens[ci].allowed_tools", "t1", false),
            ("auth.tokens[ci].allowed_tools", "t2", false),
        ]
    );
    let exact = &config.tool_patterns()[1];
    assert!(
        !exact.matches("mcp__db__query"),
        "exact key: `*` is literal"
    );
    assert!(config.tool_patterns()[2].matches("csv_export_all"));
}

fn check(text: &str, expect: Result<&str, &str>) {
    match (Config::parse(text, "quiver.toml", &env), expect) {
        (Ok(c), Ok(want)) => assert_eq!(format!("{}", c.store.path.display()), want),
        (Err(e), Err(fragment)) => {
            let msg = format!("{e:#}");
            assert!(msg.contains(fragment), "`{msg}` lacks `{fragment}`");
        }
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

/// An MCP server's `env` and `headers` are interpolated once, when the server is set up:
/// a variable whose value holds `${env:` is taken as it is (a second pass failed on it).
#[test]
fn server_env_and_headers_are_interpolated_once() {
    let text = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\nenv = { OPT = \"${env:TRICKY}\", HOME = \"${env:HOME_DIR}\" }\n\n[[mcp.servers]]\nname = \"b\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { X-Key = \"${env:TRICKY}\" }\n";
    let config = Config::parse(text, "quiver.toml", &env).unwrap();
    let servers = config.mcp.clone().finalize(&env);
    assert!(servers.is_ok(), "{:?}", servers.err());
    // A variable that is not set is still an error, naming the server and the key.
    let missing = text.replace("${env:TRICKY}", "${env:NOPE}");
    let config = Config::parse(&missing, "quiver.toml", &env).unwrap();
    let err = config.mcp.clone().finalize(&env).unwrap_err().to_string();
    assert!(err.contains("NOPE is not set"), "{err}");
}

/// The inbound tokens are checked with the rest of the config, not only by `serve`: a
/// `quiver check` that passes means `serve` starts.
#[test]
fn inbound_tokens_are_checked_with_the_file_named() {
    let token = |name: &str, secret: &str| {
        format!("[[auth.tokens]]\nname = \"{name}\"\ntoken = \"{secret}\"\n")
    };
    check(
        &token("a:b", "s"),
        Err(
            "quiver.toml: [[auth.tokens]]: invalid inbound auth: tokens[0]: the name `a:b` may not contain `:`",
        ),
    );
    check(
        &token("ci", ""),
        Err(
            "quiver.toml: [[auth.tokens]]: invalid inbound auth: tokens[0] (`ci`) has an empty `token`",
        ),
    );
    check(
        &format!("{}{}", token("ci", "1"), token("ci", "2")),
        Err("tokens[1]: the name `ci` is already used by tokens[0]"),
    );
    check(
        &format!("{}{}", token("ci", "1"), token("bot", "2")),
        Ok("./quiver.db"),
    );
}

/// Two rules with one id, or a rule with nothing to tell the model, are errors naming
/// the rule.
#[test]
fn policy_rules_need_their_own_id_and_a_message() {
    let rule = |id: &str, tool: &str, message: &str| {
        format!(
            "[[policy.rules]]\nid = \"{id}\"\ntool = \"{tool}\"\naction = \"deny\"\nmessage = \"{message}\"\n"
        )
    };
    check(
        &format!("{}{}", rule("r", "a", "no"), rule("r", "b", "no")),
        Err(
            "quiver.toml: [[policy.rules]]: policy.rules[1] (id \"r\"): the id is already used by policy.rules[0]",
        ),
    );
    check(
        &rule("quiet", "a", "  "),
        Err(
            "policy.rules[0] (id \"quiet\"): `message` is empty: say what the model should do instead",
        ),
    );
    check(&rule("", "a", "no"), Err("policy.rules[0]: `id` is empty"));
    check(
        &rule("r", "", "no"),
        Err("policy.rules[0] (id \"r\"): `tool` is empty"),
    );
    check(
        &format!("{}{}", rule("r1", "a", "no"), rule("r2", "a", "no")),
        Ok("./quiver.db"),
    );
    // A principal or tenant no token has: the rule would never apply.
    let tokens = "[[auth.tokens]]\nname = \"ci-bot\"\ntoken = \"s\"\ntenant = \"acme\"\n";
    check(
        &format!("{tokens}{}principal = \"ci_bot\"\n", rule("r", "a", "no")),
        Err(
            "policy.rules[0] (id \"r\"): `principal = \"ci_bot\"` names no [[auth.tokens]] entry, so the rule would never apply; use a token's `name`; did you mean `ci-bot`?",
        ),
    );
    check(
        &format!("{tokens}{}tenant = \"acme2\"\n", rule("r", "a", "no")),
        Err("`tenant = \"acme2\"` is the tenant of no [[auth.tokens]] entry"),
    );
    check(
        &format!(
            "{tokens}{}principal = \"ci-bot\"\ntenant = \"acme\"\n",
            rule("r", "a", "no")
        ),
        Ok("./quiver.db"),
    );
}

#[test]
fn config_cases() {
    check("", Ok("./quiver.db"));
    // `${` in a key is refused, as in a value (a child would get an environment
    // variable literally named `${X}`), also in a server's `env` and `headers`.
    check(
        "[limits]\ntool_timeouts = { \"${env:NOPE}\" = 5 }",
        Err("limits.tool_timeouts.${env:NOPE}: a key cannot hold `${...}`"),
    );
    check(
        "[[mcp.servers]]\nname = \"x\"\ncommand = \"x\"\nenv = { \"A${env:HOME_DIR}\" = \"2\" }",
        Err("mcp.servers[0].env.A${env:HOME_DIR}: a key cannot hold `${...}`"),
    );
    check(
        "[store]\npath = \"${env:HOME_DIR}/quiver.db\"",
        Ok("/srv/q/quiver.db"),
    );
    check(
        "[store]\npath = \"${env:NOPE}\"",
        Err("store.path: environment variable NOPE is not set"),
    );
    check(
        "[store]\npath = \"${env:EMPTY}/q.db\"",
        Err("store.path: environment variable EMPTY is set but empty"),
    );
    check(
        "[limits]\ntimout_secs = 3",
        Err("did you mean `timeout_secs`?"),
    );
    check("[limits]\ntimout_secs = 3", Err("quiver.toml"));
    check("[stor]\npath = \"x\"", Err("did you mean `store`?"));
    check(
        "[store]\npath = \"${env:}/q.db\"",
        Err("store.path: `${env:}` does not name an environment variable"),
    );
    check(
        "[store]\npath = \"${env:MY VAR}/q.db\"",
        Err("store.path: `${env:MY VAR}` does not name an environment variable"),
    );
    // Any other `${...}` is refused, not kept as text (a token written
    // `${QUIVER_CI_TOKEN}` would be that guessable text, and the real secret get 401).
    check(
        "[store]\npath = \"${HOME_DIR}/q.db\"",
        Err(
            "store.path: `${HOME_DIR}` is not something Quiver fills in: it reads environment variables only as `${env:NAME}`: write `${env:HOME_DIR}`",
        ),
    );
    check(
        "[store]\npath = \"${ENV:HOME_DIR}/q.db\"",
        Err("(`env` in lower case): write `${env:HOME_DIR}`"),
    );
    check(
        "[store]\npath = \"${workspaceFolder}/q.db\"",
        Err("`${workspaceFolder}` is not something Quiver fills in"),
    );
    check(
        "[store]\npath = \"${input:key}/q.db\"",
        Err("are filled in by VS Code, not here"),
    );
    check(
        "[store]\npath = \"x${\"",
        Err("`${…` is not something Quiver fills in"),
    );
    check(
        "[store]\npath = \"$${HOME}/$${env:X}\"",
        Ok("${HOME}/${env:X}"),
    );
    // Shell-style defaults are not read as a name (`A:-b` was "not set").
    check(
        "[store]\npath = \"${env:HOME_DIR:-/tmp}\"",
        Err(
            "Quiver has no default values in `${env:...}`; write `${env:HOME_DIR}` and set HOME_DIR",
        ),
    );
    check(
        "[store]\npath = \"${HOME_DIR:-/tmp}\"",
        Err("with no default values: write `${env:HOME_DIR}` and set HOME_DIR"),
    );
    check(
        "[store]\npath = \"$$${env:HOME_DIR}\"",
        Ok("$${env:HOME_DIR}"),
    );
    check(
        "[store]\npath = \"\"",
        Err("[store] path is empty: give the SQLite file"),
    );
    check(
        "[store]\npath = \"${env:EMPTY}\"",
        Err("store.path: environment variable EMPTY is set but empty"),
    );
    check(
        "[limits]\ntimeout_secs = -1",
        Err("must be a positive number of seconds"),
    );
    check(
        "[limits]\ninput_wait_secs = 0",
        Err("limits.input_wait_secs must be a positive number of seconds"),
    );
    check("[limits]\ninput_wait_secs = 120", Ok("./quiver.db"));
    check(
        "[limits]\nmax_http_sessions = 0",
        Err("limits.max_http_sessions must be more than 0 (the HTTP sessions open at once)"),
    );
    // Limits too large to be a deadline or a semaphore are refused, not a panic.
    for (text, shown) in [
        ("[limits]\ntimeout_secs = 1e20", "not 1e20"),
        ("[limits]\ninput_wait_secs = 1.8e19", "not 1.8e19"),
        ("[limits.tool_timeouts]\nx = 1e300", "(a year), not 1e300"),
    ] {
        check(text, Err("must be at most 31536000 seconds (a year)"));
        // Quoted back as written, not as its hundreds of digits.
        check(text, Err(shown));
    }
    check(
        "[limits]\nmax_concurrent = 4000000000000000000",
        Err("limits.max_concurrent must be at most 1000000"),
    );
    // A count given a fraction, an exponent or a negative number says what it takes,
    // and a huge float is quoted short (it was its 301 digits).
    for (text, shown, hint) in [
        (
            "[limits]\nmax_concurrent = 1e300",
            "floating point `1e300`, expected a whole number",
            "takes a whole number: write it without a decimal point or exponent",
        ),
        (
            "[limits]\nmax_concurrent = 2.5",
            "floating point `2.5`, expected a whole number",
            "takes a whole number: write it without a decimal point or exponent",
        ),
        (
            "[surface]\ntarget_floor = -3",
            "integer `-3`, expected a whole number",
            "takes a whole number, not a negative one",
        ),
        (
            "[limits]\nmax_concurrent = 0.0",
            "floating point `0.0`, expected a whole number",
            "takes a whole number: write it without a decimal point",
        ),
        (
            "[store]\nretention_days = 99999999999",
            "integer `99999999999`, expected a whole number",
            "this setting takes a whole number of at most 4294967295",
        ),
        (
            "[surface]\ntarget_floor = 18446744073709551615",
            "u64 value was too large",
            "a TOML integer is at most 9223372036854775807",
        ),
        (
            "[limits]\nmax_concurrent = \"4\"",
            "invalid type: string \"4\", expected a whole number",
            "this setting takes a number, written without quotes",
        ),
    ] {
        check(text, Err(shown));
        check(text, Err(hint));
        check(text, Err("line 2"));
    }
    check(
        "[limits]\ntimeout_secs = \"5\"",
        Err(
            "invalid type: string \"5\", expected a number\nthis setting takes a number, written without quotes",
        ),
    );
    // A number from a variable: the interpolated text is still text.
    check(
        "[limits]\nmax_concurrent = \"${env:HOME_DIR}\"",
        Err("a `${env:...}` value is text, so a number setting cannot come from one"),
    );
    check(
        "[limits.tool_concurrency]\nx = 4000000000000000000",
        Err("limits.tool_concurrency.x must be at most 1000000"),
    );
    check("[limits]\ntimeout_secs = 31536000", Ok("./quiver.db"));
    // Type errors name TOML's terms, never a Rust type.
    for (text, want) in [
        (
            "[limits]\nmax_concurrent = true",
            "invalid type: boolean `true`, expected a whole number",
        ),
        (
            "[limits]\ntimeout_secs = [1]",
            "invalid type: array, expected a number",
        ),
        (
            "[limits]\ntool_timeouts = [1]",
            "invalid type: array, expected a table",
        ),
        ("[surface]\nanchors = \"x\"", "expected an array"),
    ] {
        check(text, Err(want));
        let e = Config::parse(text, "quiver.toml", &env).unwrap_err();
        let msg = format!("{e:#}");
        for rust in ["usize", "u32", "u64", "f64", "sequence", "map"] {
            assert!(!msg.contains(rust), "`{msg}` names `{rust}`");
        }
    }
    // A zero or too-small count is an error naming the key, or (where 0 means off) off,
    // never silently the strictest setting.
    for (text, err) in [
        (
            "[limits]\nmax_concurrent = 0",
            "limits.max_concurrent must be at least 1",
        ),
        (
            "[limits.tool_concurrency]\nx = 0",
            "limits.tool_concurrency.x must be at least 1",
        ),
        (
            "[limits]\nloop_guard = 1",
            "limits.loop_guard must be 0 (off) or at least 2",
        ),
        (
            "[limits]\nmax_input_bytes = 0",
            "limits.max_input_bytes must be more than 0",
        ),
        (
            "[limits]\nmax_result_chars = 0",
            "limits.max_result_chars must be more than 0",
        ),
        (
            "[limits]\nmax_input_bytes = 20000000",
            "limits.max_input_bytes must be at most 4194304",
        ),
        (
            "[limits]\ntimeout_secs = 1e-12",
            "limits.timeout_secs must be at least 0.001 seconds (1 ms; every call would time out before it starts), not 1e-12",
        ),
    ] {
        check(text, Err(err));
    }
    let limits = |text: &str| {
        Config::parse(text, "quiver.toml", &env)
            .unwrap()
            .limits
            .dispatch_config()
            .unwrap()
    };
    assert_eq!(
        limits("[limits]\nloop_guard = 0").loop_guard_threshold,
        u32::MAX
    );
    assert_eq!(limits("[limits]\nloop_guard = 2").loop_guard_threshold, 2);
    assert_eq!(
        limits("[limits]\nrepeat_failure = 0").repeat_failure_threshold,
        u32::MAX
    );
    check("[store]\nretention_days = 30", Ok("./quiver.db"));
    check(
        "[store]\nretention_days = 0",
        Err("quiver.toml: [store] retention_days = 0 would delete the whole execution log"),
    );
    check(
        "[store]\nretention_days = 0",
        Err("or remove the key to keep everything"),
    );
    check("[store]\nretention_days = -3", Err("retention_days"));
    // Both stores named: which one is used is not left to guess.
    check(
        "[store]\npath = \"a.db\"\nurl = \"postgres://u@h/d\"",
        Err("quiver.toml: [store] sets both `path` (a SQLite file) and `url`"),
    );
    // `~` is no directory Quiver could create or find.
    check(
        "[store]\npath = \"~/q.db\"",
        Err("`~` is not expanded in a path; write the full path, or \"${env:HOME}/q.db\""),
    );
    check("[store]\nlog_linger_ms = 0", Ok("./quiver.db"));
    check("[store]\nlog_linger_ms = \"soon\"", Err("log_linger_ms"));
    check("[store]\nlog_linger_ms = 1000", Ok("./quiver.db"));
    check(
        "[store]\nlog_linger_ms = 15000",
        Err("quiver.toml: [store] log_linger_ms = 15000 is longer than 1000 ms"),
    );
    check("[store]\nbusy_timeout_ms = -5", Err("busy_timeout_ms"));
    let durability = |toml: &str| {
        Config::parse(toml, "quiver.toml", &env)
            .expect("valid")
            .store
            .durability
    };
    assert_eq!(durability(""), Durability::Batched);
    assert_eq!(
        durability("[store]\ndurability = \"strict\""),
        Durability::Strict
    );
    assert_eq!(
        durability("[store]\ndurability = \"batched\""),
        Durability::Batched
    );
    check(
        "[store]\ndurability = \"sync\"",
        Err("unknown variant `sync`, expected `batched` or `strict`"),
    );
    // More than SQLite takes is refused here (`serve` and `call` panicked on it).
    check(
        "[store]\nbusy_timeout_ms = 2147483648",
        Err(
            "quiver.toml: [store] busy_timeout_ms = 2147483648 is longer than SQLite waits on a lock (at most 2147483647 ms",
        ),
    );
    check("[store]\nbusy_timeout_ms = 2147483647", Ok("./quiver.db"));
    // Past u32 too: the same message (it was told the type's bound, 4294967295).
    check(
        "[store]\nbusy_timeout_ms = 4294967296",
        Err(
            "busy_timeout_ms = 4294967296 is longer than SQLite waits on a lock (at most 2147483647 ms",
        ),
    );
    let busy = |text: &str| {
        Config::parse(text, "quiver.toml", &env)
            .unwrap()
            .store
            .busy_timeout_ms
    };
    assert_eq!(busy(""), 5000);
    assert_eq!(busy("[store]\nbusy_timeout_ms = 50"), 50);
    check("[store\n", Err("quiver.toml"));
    check(
        "[[policy.rules]]\nid = \"r\"\ntool = \"add\"\naction = \"deny\"\nmessage = \"no\"\n",
        Ok("./quiver.db"),
    );
    check(
        "[[policy.rules]]\nid = \"r\"\ntool = \"add\"\naction = \"block\"\nmessage = \"no\"\n",
        Err("unknown variant `block`"),
    );
    // An error away from any placeholder keeps its line, interpolation or not.
    check(
        "[store]\npath = \"${env:HOME_DIR}/q.db\"\nretention_days = -3",
        Err("line 3"),
    );
    // A closed-set word can come from the environment.
    let env_action = |k: &str| (k == "ACT").then(|| "deny".to_owned());
    let rule =
        "[[policy.rules]]\nid = \"r\"\ntool = \"add\"\naction = \"${env:ACT}\"\nmessage = \"no\"\n";
    let parsed = Config::parse(rule, "quiver.toml", &env_action).unwrap();
    assert_eq!(
        parsed.policy.rules[0].action,
        quiver_registry::PolicyAction::Deny
    );
    let wrong = |k: &str| (k == "ACT").then(|| "block".to_owned());
    let e = format!(
        "{:#}",
        Config::parse(rule, "quiver.toml", &wrong).unwrap_err()
    );
    assert!(e.contains("quiver.toml") && e.contains("block"), "{e}");
}

/// A relative path in a config file means the same from any working directory: it is
/// resolved against the file's directory. A bare command stays a `PATH` lookup, an absolute
/// path stays, and the default store file stays in the working directory.
#[test]
fn relative_paths_resolve_against_the_config_files_directory() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    let file = conf.join("quiver.toml");
    std::fs::write(
        &file,
        "[store]\npath = \"data/q.db\"\n\n[skills]\ndirs = [\"skills\", \"/abs/skills\"]\n\n\
         [[mcp.servers]]\nname = \"local\"\ncommand = \"./bin/server\"\ncwd = \"work\"\n\n\
         [[mcp.servers]]\nname = \"npm\"\ncommand = \"npx\"\n",
    )
    .unwrap();
    let (config, _) = Config::load(Some(&file)).unwrap();
    assert_eq!(config.store.path, conf.join("data/q.db"));
    assert_eq!(
        config.skills.dirs,
        vec![conf.join("skills"), PathBuf::from("/abs/skills")]
    );
    let local = &config.mcp.servers[0];
    assert_eq!(
        local.command.as_deref(),
        Some(conf.join("./bin/server").to_str().unwrap())
    );
    assert_eq!(local.cwd.as_deref(), Some(conf.join("work").as_path()));
    assert_eq!(config.mcp.servers[1].command.as_deref(), Some("npx"));

    std::fs::write(&file, "[limits]\n").unwrap();
    let (config, _) = Config::load(Some(&file)).unwrap();
    assert_eq!(config.store.path, PathBuf::from("./quiver.db"));

    let mcp = conf.join("mcp.json");
    std::fs::write(
        &mcp,
        r#"{"mcpServers": {"s": {"command": "tools/s.sh", "cwd": "."}}}"#,
    )
    .unwrap();
    let servers = crate::mcp_json::read_mcp_servers(&mcp).unwrap();
    assert_eq!(
        servers[0].command.as_deref(),
        Some(conf.join("tools/s.sh").to_str().unwrap())
    );
    assert_eq!(servers[0].cwd.as_deref(), Some(conf.join(".").as_path()));
}

/// `[store] url` takes `${env:...}`, must be a PostgreSQL URL, and its password is masked
/// wherever the configuration is shown.
#[test]
fn the_store_url_is_interpolated_checked_and_masked() {
    let config = Config::parse(
        "[store]\nurl = \"postgres://quiver:${env:DB_PASSWORD}@db:5432/quiver\"\n",
        "q.toml",
        &env,
    )
    .expect("a PostgreSQL URL");
    assert_eq!(
        config.store.url.as_deref(),
        Some("postgres://quiver:s3cret-pw@db:5432/quiver")
    );
    assert_eq!(config.store.shown(), "postgres://quiver:***@db:5432/quiver");
    let shown = format!("{config:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    let err = Config::parse(
        "[store]\nurl = \"mysql://root:s3cret-pw@db/quiver\"\n",
        "q.toml",
        &env,
    )
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("is not a PostgreSQL URL"), "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
    // A URL mistyped without `://` keeps its password masked too.
    let err = Config::parse(
        "[store]\nurl = \"postgres//quiver:s3cret-pw@db/quiver\"\n",
        "q.toml",
        &env,
    )
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("is not a PostgreSQL URL"), "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
}

/// A config using most sections, which the fuzz cases below cut and splice.
const SAMPLE: &str = r#"
[store]
path = "./quiver.db"
retention_days = 90

[surface]
anchors = ["tool_search", "describe_tool"]
target_floor = 30

[limits]
timeout_secs = 30
tool_timeouts = { "mcp__git__git_log" = 60 }

[[policy.rules]]
id = "preview-first"
tool = "mcp__db__export*"
action = "warn"
message = "call mcp__db__preview first"
requires_prior = "mcp__db__preview"

[[mcp.servers]]
name = "time"
command = "mcp-server-time"
args = ["--local-timezone", "${env:HOME_DIR}"]
progressive_tools = ["get_*"]

[[auth.tokens]]
name = "ci"
token = "${env:DB_PASSWORD}"
"#;

/// An `mcpServers` file the fuzz cases below cut and splice.
const SAMPLE_JSON: &str = r#"{"mcpServers": {
  "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"], "env": {"A": "${env:HOME_DIR}"}},
  "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"X": "y"}}
}}"#;

/// `text` with `cut` bytes from `at` replaced by `insert` (at char boundaries).
fn spliced(text: &str, at: usize, cut: usize, insert: &str) -> String {
    let floor = |i: usize| {
        let mut i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let start = floor(at);
    let end = floor(start + cut).max(start);
    format!("{}{insert}{}", &text[..start], &text[end..])
}

fn fragment() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        Just(String::new()),
        "\\PC{0,16}",
        proptest::sample::select(vec![
            "=",
            "[",
            "]",
            "[[",
            "]]",
            "\"",
            "'",
            "{",
            "}",
            ",",
            "\n",
            "#",
            "${env:",
            "${env:NOPE}",
            "$${",
            "1e400",
            "-1",
            "true",
            "[1, \"a\"]",
            "{ a = 1 }",
            "\u{0}",
            "\u{2028}",
            "[[mcp.servers]]\n",
            "name = \"\"",
            "transport = \"sse\"",
            "\"\"\"",
        ])
        .prop_map(str::to_owned),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
    ))]

    /// A config file cut and spliced anywhere parses or is refused with a message that
    /// names the file; it never panics.
    #[test]
    fn any_spliced_config_parses_or_is_refused_naming_the_file(
        at in 0..SAMPLE.len(), cut in 0usize..40, insert in fragment()
    ) {
        let text = spliced(SAMPLE, at, cut, &insert);
        if let Err(e) = Config::parse(&text, "quiver.toml", &env) {
            let said = format!("{e:#}");
            proptest::prop_assert!(said.starts_with("quiver.toml"), "{said}");
        }
    }

    /// The same for an `mcpServers` file.
    #[test]
    fn any_spliced_mcp_servers_file_parses_or_is_refused_naming_the_file(
        at in 0..SAMPLE_JSON.len(), cut in 0usize..40, insert in fragment()
    ) {
        let text = spliced(SAMPLE_JSON, at, cut, &insert);
        if let Err(e) = crate::parse_mcp_servers(&text, "mcp.json", &env) {
            let said = format!("{e:#}");
            proptest::prop_assert!(said.contains("mcp.json"), "{said}");
        }
    }
}

/// `[auth.oidc]`: its URLs, introspection's client and its rules are checked with the file,
/// and policy rules may name the tenants its rules give.
#[test]
fn oidc_cases() {
    let oidc = "[auth.oidc]\nissuer = \"https://idp.example.com\"\nresource = \"https://q.example.com/mcp\"\n";
    check(oidc, Ok("./quiver.db"));
    check(
        &oidc.replace("https://idp.example.com", "idp.example.com"),
        Err("`issuer = \"idp.example.com\"` is not an absolute URL"),
    );
    check(
        &oidc.replace("https://idp.example.com", "http://idp.example.com"),
        Err("must be an https URL (plain http is accepted only for localhost)"),
    );
    check(
        &format!("{oidc}introspection_client_id = \"quiver\"\n"),
        Err("introspection needs both `introspection_client_id` and `introspection_client_secret`"),
    );
    check(
        &format!("{oidc}audience = \"x\"\n"),
        Err("unknown field `audience`, expected one of `issuer`, `resource`"),
    );
    check(
        &format!("{oidc}\n[[auth.oidc.rules]]\nclaim = \"groups\"\n"),
        Err("oidc.rules[0] has one of `claim` and `value` without the other"),
    );
    let rules = format!(
        "{oidc}\n[[auth.oidc.rules]]\nclaim = \"groups\"\nvalue = \"ops\"\ntenant = \"acme\"\nallowed_tools = [\"tool_*\"]\n"
    );
    check(
        &format!(
            "{rules}\n[[policy.rules]]\nid = \"r\"\ntool = \"x\"\naction = \"deny\"\nmessage = \"no\"\ntenant = \"acme\"\n"
        ),
        Ok("./quiver.db"),
    );
    check(
        &format!(
            "{rules}\n[[policy.rules]]\nid = \"r\"\ntool = \"x\"\naction = \"deny\"\nmessage = \"no\"\ntenant = \"acne\"\n"
        ),
        Err("`tenant = \"acne\"` is the tenant of no [[auth.tokens]] entry"),
    );
    // A policy rule may name a user (`sub`, or `email (sub)`), which no file lists.
    check(
        &format!(
            "{rules}\n[[policy.rules]]\nid = \"r\"\ntool = \"x\"\naction = \"deny\"\nmessage = \"no\"\nprincipal = \"alice@example.com (alice)\"\n"
        ),
        Ok("./quiver.db"),
    );
    let config = Config::parse(&rules, "quiver.toml", &env).unwrap();
    let auth = config.inbound_auth();
    assert_eq!(
        auth.oidc.unwrap().rules[0].denied_tools,
        [quiver_registry::custom::PROPOSE_TOOL]
    );
    assert!(
        config
            .tool_patterns()
            .iter()
            .any(|r| r.key == "auth.oidc.rules[0].allowed_tools" && r.name == "tool_*")
    );
}

#[test]
fn telemetry_settings_are_checked_with_what_to_write() {
    for (text, wants) in [
        (
            "[telemetry]\notlp_endpoint = \"localhost:4318\"\n",
            "is not an http(s) URL",
        ),
        (
            "[telemetry]\notlp_endpoint = \"http://c:4318\"\nprotocol = \"thrift\"\n",
            "write \"http/protobuf\"",
        ),
        (
            "[telemetry]\notlp_endpoint = \"https://c:4317\"\nprotocol = \"grpc\"\n",
            "gRPC without TLS only",
        ),
        (
            "[telemetry]\notlp_endpoint = \"http://c:4318\"\nsample_ratio = 1.5\n",
            "from 0.0 (none) to 1.0",
        ),
        (
            "[telemetry]\notlp_endpoint = \"http://c:4318\"\nheaders = { \"x key\" = \"v\" }\n",
            "is not a header name",
        ),
        (
            "[telemetry]\nendpoint = \"http://c:4318\"\n",
            "did you mean `otlp_endpoint`?",
        ),
    ] {
        let err = Config::parse(text, "q.toml", &env).unwrap_err();
        let said = format!("{err:#}");
        assert!(said.contains(wants), "{text}: {said}");
    }
    let config = Config::parse(
        "[telemetry]\notlp_endpoint = \"http://c:4318\"\nheaders = { x-api-key = \"${env:DB_PASSWORD}\" }\n",
        "q.toml",
        &env,
    )
    .unwrap();
    let export = config.telemetry.export().unwrap().unwrap();
    assert_eq!(export.traces_url(), "http://c:4318/v1/traces");
    assert_eq!(
        export.headers,
        vec![("x-api-key".to_owned(), "s3cret-pw".to_owned())]
    );
    assert!(
        !format!("{config:?}").contains("s3cret-pw"),
        "a header's value is masked where the config is shown"
    );
    let off = Config::parse("", "q.toml", &env).unwrap();
    assert!(off.telemetry.export().unwrap().is_none(), "off by default");
}

/// `[custom] job_stale_secs` sets the lease of a running job (heartbeat and look derived
/// from it), and `jobs` how many run at once; 0 and absurd values are refused naming the
/// key, the file and the range.
#[test]
fn the_job_stale_bound_is_checked_and_sets_the_lease() {
    use quiver_registry::custom::JobLease;
    let lease = |text: &str| {
        Config::parse(text, "q.toml", &env)
            .unwrap()
            .custom
            .lease()
            .unwrap()
    };
    assert_eq!(lease(""), JobLease::default());
    let jobs = |text: &str| {
        Config::parse(text, "q.toml", &env)
            .unwrap()
            .custom
            .jobs()
            .unwrap()
    };
    assert_eq!(jobs(""), 2);
    assert_eq!(jobs("[custom]\njobs = 1\n"), 1);
    assert_eq!(JobLease::default().stale(), Duration::from_secs(30));
    assert_eq!(JobLease::default().heartbeat(), Duration::from_secs(5));
    assert_eq!(JobLease::default().look_every(), Duration::from_secs(10));
    let three = lease("[custom]\njob_stale_secs = 3\n");
    assert_eq!(three.stale(), Duration::from_secs(3));
    assert_eq!(three.heartbeat(), Duration::from_millis(500));
    for (text, wants) in [
        (
            "[custom]\njob_stale_secs = 0\n",
            "`job_stale_secs = 0` is out of range: give 2 to 3600 seconds (default 30)",
        ),
        (
            "[custom]\njob_stale_secs = 1\n",
            "`job_stale_secs = 1` is out of range",
        ),
        (
            "[custom]\njob_stale_secs = 86400\n",
            "`job_stale_secs = 86400` is out of range",
        ),
        ("[custom]\njob_stale_secs = -5\n", "expected a whole number"),
        (
            "[custom]\njob_stale = 30\n",
            "did you mean `job_stale_secs`?",
        ),
        (
            "[custom]\njobs = 0\n",
            "`jobs = 0` is out of range: give 1 to 16 (default 2)",
        ),
        ("[custom]\njobs = 17\n", "`jobs = 17` is out of range"),
    ] {
        let err = Config::parse(text, "q.toml", &env).unwrap_err();
        let said = format!("{err:#}");
        assert!(said.contains(wants), "{text}: {said}");
        assert!(said.contains("q.toml"), "{text}: {said}");
    }
}
