//! The catalog directory (`[catalog] dir`) through the `quiver` binary: what the commands an
//! operator runs say about its files.

use std::process::{Command, Output};

use crate::{ONE_TOOL_SERVER, cli::quiver_in};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A directory with `quiver.toml` reading `catalog/` and one MCP server, `one`.
fn with_catalog(prefix: &str) -> crate::Scratch {
    let dir = crate::Scratch::new(prefix);
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[catalog]\ndir = \"catalog\"\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{ONE_TOOL_SERVER:?}]\n"
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("catalog/tools")).unwrap();
    dir
}

fn alias(name: &str) -> String {
    serde_json::json!({"name": name,
        "description": "Takes one field. Use it when asked to take a field.",
        "input_schema": {"type": "object", "properties": {}},
        "implementation": {"kind": "mcp", "ref": {"server": "one", "tool": "t"}}})
    .to_string()
}

/// A catalog alias and a stored custom tool of one name: the file wins in every process
/// (`tools --all` shows the alias, labelled as one); `custom list` says the custom tool is
/// not served and which file has the name; `custom add` and `custom approve` refuse the
/// name, and `quiver check` counts the clash.
#[test]
fn a_catalog_alias_wins_its_name_over_a_custom_tool_and_says_so() {
    let dir = with_catalog("catalog-alias-custom");
    std::fs::write(dir.join("now.js"), "async function main() { return 1; }").unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {}}"#,
    )
    .unwrap();
    let add = |name: &str| {
        quiver_in(
            &dir,
            &[
                "custom",
                "add",
                "now.js",
                "--name",
                name,
                "--description",
                "Returns one. Use it when testing.",
                "--schema",
                "schema.json",
            ],
        )
    };
    let out = add("now");
    assert!(out.status.success(), "{}", text(&out));
    let out = quiver_in(&dir, &["custom", "approve", "now", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = add("later");
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(dir.join("catalog/tools/now.json"), alias("now")).unwrap();
    std::fs::write(dir.join("catalog/tools/later.json"), alias("later")).unwrap();

    let all = text(&quiver_in(&dir, &["tools", "--all"]));
    for name in ["now", "later"] {
        let line = all
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} listed: {all}"));
        assert!(
            line.contains("catalog aliases") && line.contains("Takes one field"),
            "{line}"
        );
    }
    let list = text(&quiver_in(&dir, &["custom", "list"]));
    assert!(
        list.contains("now: approved, not served: the name is taken by catalog/tools/now.json"),
        "{list}"
    );
    let out = quiver_in(&dir, &["custom", "approve", "later", "--force"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("catalog/tools/later.json"),
        "{}",
        text(&out)
    );
    let out = add("now");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("`now` is defined by catalog/tools/now.json"),
        "{}",
        text(&out)
    );
    let check = quiver_in(&dir, &["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    assert!(
        text(&check)
            .contains("catalog/tools/now.json: [name] `now` is also an approved custom tool"),
        "{}",
        text(&check)
    );
}

/// `quiver check` reports what the log reports of the catalog files: each file's lints
/// (the string-constraint rule too) by its path, not by tool name, and a custom-kind
/// source that does not compile at its own line and column.
#[test]
fn check_reports_the_catalog_files_lints_and_sources_by_file() {
    let dir = with_catalog("catalog-check-files");
    std::fs::write(
        dir.join("catalog/tools/now.json"),
        serde_json::json!({"name": "now",
            "description": "Tells the time. Use it when asked the time.",
            "input_schema": {"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA zone"}}},
            "implementation": {"kind": "mcp", "ref": {"server": "one", "tool": "t"}}})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("catalog/tools/wc.json"),
        serde_json::json!({"name": "wc",
            "description": "Counts words. Use it when asked how many words a text has.",
            "input_schema": {"type": "object", "properties": {}},
            "implementation": {"kind": "custom", "ref": "wc.js"}})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("catalog/tools/wc.js"),
        "async function main(inputs) { return { words: 1,, }; }",
    )
    .unwrap();
    let check = quiver_in(&dir, &["check"]);
    let out = text(&check);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(
        out.contains("tools/now.json: [string_constraints] /properties/timezone: a string with no"),
        "{out}"
    );
    assert!(
        out.contains("tools/wc.js:1:") && out.contains("the source does not compile"),
        "{out}"
    );
    assert!(!out.contains("wc.json: [custom]"), "{out}");
}

/// Quiver's own `skill` and resource tools are names a custom tool cannot take, refused
/// as `tool_search` is; a catalog alias that hides the `skill` tool (every skill) is a
/// counted `quiver check` finding.
#[test]
fn quivers_own_skill_and_resource_tools_keep_their_names() {
    let dir = with_catalog("catalog-own-names");
    std::fs::write(dir.join("x.js"), "async function main() { return 1; }").unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {}}"#,
    )
    .unwrap();
    for name in ["skill", "list_mcp_resources", "read_mcp_resource"] {
        let out = quiver_in(
            &dir,
            &[
                "custom",
                "add",
                "x.js",
                "--name",
                name,
                "--description",
                "Returns one. Use it when testing.",
                "--schema",
                "schema.json",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out));
        assert!(
            text(&out).contains(&format!(
                "the name `{name}` is taken by Quiver's own tool `{name}`"
            )) && text(&out).contains(&format!("e.g. `my_{name}`"))
                && !text(&out).contains("cannot be changed here"),
            "{name}: {}",
            text(&out)
        );
    }

    std::fs::create_dir_all(dir.join("skills/hello")).unwrap();
    std::fs::write(
        dir.join("skills/hello/SKILL.md"),
        "---\nname: hello\ndescription: Says hello. Use when greeting.\n---\nHello.\n",
    )
    .unwrap();
    let toml = std::fs::read_to_string(dir.join("quiver.toml")).unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        format!("[skills]\ndirs = [\"skills\"]\n\n{toml}"),
    )
    .unwrap();
    std::fs::write(dir.join("catalog/tools/skill.json"), alias("skill")).unwrap();
    let check = quiver_in(&dir, &["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    assert!(
        text(&check).contains("skill: [shadowed] Quiver's own tool `skill`"),
        "{}",
        text(&check)
    );
}

/// A catalog file's lints reach the log at the default level at start, as at a reload.
#[test]
fn catalog_lints_are_warnings_at_start() {
    let dir = with_catalog("catalog-lints-start");
    std::fs::write(
        dir.join("catalog/tools/now.json"),
        serde_json::json!({"name": "now",
            "description": "Tells the time. Use it when asked the time.",
            "input_schema": {"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA zone"}}, "required": []},
            "implementation": {"kind": "mcp", "ref": {"server": "one", "tool": "t"}}})
        .to_string(),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["tools"])
        .current_dir(&*dir)
        .env_remove("QUIVER_LOG")
        .env_remove("RUST_LOG")
        .output()
        .expect("quiver runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WARN") && err.contains("now.json: [string_constraints]"),
        "{err}"
    );
}
