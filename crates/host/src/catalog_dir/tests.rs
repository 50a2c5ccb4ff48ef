use super::*;
use serde_json::json;

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

const SCHEMA: &str = r#"{"type": "object", "properties": {"text": {"type": "string", "maxLength": 200, "description": "What to say."}}, "required": ["text"]}"#;

fn def(name: &str, implementation: &str) -> String {
    format!(
        r#"{{"name": "{name}", "description": "Says a text back. Use it when asked to repeat something.", "input_schema": {SCHEMA}, "implementation": {implementation}}}"#
    )
}

/// Each kind loads from a good file; each broken file is reported with its path, the rule
/// it breaks and the fix, and the others still load; `agents/` is reported, not ignored.
#[test]
fn good_files_load_and_each_bad_one_is_reported_with_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tools/say.json",
        &def(
            "say",
            r#"{"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}, "requires": ["vision"], "progressive": true, "read_only": true"#,
        ),
    );
    write(
        d,
        "tools/plan.toml",
        "name = \"plan_release\"\ndescription = \"Plans a release. Use it when asked to ship.\"\nimplementation = { kind = \"skill\", ref = \"release\" }\n[input_schema]\ntype = \"object\"\n",
    );
    write(
        d,
        "tools/sum.json",
        &def("sum_up", r#"{"kind": "custom", "ref": "sum.js"}"#),
    );
    write(
        d,
        "tools/sum.js",
        "async function main(inputs) { return 1; }",
    );
    write(d, "tools/README.md", "not a definition: ignored");
    let bad = [
        (
            "tools/broken.json",
            "{\"name\": \"x\",\n",
            "format",
            "line 2",
        ),
        (
            "tools/kind.json",
            &def("kind_x", r#"{"kind": "python", "ref": "x"}"#),
            "format",
            "unknown variant",
        ),
        (
            "tools/name.json",
            &def("Bad Name", r#"{"kind": "skill", "ref": "release"}"#),
            "name",
            "Bad Name",
        ),
        (
            "tools/mcpname.json",
            &def("mcp__a__b", r#"{"kind": "skill", "ref": "release"}"#),
            "name",
            "native name",
        ),
        (
            "tools/schema.json",
            &def("schema_x", r#"{"kind": "skill", "ref": "release"}"#)
                .replace(r#""type": "object""#, r#""type": "string""#),
            "input_schema",
            "root must be",
        ),
        (
            "tools/nosrc.json",
            &def("nosrc", r#"{"kind": "custom", "ref": "missing.js"}"#),
            "ref",
            "missing.js",
        ),
        (
            "tools/noserver.json",
            &def(
                "noserver",
                r#"{"kind": "mcp", "ref": {"server": "nope", "tool": "echo"}}"#,
            ),
            "ref",
            "no MCP server named `nope`",
        ),
        (
            "tools/custom_requires.json",
            &def(
                "custom_requires",
                r#"{"kind": "custom", "ref": "sum.js"}, "requires": ["vision"]"#,
            ),
            "custom_tool_field",
            "mcp` and `skill` tools only",
        ),
        (
            "tools/zdup.json",
            &def("say", r#"{"kind": "skill", "ref": "release"}"#),
            "duplicate_name",
            "say.json",
        ),
    ];
    for (rel, text, _, _) in &bad {
        write(d, rel, text);
    }
    write(d, "agents/coder/agent.json", "{}");
    let read = read(d, &["everything".to_owned()]);
    let mut names = read.names();
    names.sort();
    assert_eq!(
        names,
        vec!["plan_release", "say", "sum_up"],
        "{:#?}",
        read.problems
    );
    let say = read
        .defined
        .iter()
        .find(|d| d.spec.name == "say")
        .expect("say is defined");
    assert_eq!(say.spec.requires, ["vision"]);
    assert!(say.spec.progressive);
    // The operator states that the alias only reads: plan mode offers it.
    assert!(say.spec.is_read_only());
    let plan = read
        .defined
        .iter()
        .find(|d| d.spec.name == "plan_release")
        .expect("plan_release is defined");
    assert!(
        !plan.spec.is_read_only(),
        "not stated: it may change things"
    );
    for (rel, _, rule, says) in &bad {
        let p = read
            .problems
            .iter()
            .find(|p| p.path.ends_with(rel) && p.refused)
            .unwrap_or_else(|| panic!("{rel} reported: {:#?}", read.problems));
        assert_eq!(p.rule, *rule, "{p}");
        assert!(p.fix.contains(says), "{rel}: {p}");
    }
    let agents = read
        .problems
        .iter()
        .find(|p| p.rule == "agents_unsupported");
    assert!(
        agents.is_some_and(|p| p.fix.contains("not supported yet")),
        "{:#?}",
        read.problems
    );
}

/// The lints of `quiver check` and September's constraint rule warn without stopping the
/// tool; a deprecation is announced at the front of the description.
#[test]
fn lints_warn_and_a_deprecation_is_announced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tools/old.json",
        r#"{"name": "old_say", "description": "Says a text.", "input_schema": {"type": "object", "properties": {"text": {"type": "string", "description": "What."}}}, "implementation": {"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}, "deprecated": {"message": "removed in the next release.", "use_instead": "say"}}"#,
    );
    let read = read(d, &["everything".to_owned()]);
    assert_eq!(read.names(), vec!["old_say"]);
    let rules: Vec<&str> = read.problems.iter().map(|p| p.rule).collect();
    assert!(rules.contains(&"when_to_use"), "{rules:?}");
    assert!(rules.contains(&"string_constraints"), "{rules:?}");
    assert!(
        read.problems.iter().all(|p| !p.refused),
        "{:#?}",
        read.problems
    );
    assert!(
        read.defined[0].spec.description.starts_with(
            "DEPRECATED: removed in the next release. Use `say` instead. Says a text."
        ),
        "{}",
        read.defined[0].spec.description
    );
}

/// An alias's schema against its target's: what every call would be refused for is named,
/// and a schema that meets the target (an integer where it takes a number) is not.
#[test]
fn an_alias_schema_is_compared_with_its_targets() {
    let target = json!({"type": "object", "additionalProperties": false,
        "properties": {"path": {"type": "string"}, "depth": {"type": "number"}},
        "required": ["path"]});
    let fine = json!({"type": "object", "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}}});
    assert_eq!(super::schema_mismatch(&fine, &target), None);
    let wrong = json!({"type": "object", "properties": {"file": {"type": "string"}, "depth": {"type": "string"}}});
    let why = super::schema_mismatch(&wrong, &target).expect("a mismatch");
    assert!(why.contains("which requires `path`"), "{why}");
    assert!(
        why.contains("which does not take `file` (its arguments: `path`, `depth`)"),
        "{why}"
    );
    assert!(
        why.contains("whose `depth` is a number, not a string"),
        "{why}"
    );
}

fn dir_tools(catalog: &Arc<Catalog>) -> CatalogDirTools {
    use quiver_registry::store::{MemoryDefinitionStore, MemoryJobStore};
    let custom = Arc::new(CustomTools::new(
        Arc::new(MemoryDefinitionStore::default()),
        Arc::new(MemoryJobStore::default()),
        Arc::new(quiver_sandbox::QuickJsSandbox::new(1)),
        quiver_registry::sandbox::SandboxLimits::default(),
    ));
    CatalogDirTools::new(catalog.clone(), custom, false)
}

/// A definition file saved half-edited (it no longer parses) leaves the tool as it was
/// last read, and the report says so; deleting the file takes the tool off.
#[tokio::test]
async fn a_file_that_stops_loading_keeps_its_last_good_version_served() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let servers = ["everything".to_owned()];
    let say = def(
        "say",
        r#"{"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}"#,
    );
    write(d, "tools/say.json", &say);
    let catalog = Arc::new(Catalog::new());
    let tools = dir_tools(&catalog);
    let applied = tools.apply(&read(d, &servers), None, false).await;
    assert_eq!(applied.served, ["say"], "{applied:?}");

    write(d, "tools/say.json", &say.replacen(',', ",,", 1));
    let applied = tools.apply(&read(d, &servers), None, false).await;
    assert!(applied.removed.is_empty(), "{applied:?}");
    assert!(catalog.lookup("say").is_some(), "still served");
    assert!(
        applied.problems.iter().any(|p| p.contains("say.json")
            && p.contains("does not load; `say` is still served as read at")),
        "{applied:?}"
    );
    // Fixed again: the file's tool, as it is now, with nothing re-registered.
    write(d, "tools/say.json", &say);
    let applied = tools.apply(&read(d, &servers), None, false).await;
    assert!(applied.problems.is_empty(), "{applied:?}");
    assert!(applied.removed.is_empty(), "{applied:?}");

    std::fs::remove_file(d.join("tools/say.json")).unwrap();
    let applied = tools.apply(&read(d, &servers), None, false).await;
    assert_eq!(applied.removed, ["say"], "{applied:?}");
    assert!(catalog.lookup("say").is_none());
}

/// A custom-kind file whose JavaScript does not compile is reported at the source file's
/// line and column, also where nothing is stored (`quiver check`).
#[tokio::test]
async fn a_custom_source_that_does_not_compile_is_reported_at_the_js_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tools/sum.json",
        &def("sum_up", r#"{"kind": "custom", "ref": "sum.js"}"#),
    );
    write(
        d,
        "tools/sum.js",
        "async function main(inputs) {\n  return {a: 1,, };\n}",
    );
    let catalog = Arc::new(Catalog::new());
    let applied = dir_tools(&catalog).apply(&read(d, &[]), None, false).await;
    assert!(
        applied
            .problems
            .iter()
            .any(|p| p.contains("tools/sum.js:2:")
                && p.contains("[custom] the source does not compile")
                && !p.contains("sum.json")),
        "{applied:?}"
    );
}

/// A misspelt JSON Schema type is refused naming where it is, the types there are and the
/// closest; a `required` entry that is no property is a finding with the closest one.
#[test]
fn a_schema_type_typo_and_an_unknown_required_name_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let with = |schema: &str| {
        format!(
            r#"{{"name": "now", "description": "Tells the time. Use it when asked the time.", "input_schema": {schema}, "implementation": {{"kind": "mcp", "ref": {{"server": "time", "tool": "t"}}}}}}"#
        )
    };
    write(
        d,
        "tools/typo.json",
        &with(
            r#"{"type": "object", "properties": {"timezone": {"type": "strng", "description": "IANA zone"}}}"#,
        ),
    );
    write(
        d,
        "tools/req.json",
        &with(
            r#"{"type": "object", "properties": {"timezone": {"type": "string", "enum": ["UTC"], "description": "IANA zone"}}, "required": ["timezon"]}"#,
        )
        .replace("\"now\"", "\"now2\""),
    );
    let read = read(d, &["time".to_owned()]);
    let typo = read
        .problems
        .iter()
        .find(|p| p.path.ends_with("typo.json"))
        .expect("typo.json reported");
    assert!(typo.refused, "{typo}");
    assert!(
        typo.fix.contains("/properties/timezone/type: \"strng\" is not a JSON Schema type (string, number, integer, boolean, array, object, null); did you mean `string`?"),
        "{typo}"
    );
    let req = read
        .problems
        .iter()
        .find(|p| p.path.ends_with("req.json"))
        .unwrap_or_else(|| panic!("req.json reported: {:#?}", read.problems));
    assert_eq!(req.rule, "required_unknown", "{req}");
    assert!(
        req.fix.contains(
            "`required` names `timezon`, which is not in `properties`; did you mean `timezone`?"
        ),
        "{req}"
    );
}

/// `tests` written inside `implementation` is refused with where it goes; the format hint
/// names the optional keys too.
#[test]
fn tests_inside_the_implementation_are_sent_up_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tools/wc.json",
        &def(
            "wc",
            r#"{"kind": "custom", "ref": "wc.js", "tests": [{"inputs": {"text": "a"}, "expect": 1}]}"#,
        ),
    );
    write(
        d,
        "tools/wc.js",
        "async function main(inputs) { return 1; }",
    );
    let read = read(d, &[]);
    let p = read
        .problems
        .iter()
        .find(|p| p.path.ends_with("wc.json"))
        .expect("wc.json reported");
    assert_eq!(p.rule, "format", "{p}");
    assert!(
        p.fix.contains("move `tests` up beside `implementation`")
            && p.fix.contains(
                "\"tests\", \"deprecated\", \"requires\", \"progressive\", \"read_only\""
            ),
        "{p}"
    );
}

/// A `requires` no token or OIDC rule declares, spelt like one that is, and a
/// `use_instead` that names no tool are reported; the deprecation's sentence ends with a
/// full stop before "Use".
#[tokio::test]
async fn a_misspelt_requires_and_use_instead_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tools/vis.json",
        &def(
            "vis_time",
            r#"{"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}, "requires": ["visoin"], "deprecated": {"message": "vis_time goes away in March", "use_instead": "nowz"}"#,
        ),
    );
    write(
        d,
        "tools/now.json",
        &def(
            "now",
            r#"{"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}"#,
        ),
    );
    let read = read(d, &["everything".to_owned()]);
    let vis = read
        .defined
        .iter()
        .find(|d| d.spec.name == "vis_time")
        .expect("vis_time defined");
    assert!(
        vis.spec
            .description
            .starts_with("DEPRECATED: vis_time goes away in March. Use `nowz` instead. "),
        "{}",
        vis.spec.description
    );
    let catalog = Arc::new(Catalog::new());
    let tools = dir_tools(&catalog);
    tools.apply(&read, None, false).await;
    let found = tools.reference_findings(&["vision".to_owned()]);
    assert!(
        found.iter().any(|(f, counted)| *counted
            && f.contains(
                "vis.json: [use_instead] `nowz` names no tool in the catalog; did you mean `now`?"
            )),
        "{found:?}"
    );
    assert!(
        found.iter().any(|(f, counted)| *counted
            && f.contains(
                "vis.json: [requires] no `[[auth.tokens]]` or `[auth.oidc]` rule declares `visoin`"
            )
            && f.contains("did you mean `vision`?")),
        "{found:?}"
    );
}

