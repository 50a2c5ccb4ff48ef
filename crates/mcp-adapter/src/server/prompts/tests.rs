use std::time::Duration;

use quiver_registry::skill::{MemorySkills, SkillSource, SkillTier, SlashCommand};

use super::*;

/// An upstream (the MCP client, as `quiver serve` passes it) serving prompts by name, each
/// rendering as `upstream <name>`.
struct Upstream {
    prompts: Vec<&'static str>,
    changes: broadcast::Sender<ListChanged>,
}

impl Upstream {
    fn new(prompts: &[&'static str]) -> Arc<Self> {
        Arc::new(Upstream {
            prompts: prompts.to_vec(),
            changes: broadcast::channel(8).0,
        })
    }
}

#[async_trait]
impl ContentSource for Upstream {
    fn offer(&self) -> ContentOffer {
        ContentOffer::all()
    }
    async fn list_resources(&self, _: &Capabilities) -> Result<Vec<Value>, ContentError> {
        Ok(vec![json!({"uri": "up://r", "name": "r"})])
    }
    async fn list_resource_templates(&self, _: &Capabilities) -> Result<Vec<Value>, ContentError> {
        Ok(Vec::new())
    }
    async fn read_resource(&self, _: &str, _: &CallContext) -> Result<Value, ContentError> {
        Ok(json!({"contents": []}))
    }
    async fn subscribe(&self, _: &str, _: &Capabilities) -> Result<(), ContentError> {
        Ok(())
    }
    async fn unsubscribe(&self, _: &str) -> Result<(), ContentError> {
        Ok(())
    }
    fn resource_updates(&self) -> broadcast::Receiver<String> {
        broadcast::channel(1).1
    }
    fn list_changes(&self) -> broadcast::Receiver<ListChanged> {
        self.changes.subscribe()
    }
    async fn list_prompts(&self, _: &Capabilities) -> Result<Vec<Value>, ContentError> {
        Ok(self.prompts.iter().map(|n| json!({"name": n})).collect())
    }
    async fn get_prompt(
        &self,
        name: &str,
        _: Option<Map<String, Value>>,
        _: &CallContext,
    ) -> Result<Value, ContentError> {
        if !self.prompts.contains(&name) {
            return Err(ContentError::NotFound(format!("upstream has no {name}")));
        }
        Ok(
            json!({"messages": [{"role": "user", "content": {"type": "text", "text": format!("upstream {name}")}}]}),
        )
    }
    async fn complete(&self, _: Value, _: &Capabilities) -> Result<Value, ContentError> {
        Ok(json!({"completion": {"values": ["up"]}}))
    }
}

async fn local(
    commands: &[(&str, &str)],
    skills: &[(&str, &str)],
    upstream: Option<Arc<Upstream>>,
) -> LocalPrompts {
    let commands = commands
        .iter()
        .map(|(name, text)| SlashCommand::parse(name, text, &format!("cmds/{name}.md")).unwrap())
        .collect();
    let source = skills.iter().fold(MemorySkills::new(), |s, (name, body)| {
        s.with_skill(SkillTier::User, name, &format!("The {name} skill."), body)
    });
    let (set, _) = PromptSet::build(commands, Some(Arc::new(source) as Arc<dyn SkillSource>)).await;
    LocalPrompts::new(Arc::new(set), upstream.map(|u| u as Arc<dyn ContentSource>))
}

fn text_of(result: &Value) -> &str {
    result["messages"][0]["content"]["text"]
        .as_str()
        .unwrap_or_default()
}

/// One precedence case: command files, skills and upstream (bare) prompt names, then each
/// name as `prompts/get` answers it with the argument `a b`.
struct Case {
    what: &'static str,
    commands: &'static [(&'static str, &'static str)],
    skills: &'static [(&'static str, &'static str)],
    upstream: &'static [&'static str],
    answers: &'static [(&'static str, &'static str)],
}

const CASES: &[Case] = &[
    Case {
        what: "a command file shadows a skill, which shadows an upstream prompt",
        commands: &[("review", "Command review of $1.")],
        skills: &[
            ("review", "Skill review of $1."),
            ("deploy", "Skill deploy $ARGUMENTS."),
        ],
        upstream: &["review", "deploy", "greet"],
        answers: &[
            ("review", "Command review of a."),
            ("deploy", "Skill deploy a b."),
            ("greet", "upstream greet"),
        ],
    },
    Case {
        what: "prefixed upstream names never meet local ones",
        commands: &[],
        skills: &[("greet", "Skill greet $2.")],
        upstream: &["mcp__fx__greet"],
        answers: &[
            ("greet", "Skill greet b."),
            ("mcp__fx__greet", "upstream mcp__fx__greet"),
        ],
    },
    Case {
        what: "a command alone, no upstream prompt of its name",
        commands: &[("ship", "Ship $ARGUMENTS now.")],
        skills: &[],
        upstream: &["other"],
        answers: &[("ship", "Ship a b now."), ("other", "upstream other")],
    },
];

#[tokio::test]
async fn local_prompts_shadow_upstream_ones_in_precedence_order() {
    for case in CASES {
        let prompts = local(
            case.commands,
            case.skills,
            Some(Upstream::new(case.upstream)),
        )
        .await;
        let listed: Vec<String> = prompts
            .list_prompts(&Capabilities::all())
            .await
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        let mut unique = listed.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            listed.len(),
            "{}: one entry a name: {listed:?}",
            case.what
        );
        let ctx = CallContext::default();
        for (name, want) in case.answers {
            assert!(
                listed.iter().any(|l| l == name),
                "{}: {name} listed",
                case.what
            );
            let args = json!({"arguments": "a b"}).as_object().cloned();
            let got = prompts.get_prompt(name, args, &ctx).await.unwrap();
            assert_eq!(text_of(&got), *want, "{}: {name}", case.what);
        }
    }
}

