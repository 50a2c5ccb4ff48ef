//! Skills: asset names (accept and reject lists in `tests/data/asset_names.json`), asset
//! text, tiers and the trust gate, the `skill` tool, and slash commands (substitution and
//! precedence), each as a table of cases.

use std::sync::Arc;

use quiver_contract::{CallContext, Envelope, HintKind, RenderOptions, Tool, render};
use quiver_registry::{
    Catalog, DispatchConfig, Dispatcher, ResultLimitConfig,
    skill::{
        MAX_ASSET_BYTES, MemorySkills, PromptFrom, PromptSet, SkillError, SkillSource, SkillTier,
        SlashCommand, TieredSkills, asset_text, skill_tool, substitute, validate_asset_name,
    },
};
use serde_json::{Value, json};

use SkillTier::{Driver, Explicit, Project, User};

#[test]
fn asset_names_are_accepted_and_rejected_as_the_lists_say() {
    let data: Value = serde_json::from_str(include_str!("../data/asset_names.json")).unwrap();
    let mut failures = Vec::new();
    for name in data["accept"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        if let Err(why) = validate_asset_name(name) {
            failures.push(format!("{name:?} should be accepted, was refused: {why}"));
        }
    }
    let long = "a/".repeat(300) + "b";
    let mut rejects: Vec<(String, String)> = data["reject"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            (
                case[0].as_str().unwrap().to_owned(),
                case[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    rejects.push((long, "bytes long; at most 512".to_owned()));
    for (name, why) in &rejects {
        match validate_asset_name(name) {
            Ok(()) => failures.push(format!("{name:?} should be refused ({why}), was accepted")),
            Err(said) if !said.contains(why.as_str()) => {
                failures.push(format!("{name:?} refused with {said:?}, expected {why:?}"))
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn asset_text_is_utf8_without_nul_within_the_cap() {
    let cap = MAX_ASSET_BYTES as usize;
    let cases: Vec<(Vec<u8>, Result<&str, &str>)> = vec![
        (b"plain text\n".to_vec(), Ok("plain text\n")),
        ("résumé ✓".as_bytes().to_vec(), Ok("résumé ✓")),
        (Vec::new(), Ok("")),
        (b"a\0b".to_vec(), Err("holds a NUL byte (at byte 1)")),
        (
            vec![b'o', b'k', 0xff, b'!'],
            Err("not UTF-8 (an invalid sequence at byte 2)"),
        ),
        // A UTF-8 sequence cut short.
        (vec![b'x', 0xe2, 0x82], Err("at byte 1")),
        (vec![b'x'; cap], Ok("")),
        (vec![b'x'; cap + 1], Err("TooLarge")),
    ];
    for (bytes, want) in cases {
        let len = bytes.len();
        let got = asset_text("a.md", bytes);
        match (want, got) {
            (Ok(text), Ok(got)) if len == cap => assert_eq!(got.len(), cap, "{text:?}"),
            (Ok(text), Ok(got)) => assert_eq!(got, text),
            (Err("TooLarge"), Err(SkillError::TooLarge { bytes, cap: c, .. })) => {
                assert_eq!((bytes, c), (cap as u64 + 1, cap as u64));
            }
            (Err(why), Err(e @ SkillError::NotText { .. })) => {
                assert!(e.to_string().contains(why), "{e} should say {why:?}");
            }
            (want, got) => panic!("{len} bytes: expected {want:?}, got {got:?}"),
        }
    }
}

/// One tier case: sources (tier, skill names), whether the workspace is trusted, and what
/// is served (name, tier), shadowed (name, kept, dropped) and withheld.
struct TierCase {
    what: &'static str,
    sources: &'static [(SkillTier, &'static [&'static str])],
    trusted: bool,
    served: &'static [(&'static str, SkillTier)],
    shadowed: &'static [(&'static str, SkillTier, SkillTier)],
    withheld: usize,
}

const TIER_CASES: &[TierCase] = &[
    TierCase {
        what: "each tier's skills are stamped with their tier, listed in tier order",
        sources: &[
            (Driver, &["d"]),
            (User, &["u"]),
            (Project, &["p"]),
            (Explicit, &["e"]),
        ],
        trusted: true,
        served: &[("e", Explicit), ("p", Project), ("u", User), ("d", Driver)],
        shadowed: &[],
        withheld: 0,
    },
    TierCase {
        what: "an untrusted workspace's project tier is withheld, the others load",
        sources: &[
            (Project, &["p", "shared"]),
            (User, &["u", "shared"]),
            (Explicit, &["e"]),
        ],
        trusted: false,
        served: &[("e", Explicit), ("u", User), ("shared", User)],
        shadowed: &[],
        withheld: 1,
    },
    TierCase {
        what: "trusted, the project tier shadows the user's and the driver's",
        sources: &[
            (User, &["review", "lint"]),
            (Project, &["review"]),
            (Driver, &["review", "fmt"]),
        ],
        trusted: true,
        served: &[("review", Project), ("lint", User), ("fmt", Driver)],
        shadowed: &[("review", Project, User), ("review", Project, Driver)],
        withheld: 0,
    },
    TierCase {
        what: "explicit shadows every other tier",
        sources: &[
            (Driver, &["x"]),
            (Project, &["x"]),
            (User, &["x"]),
            (Explicit, &["x"]),
        ],
        trusted: true,
        served: &[("x", Explicit)],
        shadowed: &[
            ("x", Explicit, Project),
            ("x", Explicit, User),
            ("x", Explicit, Driver),
        ],
        withheld: 0,
    },
    TierCase {
        what: "two sources of one tier: the first given wins",
        sources: &[(User, &["a", "b"]), (User, &["b", "c"])],
        trusted: false,
        served: &[("a", User), ("b", User), ("c", User)],
        shadowed: &[("b", User, User)],
        withheld: 0,
    },
    TierCase {
        what: "untrusted, a project skill shadows nothing",
        sources: &[(Project, &["x"]), (Driver, &["x"])],
        trusted: false,
        served: &[("x", Driver)],
        shadowed: &[],
        withheld: 1,
    },
];

#[tokio::test]
async fn tiers_stack_by_precedence_behind_the_trust_gate() {
    for case in TIER_CASES {
        let sources: Vec<(SkillTier, Arc<dyn SkillSource>)> = case
            .sources
            .iter()
            .map(|(tier, names)| {
                // A source may claim any tier for its skills: the stack stamps its own.
                let source = names.iter().fold(MemorySkills::new(), |s, n| {
                    s.with_skill(Explicit, n, &format!("{n} from {tier}"), &format!("{tier}"))
                });
                (*tier, Arc::new(source) as Arc<dyn SkillSource>)
            })
            .collect();
        let (stack, report) = TieredSkills::build(sources, case.trusted).await;
        let listed = stack.list_skills().await.unwrap();
        let served: Vec<(&str, SkillTier)> =
            listed.iter().map(|m| (m.name.as_str(), m.tier)).collect();
        assert_eq!(served, case.served, "{}", case.what);
        let shadowed: Vec<(&str, SkillTier, SkillTier)> = report
            .shadowed
            .iter()
            .map(|s| (s.name.as_str(), s.kept, s.dropped))
            .collect();
        assert_eq!(shadowed, case.shadowed, "{}", case.what);
        assert_eq!(report.withheld, case.withheld, "{}", case.what);
        // The body comes from the source that won the name.
        for (name, tier) in case.served {
            let body = stack.skill_body(name).await.unwrap();
            assert_eq!(body, tier.to_string(), "{}: {name}", case.what);
        }
        let withheld_only = case
            .sources
            .iter()
            .filter(|(t, _)| *t == Project && !case.trusted)
            .flat_map(|(_, n)| n.iter())
            .filter(|n| !case.served.iter().any(|(s, _)| s == *n));
        for name in withheld_only {
            assert_eq!(
                stack.skill_body(name).await,
                Err(SkillError::UnknownSkill {
                    name: (*name).to_owned()
                }),
                "{}",
                case.what
            );
        }
    }
}

#[test]
fn a_shadowing_says_who_won() {
    let cases = [
        (
            (User, Project),
            "skill `x` (user tier) is shadowed by the project tier's skill of that name, which is served",
        ),
        (
            (User, User),
            "skill `x` is left out: an earlier user skill has that name",
        ),
    ];
    for ((dropped, kept), want) in cases {
        let source = Arc::new(MemorySkills::new().with_skill(User, "x", "d", "b"));
        let other = Arc::new(MemorySkills::new().with_skill(User, "x", "d", "b"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (_, report) = rt.block_on(TieredSkills::build(
            vec![(kept, source as _), (dropped, other as _)],
            true,
        ));
        assert_eq!(report.shadowed[0].reason(), want);
    }
}

fn pdf_skills() -> Arc<MemorySkills> {
    Arc::new(
        MemorySkills::new()
            .with_skill(
                User,
                "pdf-report",
                "Builds a PDF report from Markdown.",
                "# Steps\n1. Read references/api.md.\n2. Run scripts/build.py $1.",
            )
            .with_asset("pdf-report", "references/api.md", "The API.\n")
            .with_asset("pdf-report", "scripts/build.py", "print(1)\n")
            .with_asset("pdf-report", "blob.bin", vec![0u8, 1, 2])
            .with_asset(
                "pdf-report",
                "huge.txt",
                vec![b'x'; MAX_ASSET_BYTES as usize + 1],
            )
            .with_skill(User, "notes", "Writes notes.", ""),
    )
}

/// An Ok's text as the tool made it, or the whole render of a hint or error.
fn text(envelope: &Envelope) -> String {
    match envelope.data().and_then(Value::as_str) {
        Some(text) => text.to_owned(),
        None => render(envelope, &RenderOptions::default()),
    }
}

#[tokio::test]
async fn the_skill_tool_serves_bodies_and_assets_and_hints_at_mistakes() {
    let tool = skill_tool(pdf_skills()).await.unwrap().expect("a tool");
    // The definition is made once from the listing: another tool over the same skills has
    // the same bytes, and calls change nothing.
    let again = skill_tool(pdf_skills()).await.unwrap().unwrap();
    let bytes = |t: &Arc<dyn Tool>| serde_json::to_string(t.spec()).unwrap();
    assert_eq!(bytes(&tool), bytes(&again));
    let before = bytes(&tool);
    assert!(
        tool.spec().description.ends_with(
            "Skills:\n- pdf-report: Builds a PDF report from Markdown.\n- notes: Writes notes."
        ),
        "{}",
        tool.spec().description
    );
    assert_eq!(
        tool.spec().input_schema["properties"]["name"]["enum"],
        json!(["pdf-report", "notes"])
    );
    assert_eq!(tool.spec().input_schema["required"], json!(["name"]));
    let ctx = CallContext::default();
    let call = |input: Value| {
        let tool = tool.clone();
        let ctx = ctx.clone();
        async move { tool.call(input, &ctx).await }
    };

    let loaded = text(&call(json!({"name": "pdf-report"})).await.unwrap());
    assert_eq!(
        loaded,
        "# Skill `pdf-report`\n\nAssets the instructions may refer to (read one with {\"name\": \"pdf-report\", \"asset\": \"<asset>\"}): blob.bin, huge.txt, references/api.md, scripts/build.py\n\n---\n\n# Steps\n1. Read references/api.md.\n2. Run scripts/build.py $1."
    );
    // No path of any file system in what the model reads.
    assert!(!loaded.contains("SKILL.md"), "{loaded}");
    let bare = text(&call(json!({"name": "notes"})).await.unwrap());
    assert!(bare.contains("This skill has no assets."), "{bare}");
    assert!(
        bare.ends_with("beyond its description.)\nWrites notes."),
        "{bare}"
    );

    let asset = call(json!({"name": "pdf-report", "asset": "references/api.md"})).await;
    assert_eq!(text(&asset.unwrap()), "The API.\n");

    // Mistakes the model can recover from are hints naming what there is.
    let cases: &[(Value, &str, Option<&str>)] = &[
        (
            json!({"name": "pdf-reprt"}),
            "no skill named `pdf-reprt`; the skills are: pdf-report, notes",
            Some("pdf-report"),
        ),
        (
            json!({"name": "pdf-report", "asset": "references/apy.md"}),
            "skill `pdf-report` has no asset \"references/apy.md\"; its assets are: blob.bin, huge.txt, references/api.md, scripts/build.py",
            Some("references/api.md"),
        ),
        (
            json!({"name": "pdf-report", "asset": "../references/api.md"}),
            "`asset` \"../references/api.md\" is not an asset name: it has a `..` segment",
            Some("references/api.md"),
        ),
        (
            json!({"name": "pdf-report", "asset": "SKILL.md"}),
            "is the skill's body, not an asset",
            None,
        ),
        (
            json!({"name": "notes", "asset": "x.md"}),
            "skill `notes` has no asset \"x.md\"; it has no assets: call skill with {\"name\": \"notes\"} alone",
            None,
        ),
        (
            json!({"name": "notes", "asset": 3}),
            "`asset` is a string naming one of the skill's assets, not 3",
            None,
        ),
    ];
    for (input, message, nearest) in cases {
        let e = call(input.clone()).await.unwrap_err();
        let envelope = Envelope::from(e);
        assert_eq!(envelope.hint_kind(), Some(HintKind::Schema), "{input}");
        let said = envelope.message().unwrap_or_default();
        assert!(said.contains(message), "{input}: {said}");
        if let Some(nearest) = nearest {
            assert!(
                text(&envelope).contains(nearest),
                "{input}: {}",
                text(&envelope)
            );
        }
    }
    // What cannot be fixed by another call is an error, refused whole.
    for (asset, says) in [
        (
            "blob.bin",
            "is not text: it holds a NUL byte (at byte 0): only text assets are served",
        ),
        (
            "huge.txt",
            "bytes; an asset is at most 262144: it is not served, cut or whole",
        ),
    ] {
        let e = Envelope::from(
            call(json!({"name": "pdf-report", "asset": asset}))
                .await
                .unwrap_err(),
        );
        assert!(e.is_err(), "{asset}: {e:?}");
        assert!(
            e.message().unwrap_or_default().contains(says),
            "{asset}: {e:?}"
        );
    }
    assert_eq!(
        bytes(&tool),
        before,
        "calls change nothing of the definition"
    );
    assert!(
        skill_tool(Arc::new(MemorySkills::new()))
            .await
            .unwrap()
            .is_none()
    );
}

/// Through the dispatcher: activating a skill registers no tool, and an asset longer than
/// a result may be comes back within the result limit.
#[tokio::test]
async fn an_asset_is_served_within_the_result_limit_and_nothing_is_registered() {
    let long = "word ".repeat(2_000);
    let source = Arc::new(
        MemorySkills::new()
            .with_skill(User, "big", "Has a long asset.", "Read long.md.")
            .with_asset("big", "long.md", long.clone()),
    );
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(skill_tool(source).await.unwrap().unwrap());
    let dispatcher = Dispatcher::builder(catalog.clone())
        .config(
            DispatchConfig::default()
                .with_result_limit(ResultLimitConfig::default().with_max_chars(1_000)),
        )
        .build();
    let before = catalog.len();
    let ctx = || CallContext::for_session("s");
    let loaded = dispatcher
        .call("skill", json!({"name": "big"}), ctx())
        .await;
    assert!(loaded.is_ok(), "{loaded:?}");
    let asset = dispatcher
        .call("skill", json!({"name": "big", "asset": "long.md"}), ctx())
        .await;
    let got = asset.data().and_then(Value::as_str).unwrap_or_default();
    let (head, rest) = got
        .split_once("\n…[")
        .expect("the marker between head and tail");
    let tail = rest.split_once("]…\n").expect("the marker ends").1;
    assert!(
        head.chars().count() + tail.chars().count() <= 1_000,
        "{got}"
    );
    assert!(long.starts_with(head) && long.ends_with(tail), "{got}");
    assert!(
        rest.contains("read_result"),
        "the rest can be read back: {got}"
    );
    assert_eq!(catalog.len(), before, "loading a skill registers no tool");
}

#[test]
fn placeholders_are_substituted_in_one_pass() {
    let cases = [
        (
            "Review $ARGUMENTS now.",
            "src/a.rs  src/b.rs",
            "Review src/a.rs src/b.rs now.",
        ),
        ("Review $ARGUMENTS now.", "", "Review  now."),
        ("$1 then $2", "first second third", "first then second"),
        ("$2/$1", "a b", "b/a"),
        ("past the end: [$3]", "a b", "past the end: []"),
        ("$10 and $1", "1 2 3 4 5 6 7 8 9 ten", "ten and 1"),
        ("$99999999999999999999999", "a", ""),
        ("$0 $HOME $ $$1 $ARG", "x", "$0 $HOME $ $x $ARG"),
        ("$ARGUMENTSX", "a b", "a bX"),
        ("cost: $5", "", "cost: "),
        ("no placeholders", "ignored", "no placeholders"),
        // An argument's own placeholders are not replaced again.
        ("[$1] [$2]", "$2 $ARGUMENTS", "[$2] [$ARGUMENTS]"),
        ("all: $ARGUMENTS", "$1", "all: $1"),
        ("trailing $", "a", "trailing $"),
        ("ünïcode $1 ✓", "wörd", "ünïcode wörd ✓"),
    ];
    for (template, arguments, want) in cases {
        assert_eq!(
            substitute(template, arguments),
            want,
            "{template:?} with {arguments:?}"
        );
    }
}

#[test]
fn command_files_parse_with_or_without_front_matter() {
    let c = SlashCommand::parse(
        "review",
        "---\ndescription: Reviews a file.\nargument-hint: <file>\nallowed-tools: Bash\n---\nReview $1 carefully.\n",
        "commands/review.md",
    )
    .unwrap();
    assert_eq!(
        (
            c.description.as_str(),
            c.argument_hint.as_deref(),
            c.template.as_str()
        ),
        ("Reviews a file.", Some("<file>"), "Review $1 carefully.")
    );
    let c = SlashCommand::parse("fix", "\n  Fix the failing test.\nThen rerun.\n", "x").unwrap();
    assert_eq!(c.description, "Fix the failing test.");
    let refusals = [
        ("bad name", "Text.", "cannot be a command name"),
        (".hidden", "Text.", "cannot be a command name"),
        ("empty", "---\ndescription: d\n---\n\n", "no prompt text"),
        (
            "typed",
            "---\ndescription: 3\n---\nText.",
            "must be a string",
        ),
        ("open", "---\ndescription: d\nText.", "no closing `---`"),
        (
            "esc",
            "Step \u{1b}[2J one.",
            "(line 1 of the prompt text): a model would read them",
        ),
    ];
    for (name, text, want) in refusals {
        let e = SlashCommand::parse(name, text, "x").unwrap_err();
        assert!(e.contains(want), "{name}: {e}");
    }
}

/// Local prompts: a command file shadows a skill of its name (reported), skills of every
/// tier are prompts, and a prompt's text is its template or body with the arguments in.
#[tokio::test]
async fn commands_shadow_skills_and_prompts_render_with_their_arguments() {
    let skills = Arc::new(
        MemorySkills::new()
            .with_skill(
                Project,
                "review",
                "Reviews as the project does.",
                "Project review of $1.",
            )
            .with_skill(
                User,
                "pdf-report",
                "Builds PDFs.",
                "Build $ARGUMENTS as a PDF.",
            )
            .with_asset("pdf-report", "ref/$1.md", "x"),
    );
    let commands = vec![
        SlashCommand::parse("review", "Review $1 the local way.", "cmds/review.md").unwrap(),
        SlashCommand::parse("review", "A second review.", "other/review.md").unwrap(),
        SlashCommand::parse("ship", "Ship it.", "cmds/ship.md").unwrap(),
    ];
    let (prompts, problems) = PromptSet::build(commands, Some(skills)).await;
    let listed: Vec<(String, PromptFrom)> = prompts
        .list()
        .into_iter()
        .map(|p| (p.name, p.from))
        .collect();
    assert_eq!(
        listed,
        [
            ("pdf-report".to_owned(), PromptFrom::Skill(User)),
            ("review".to_owned(), PromptFrom::Command),
            ("ship".to_owned(), PromptFrom::Command),
        ]
    );
    let problems: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.origin, p.reason))
        .collect();
    assert_eq!(
        problems,
        [
            "other/review.md: command `review` is left out: cmds/review.md has that name and comes first",
            "cmds/review.md: the prompt `review` is this command file, which shadows the project tier's skill of that name (the `skill` tool still serves the skill)",
        ]
    );
    let cases = [
        ("review", "a.rs b.rs", Some("Review a.rs the local way.")),
        (
            "pdf-report",
            "q3 summary",
            Some(
                "Build q3 summary as a PDF.\n\n---\n\nAssets of this skill (read one with the `skill` tool: {\"name\": \"pdf-report\", \"asset\": \"<asset>\"}): ref/$1.md",
            ),
        ),
        ("ship", "", Some("Ship it.")),
        ("unknown", "x", None),
    ];
    for (name, arguments, want) in cases {
        let got = prompts.render(name, arguments).await.unwrap();
        assert_eq!(got.as_deref(), want, "{name}");
    }
}

/// A skill loaded through the `skill` tool, which takes no arguments, reads without the
/// slash-command placeholder `$ARGUMENTS`; the shell's `$1` in its examples stays.
#[tokio::test]
async fn a_loaded_skill_has_no_arguments_placeholder() {
    let source = Arc::new(MemorySkills::new().with_skill(
        User,
        "commit-style",
        "How to write commit subjects.",
        "Write the subject in imperative mood. $ARGUMENTS\nList with `awk '{print $1}'`.",
    ));
    let tool = skill_tool(source).await.unwrap().unwrap();
    let got = tool
        .call(json!({"name": "commit-style"}), &CallContext::default())
        .await
        .expect("loaded");
    let body = text(&got);
    assert!(!body.contains("$ARGUMENTS"), "{body}");
    assert!(body.contains("imperative mood."), "{body}");
    assert!(body.contains("awk '{print $1}'"), "{body}");
}