/// Hidden characters (tag characters, bidi controls, NUL) in a description or a property's
/// description are refused, as in a SKILL.md: a model would read what a reviewer cannot see.
#[test]
fn hidden_characters_in_descriptions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tools/hid.json",
        &def(
            "hid",
            r#"{"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}"#,
        )
        .replace(
            "Use it when asked to repeat something.",
            r"Use it when asked to repeat something.\u202e\u0000\udb40\udc01 secret",
        ),
    );
    write(
        d,
        "tools/hid2.json",
        &def(
            "hid2",
            r#"{"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}"#,
        )
        .replace("What to say.", r"What to say.\u2066x"),
    );
    let read = read(d, &["everything".to_owned()]);
    assert!(read.names().is_empty(), "{:#?}", read.problems);
    for (file, part) in [
        ("hid.json", "the description holds 3 hidden character(s)"),
        (
            "hid2.json",
            "the input schema at `/properties/text/description` holds 1 hidden character(s)",
        ),
    ] {
        let p = read
            .problems
            .iter()
            .find(|p| p.path.ends_with(file))
            .unwrap_or_else(|| panic!("{file}: {:#?}", read.problems));
        assert!(p.refused && p.rule == "hidden_characters", "{p}");
        assert!(p.fix.contains(part) && p.fix.contains("remove them"), "{p}");
    }
}