#[tokio::test]
async fn a_local_prompt_is_listed_with_its_argument_and_refuses_others() {
    let prompts = local(&[], &[("notes", "Notes on $1.")], None).await;
    assert!(prompts.offer().prompts && prompts.offer().list_changed);
    assert!(!prompts.offer().resources);
    let listed = prompts.list_prompts(&Capabilities::all()).await.unwrap();
    assert_eq!(listed[0]["name"], "notes");
    assert_eq!(listed[0]["description"], "The notes skill.");
    assert_eq!(listed[0]["arguments"][0]["name"], PROMPT_ARGUMENT);
    assert_eq!(listed[0]["arguments"][0]["required"], false);
    let ctx = CallContext::default();
    let none = prompts.get_prompt("notes", None, &ctx).await.unwrap();
    assert_eq!(text_of(&none), "Notes on .");
    assert_eq!(none["description"], "The notes skill.");
    for (args, says) in [
        (json!({"city": "Paris"}), "takes one argument, `arguments`"),
        (json!({"arguments": 3}), "is a string, not 3"),
    ] {
        let e = prompts
            .get_prompt("notes", args.as_object().cloned(), &ctx)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ContentError::InvalidParams(m) if m.contains(says)),
            "{e:?}"
        );
    }
    let e = prompts.get_prompt("nope", None, &ctx).await.unwrap_err();
    assert!(
        matches!(&e, ContentError::NotFound(m) if m.contains("call prompts/list")),
        "{e:?}"
    );
    let done = prompts
        .complete(
            json!({"ref": {"type": "ref/prompt", "name": "notes"}}),
            &Capabilities::all(),
        )
        .await
        .unwrap();
    assert_eq!(done["completion"]["values"], json!([]));
}

/// A caller not offered the `skill` tool sees no local prompt, and the upstream's own
/// prompt of that name stays shadowed for it too.
#[tokio::test]
async fn callers_without_the_skill_tool_see_no_local_prompt() {
    let prompts = local(
        &[],
        &[("greet", "Hi.")],
        Some(Upstream::new(&["greet", "other"])),
    )
    .await;
    for caps in [
        Capabilities::all().with_allowed_tools(vec!["mcp__*".into()]),
        Capabilities::all().with_denied_tools(vec!["skill".into()]),
    ] {
        let listed: Vec<Value> = prompts.list_prompts(&caps).await.unwrap();
        assert_eq!(listed, [json!({"name": "other"})], "{caps:?}");
        let ctx = CallContext::default().with_capabilities(caps.clone());
        let e = prompts.get_prompt("greet", None, &ctx).await.unwrap_err();
        assert!(matches!(e, ContentError::NotFound(_)), "{caps:?}: {e:?}");
    }
}

#[tokio::test]
async fn a_changed_listing_is_announced_and_upstream_changes_are_relayed() {
    let upstream = Upstream::new(&["u"]);
    let prompts = local(&[], &[("a", "A.")], Some(upstream.clone())).await;
    let mut changes = prompts.list_changes();
    let same = local(&[], &[("a", "A.")], None).await.current();
    assert!(!prompts.replace(same));
    let other = local(&[("b", "B.")], &[("a", "A.")], None).await.current();
    assert!(prompts.replace(other));
    let got = tokio::time::timeout(Duration::from_secs(5), changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, ListChanged::unattributed(ListChange::Prompts));
    upstream
        .changes
        .send(ListChanged::of(ListChange::Resources, "fx"))
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, ListChanged::of(ListChange::Resources, "fx"));
    assert!(
        changes.try_recv().is_err(),
        "the unchanged replace sent nothing"
    );
    let names: Vec<Value> = prompts
        .list_prompts(&Capabilities::all())
        .await
        .unwrap()
        .into_iter()
        .map(|p| p["name"].clone())
        .collect();
    assert_eq!(names, [json!("a"), json!("b"), json!("u")]);
}

/// With `offered_while_empty(false)`, the prompts capability follows what there is: none
/// while there is no prompt, then offered once a replacement brings one.
#[tokio::test]
async fn the_prompts_capability_follows_the_prompts_when_not_offered_while_empty() {
    let empty = local(&[], &[], None).await;
    assert!(empty.offer().prompts, "offered while empty by default");
    let empty = empty.offered_while_empty(false);
    assert!(!empty.offer().prompts);
    let filled = local(&[], &[("alpha", "Alpha $1.")], None).await;
    empty.replace(filled.current());
    assert!(empty.offer().prompts);
}

#[tokio::test]
async fn the_kept_results_template_is_completed_here_not_upstream() {
    let prompts = local(&[], &[], Some(Upstream::new(&["greet"])))
        .await
        .with_kept_results(Arc::new(quiver_registry::kept::KeptResults::new(1 << 20)));
    let caps = Capabilities::all();
    let ours = json!({"ref": {"type": "ref/resource", "uri": "quiver://results/{call_id}"}, "argument": {"name": "call_id", "value": ""}});
    assert_eq!(
        prompts.complete(ours, &caps).await.unwrap(),
        json!({"completion": {"values": [], "hasMore": false}})
    );
    // An upstream's template is still the upstream's to complete.
    let theirs = json!({"ref": {"type": "ref/resource", "uri": "fixture://{name}"}, "argument": {"name": "name", "value": ""}});
    assert_eq!(
        prompts.complete(theirs, &caps).await.unwrap(),
        json!({"completion": {"values": ["up"]}})
    );
}
