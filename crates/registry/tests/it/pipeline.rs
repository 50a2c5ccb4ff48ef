use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use quiver_contract::{
    CallContext, Capabilities, Envelope, ErrKind, HintKind, Part, RenderOptions, ToolError,
    ToolSpec, render,
};
use quiver_registry::{
    Catalog, ConcurrencyConfig, DispatchConfig, Dispatcher, MemoryRecorder, MockToolCallRecorder,
    PolicyAction, PolicyRule, ResultLimitConfig, RulePolicy, TimeoutConfig, UNDEFINED_TOOLS,
};
use serde_json::json;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::support::{add, catalog_with, ctx, dispatcher, echo, tool};

fn text(e: &Envelope) -> String {
    render(e, &RenderOptions::default())
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_valid_call_runs_the_tool() {
    let d = dispatcher(vec![echo(), add()]);
    let e = d.call("echo", json!({"text": "hi"}), ctx()).await;
    assert_eq!(text(&e), "✓ ok.\nhi");
    let e = d.call("add", json!({"a": 2, "b": 40}), ctx()).await;
    assert_eq!(e.data().unwrap()["sum"], 42);
}

#[tokio::test]
async fn unknown_tool_is_distinguishable_and_points_to_tool_search() {
    let d = dispatcher(vec![echo(), add(), search_stub()]);
    let e = d.call("ecko", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::UndefinedTool));
    insta::assert_snapshot!("undefined_tool", text(&e));
    let e = d.call("completely_unrelated", json!({}), ctx()).await;
    insta::assert_snapshot!("undefined_tool_no_alternatives", text(&e));
}

#[tokio::test]
async fn bad_arguments_give_a_schema_hint_naming_path_and_expectation() {
    let d = dispatcher(vec![echo(), add()]);
    let wrong_type = d.call("add", json!({"a": "two", "b": 2}), ctx()).await;
    assert_eq!(wrong_type.hint_kind(), Some(HintKind::Schema));
    insta::assert_snapshot!("schema_hint_wrong_type", text(&wrong_type));
    let missing = d.call("add", json!({"a": 1}), ctx()).await;
    insta::assert_snapshot!("schema_hint_missing", text(&missing));
    let unknown = d.call("echo", json!({"txt": "hi"}), ctx()).await;
    insta::assert_snapshot!("schema_hint_unknown_argument", text(&unknown));
    let not_object = d.call("echo", json!(["hi"]), ctx()).await;
    insta::assert_snapshot!("schema_hint_not_an_object", text(&not_object));
    let malformed = d.call_json("echo", r#"{"text": "hi""#, ctx()).await;
    assert_eq!(malformed.hint_kind(), Some(HintKind::Schema));
    insta::assert_snapshot!("schema_hint_malformed_json", text(&malformed));
    let ok = d.call_json("echo", r#"{"text": "fine"}"#, ctx()).await;
    assert!(ok.is_ok());
}

/// An optional argument written as `anyOf` typed branches (pydantic's `string | None`) is
/// shown by its types in the hint's signature, not as `any`.
#[tokio::test]
async fn a_hint_shows_an_optional_arguments_types() {
    let log = tool(
        ToolSpec::new("git_log", "Shows the commit logs. Use it to read history.")
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {
                    "repo_path": {"type": "string", "description": "The repository."},
                    "since": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "From when."},
                    "anything": {"description": "Untyped."}
                },
                "required": ["repo_path"]
            })),
        |_, _| async move { Ok(Envelope::text("ok")) },
    );
    let d = dispatcher(vec![log]);
    let e = d
        .call("git_log", json!({"since": "2 weeks ago"}), ctx())
        .await;
    let said = text(&e);
    assert!(
        said.contains("Expected {repo_path: string (required), since: string|null, anything: any}"),
        "{said}"
    );
    // An argument its open schema does not name runs, and the model is told it may have
    // been ignored, with the name it may have meant.
    let e = d
        .call(
            "git_log",
            json!({"repo_path": "r", "sinse": "monday"}),
            ctx(),
        )
        .await;
    assert!(e.is_ok(), "{e:?}");
    let said = render(&e, &RenderOptions::default());
    assert!(
        said.contains("⚠ unknown_arguments: the argument `sinse` (did you mean `since`?) is not one of `git_log`: passed on as given, and the tool may have ignored it; its arguments are repo_path, since, anything"),
        "{said}"
    );
    let e = d.call("git_log", json!({"repo_path": "r"}), ctx()).await;
    assert!(!render(&e, &RenderOptions::default()).contains("unknown_arguments"));
}

fn alternative_labels(e: &Envelope) -> Vec<String> {
    match e {
        Envelope::Hint { alternatives, .. } => {
            alternatives.iter().map(|a| a.label.clone()).collect()
        }
        _ => Vec::new(),
    }
}

/// An unknown field inside a nested object is matched against that object's fields, not
/// the tool's top-level arguments (which sent the model's retry astray), and the hint shows
/// the nested object's fields, through a `$ref` too.
#[tokio::test]
async fn a_nested_unknown_field_is_matched_against_its_own_object() {
    let schema = json!({
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "role": {"type": "string"}},
                "required": ["name"],
                "additionalProperties": false
            },
            "mode": {"type": "string"},
            "owner": {"$ref": "#/$defs/Person"}
        },
        "required": ["user"],
        "$defs": {"Person": {
            "type": "object",
            "properties": {"email": {"type": "string"}},
            "required": ["email"],
            "additionalProperties": false
        }}
    });
    let t = tool(
        ToolSpec::new("nested", "Nested.")
            .read_only()
            .with_schema(schema),
        |_, _| async { Ok(Envelope::text("ok")) },
    );
    let d = dispatcher(vec![t]);
    let e = d
        .call("nested", json!({"user": {"name": "a", "mod": "x"}}), ctx())
        .await;
    let labels = alternative_labels(&e);
    assert!(
        !labels.iter().any(|l| l == "mode"),
        "a top-level name offered: {labels:?}"
    );
    assert!(
        text(&e).contains("`/user` takes {name: string (required), role: string}"),
        "{}",
        text(&e)
    );
    let e = d.call("nested", json!({"user": {"nam": "a"}}), ctx()).await;
    let labels = alternative_labels(&e);
    assert_eq!(
        labels.first().map(String::as_str),
        Some("name"),
        "{}",
        text(&e)
    );
    let e = d
        .call(
            "nested",
            json!({"user": {"name": "a"}, "owner": {"emial": "x"}}),
            ctx(),
        )
        .await;
    let labels = alternative_labels(&e);
    assert_eq!(
        labels.first().map(String::as_str),
        Some("email"),
        "{}",
        text(&e)
    );
    assert!(
        text(&e).contains("owner: object")
            && text(&e).contains("`/owner` takes {email: string (required)}"),
        "{}",
        text(&e)
    );
}

#[tokio::test]
async fn oversized_input_is_refused_with_the_limit() {
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .config(DispatchConfig::default().with_max_input_bytes(1000))
        .build();
    let e = d
        .call("echo", json!({"text": "x".repeat(2000)}), ctx())
        .await;
    assert_eq!(
        e.err_kind(),
        Some(&ErrKind::Other("input_too_large".into()))
    );
    assert!(text(&e).contains("the limit is 1000 bytes"), "{}", text(&e));
    // A tool that is not there, or one the policy refuses, is told so whatever the size or
    // shape of its arguments.
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .config(DispatchConfig::default().with_max_input_bytes(1000))
        .policy(Arc::new(RulePolicy::new(vec![PolicyRule::new(
            "no-echo",
            "echo",
            PolicyAction::Deny,
            "echo is off",
        )])))
        .build();
    for input in [json!({"text": "x".repeat(2000)}), json!([1, 2])] {
        let e = d.call("echo", input.clone(), ctx()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied), "{}", text(&e));
        let e = d.call("ecko", input, ctx()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::UndefinedTool), "{}", text(&e));
    }
}

/// A hint goes to the model before any result cap: a huge wrong value or a huge unknown
/// argument name is quoted in part, not whole.
#[tokio::test]
async fn a_schema_hint_quotes_a_huge_value_in_part() {
    let d = dispatcher(vec![echo(), add()]);
    let huge = "9".repeat(900_000);
    let e = d.call("add", json!({"a": huge, "b": 2}), ctx()).await;
    assert_eq!(e.hint_kind(), Some(HintKind::Schema));
    let shown = text(&e);
    assert!(shown.len() < 2_000, "{} bytes", shown.len());
    assert!(shown.contains("`/a`: \"999"), "{shown}");
    let e = d
        .call("echo", json!({"text": "hi", "x".repeat(100_000): 1}), ctx())
        .await;
    let shown = text(&e);
    assert!(shown.len() < 2_000, "{} bytes", shown.len());
    assert!(shown.contains("unknown argument `xxx"), "{shown}");
    // Many unknown names: the first ten are listed, and counted.
    let mut many = serde_json::Map::new();
    many.insert("text".into(), json!("hi"));
    for i in 0..20_000 {
        many.insert(format!("tex{i}"), json!(1));
    }
    let e = d.call("echo", serde_json::Value::Object(many), ctx()).await;
    let shown = text(&e);
    assert!(shown.len() < 4_000, "{} bytes", shown.len());
    assert!(
        shown.contains("20000 unknown arguments (the first 10 follow)"),
        "{shown}"
    );
    let quiver_contract::Envelope::Hint { alternatives, .. } = &e else {
        panic!("a hint: {shown}");
    };
    assert!(alternatives.len() <= 30, "{}", alternatives.len());
}

/// The log row says who called: the principal (the inbound token's name) of the call's
/// context, for calls that ran and for calls refused before they ran.
#[tokio::test]
async fn the_record_names_who_called() {
    let recorder = Arc::new(MemoryRecorder::new());
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .recorder(recorder.clone())
        .build();
    d.call("echo", json!({"text": "hi"}), ctx().with_principal("ci"))
        .await;
    d.call("nope", json!({}), ctx().with_principal("ci")).await;
    d.call("echo", json!({"text": "hi"}), ctx()).await;
    let records = recorder.records();
    let who: Vec<Option<&str>> = records.iter().map(|r| r.principal.as_deref()).collect();
    assert_eq!(who, [Some("ci"), Some("ci"), None]);
}

/// Narration is not counted as input, so it is capped: it cannot carry what
/// `max_input_bytes` refuses into the context and the log.
#[tokio::test]
async fn narration_is_capped() {
    let recorder = Arc::new(MemoryRecorder::new());
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .recorder(recorder.clone())
        .build();
    let e = d
        .call(
            "echo",
            json!({"text": "hi", "reasoning": "r".repeat(1_000_000)}),
            ctx(),
        )
        .await;
    assert!(e.is_ok(), "{}", text(&e));
    let kept = recorder.records()[0].reasoning.clone().unwrap();
    assert!(kept.chars().count() <= 4000, "{} chars", kept.len());
    assert!(kept.starts_with("rrr"));
}

#[tokio::test]
async fn narration_is_stripped_into_the_context_and_recorded() {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let t = tool(
        ToolSpec::new("look", "Looks.").read_only().with_schema(json!({
            "type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": false
        })),
        move |input, ctx: CallContext| {
            let seen = seen2.clone();
            async move {
                *seen.lock().unwrap() = Some((input, ctx.reasoning.clone()));
                Ok(Envelope::text("done"))
            }
        },
    );
    let recorder = Arc::new(MemoryRecorder::new());
    let d = Dispatcher::builder(catalog_with(vec![t]))
        .recorder(recorder.clone())
        .build();
    let e = d
        .call(
            "look",
            json!({"q": "x", "reasoning": "need x", "thought": "hmm", "explanation": 3}),
            ctx(),
        )
        .await;
    assert!(e.is_ok(), "{}", text(&e));
    let (input, reasoning) = seen.lock().unwrap().clone().unwrap();
    assert_eq!(input, json!({"q": "x"}));
    assert_eq!(reasoning.as_deref(), Some("need x"));
    let rec = &recorder.records()[0];
    assert_eq!(rec.reasoning.as_deref(), Some("need x"));
    assert_eq!(rec.input, json!({"q": "x"}));
    assert_eq!(
        rec.args_hash,
        quiver_contract::args_hash("look", &json!({"q": "x"}))
    );
    // A `reasoning` that is not a string is refused with a hint naming the shape; the
    // tool does not run, and the refusal has its row.
    for bad in [json!({"steps": [1, 2]}), json!(5), json!(["a"])] {
        let before = recorder.records().len();
        let e = d
            .call("look", json!({"q": "z", "reasoning": bad}), ctx())
            .await;
        assert_eq!(e.hint_kind(), Some(HintKind::Schema), "{bad}: {e:?}");
        assert!(
            text(&e).contains("`reasoning` must be a string"),
            "{bad}: {}",
            text(&e)
        );
        assert_eq!(
            recorder.records().len(),
            before + 1,
            "{bad}: the refusal is logged"
        );
        let (input, _) = seen.lock().unwrap().clone().unwrap();
        assert_ne!(input, json!({"q": "z"}), "{bad}: the tool did not run");
    }
    // The other narration keys, which nothing advertises, are taken as their JSON text;
    // null and blank narration is none, and the next key is used.
    for (args, kept) in [
        (
            json!({"q": "a", "thought": {"steps": [1, 2]}}),
            Some(r#"{"steps":[1,2]}"#),
        ),
        (json!({"q": "b", "explanation": 5}), Some("5")),
        (
            json!({"q": "c", "reasoning": null, "thought": "second"}),
            Some("second"),
        ),
        (json!({"q": "d", "reasoning": "  "}), None),
    ] {
        let e = d.call("look", args.clone(), ctx()).await;
        assert!(e.is_ok(), "{args}: {}", text(&e));
        let (input, reasoning) = seen.lock().unwrap().clone().unwrap();
        assert_eq!(input, json!({"q": args["q"]}), "{args}");
        assert_eq!(reasoning.as_deref(), kept, "{args}");
        let rec = recorder.records().last().unwrap().clone();
        assert_eq!(rec.reasoning.as_deref(), kept, "{args}");
    }
}

#[tokio::test]
async fn a_declared_reasoning_argument_is_not_stripped() {
    let t = tool(
        ToolSpec::new("plan", "Plans.").with_schema(json!({
            "type": "object", "properties": {"reasoning": {"type": "string"}}, "required": ["reasoning"]
        })),
        |input, _| async move { Ok(Envelope::text(input["reasoning"].as_str().unwrap_or("none").to_owned())) },
    );
    let d = dispatcher(vec![t]);
    let e = d.call("plan", json!({"reasoning": "step 1"}), ctx()).await;
    assert_eq!(text(&e), "✓ ok.\nstep 1");
}

/// A narration-named argument declared through `$ref` / `allOf` is a real argument too.
#[tokio::test]
async fn a_narration_argument_declared_through_a_ref_is_not_stripped() {
    let t = tool(
        ToolSpec::new("why", "Explains.").with_schema(json!({
            "allOf": [{"$ref": "#/$defs/A"}],
            "$defs": {"A": {"type": "object", "required": ["explanation"],
                            "properties": {"explanation": {"type": "string"}}}}
        })),
        |input, _| async move {
            Ok(Envelope::text(
                input["explanation"].as_str().unwrap_or("none").to_owned(),
            ))
        },
    );
    let d = dispatcher(vec![t]);
    let e = d
        .call("why", json!({"explanation": "because"}), ctx())
        .await;
    assert_eq!(text(&e), "✓ ok.\nbecause");
}

#[tokio::test]
async fn a_panicking_tool_becomes_an_err_naming_the_tool() {
    let t = tool(ToolSpec::new("boom", "Crashes."), |_, _| async {
        panic!("index out of range")
    });
    let d = dispatcher(vec![t, echo()]);
    let e = d.call("boom", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::Panic));
    insta::assert_snapshot!("panic", text(&e));
    // The dispatcher keeps working.
    assert!(
        d.call("echo", json!({"text": "still here"}), ctx())
            .await
            .is_ok()
    );
}

fn hanging(name: &str) -> Arc<dyn quiver_contract::Tool> {
    tool(
        ToolSpec::new(name, "Never finishes.").read_only(),
        |_, _| async {
            std::future::pending::<()>().await;
            Ok(Envelope::text("unreachable"))
        },
    )
}

#[tokio::test]
async fn timeouts_use_the_default_the_override_and_a_shorter_caller_deadline() {
    let cfg = DispatchConfig::default().with_timeout(
        TimeoutConfig::default()
            .with_default(Duration::from_millis(50))
            .with_tool("slow", Duration::from_millis(80)),
    );
    let d = Dispatcher::builder(catalog_with(vec![hanging("hang"), hanging("slow")]))
        .config(cfg)
        .build();
    let e = d.call("hang", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::Timeout));
    assert!(text(&e).contains("within its 50 ms limit"), "{}", text(&e));
    let e = d.call("slow", json!({}), ctx()).await;
    assert!(text(&e).contains("within its 80 ms limit"), "{}", text(&e));
    let short = ctx().with_deadline(Instant::now() + Duration::from_millis(20));
    let e = d.call("slow", json!({}), short).await;
    assert!(
        text(&e).contains("of the caller's deadline"),
        "{}",
        text(&e)
    );
}

/// A reconfigured dispatcher applies its new limits to the next call, while a call that
/// started before finishes under the limits it started with, and the queues of unchanged
/// concurrency limits are kept.
#[tokio::test]
async fn reconfigured_limits_apply_to_the_next_call() {
    let (release, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (released, starting) = (release.clone(), started.clone());
    let gate = tool(ToolSpec::new("gate", "Waits.").read_only(), move |_, _| {
        let (released, starting) = (released.clone(), starting.clone());
        async move {
            starting.notify_one();
            released.notified().await;
            Ok(Envelope::text("z".repeat(300)))
        }
    });
    let cfg = DispatchConfig::default()
        .with_timeout(TimeoutConfig::default().with_default(Duration::from_secs(30)))
        .with_concurrency(ConcurrencyConfig::default().with_tool("gate", 1));
    let d = Dispatcher::builder(catalog_with(vec![gate, hanging("hang")]))
        .config(cfg.clone())
        .build();
    let before = {
        let d = d.clone();
        tokio::spawn(async move { d.call("gate", json!({"n": 1}), ctx()).await })
    };
    started.notified().await;
    let next = cfg
        .clone()
        .with_timeout(TimeoutConfig::default().with_default(Duration::from_millis(50)))
        .with_result_limit(ResultLimitConfig::default().with_max_chars(100));
    d.reconfigure(next.clone());
    assert_eq!(*d.config(), next);
    let e = d.call("hang", json!({}), ctx()).await;
    assert!(text(&e).contains("within its 50 ms limit"), "{}", text(&e));
    // The per-tool limit did not change: its queue holds, and the call waiting in it
    // times out under the new limit without starting.
    let e = d.call("gate", json!({"n": 2}), ctx()).await;
    assert!(text(&e).contains("never started"), "{}", text(&e));
    release.notify_one();
    let e = before.await.unwrap();
    let Envelope::Ok { data, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        data.as_str().unwrap(),
        "z".repeat(300),
        "the running call keeps the limits it started with"
    );
    // A permit stored before the call: it runs straight through.
    release.notify_one();
    let e = d.call("gate", json!({"n": 3}), ctx()).await;
    let Envelope::Ok { data, .. } = &e else {
        panic!("{e:?}")
    };
    let s = data.as_str().unwrap();
    assert!(
        s.contains("left out here") && s.chars().count() < 300,
        "the next call is shortened to the new limit: {s}"
    );
}

/// A slot that comes free at a queued call's deadline does not start it: its caller is told
/// it never started, so running it then would do what the caller was told was not done
/// (and each such call frees the slot for the next overdue one, so they all ran).
#[tokio::test(start_paused = true)]
async fn a_slot_freed_at_the_deadline_does_not_start_an_overdue_call() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let starts = Arc::new(AtomicUsize::new(0));
    let counted = starts.clone();
    let hang = tool(
        ToolSpec::new("hang", "Never finishes.").read_only(),
        move |_, _| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok(Envelope::text("unreachable"))
            }
        },
    );
    let cfg = DispatchConfig::default()
        .with_timeout(TimeoutConfig::default().with_default(Duration::from_millis(300)))
        .with_concurrency(ConcurrencyConfig::default().with_tool("hang", 1));
    let d = Dispatcher::builder(catalog_with(vec![hang]))
        .config(cfg)
        .build();
    // All five have the same deadline; the first holds the slot until then.
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let d = d.clone();
            tokio::spawn(async move { d.call("hang", json!({"i": i}), ctx()).await })
        })
        .collect();
    let mut never_started = 0;
    for call in calls {
        let e = call.await.unwrap();
        assert_eq!(e.err_kind(), Some(&ErrKind::Timeout), "{e:?}");
        never_started += usize::from(text(&e).contains("never started"));
    }
    assert_eq!(
        starts.load(Ordering::SeqCst),
        1,
        "the tool ran more than once"
    );
    assert_eq!(never_started, 4);
}

/// A call that timed out waiting for a slot never ran: its message says so, not that the
/// tool was too slow.
#[tokio::test]
async fn a_call_timed_out_in_the_queue_says_it_never_started() {
    let cfg = DispatchConfig::default()
        .with_timeout(TimeoutConfig::default().with_default(Duration::from_secs(2)))
        .with_concurrency(ConcurrencyConfig::default().with_tool("hang", 1));
    let d = Dispatcher::builder(catalog_with(vec![hanging("hang")]))
        .config(cfg)
        .build();
    let first = tokio::spawn({
        let d = d.clone();
        async move { d.call("hang", json!({}), ctx()).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Its deadline comes well before the running call's, so it is still queued then (the
    // margins leave room for a loaded machine's late timers).
    let short = ctx().with_deadline(Instant::now() + Duration::from_millis(200));
    let queued = d.call("hang", json!({}), short).await;
    assert_eq!(queued.err_kind(), Some(&ErrKind::Timeout));
    assert!(
        text(&queued).contains("for a free slot behind other calls in flight and never started"),
        "{}",
        text(&queued)
    );
    let ran = first.await.unwrap();
    assert!(
        text(&ran).contains("within its 2 s limit"),
        "{}",
        text(&ran)
    );
}

/// A tool that times out on its own just before the deadline the timeout layer gave it (an
/// MCP upstream measures the time left when it sends the call) is reported in the layer's
/// words: the configured limit and, when most of it went by in the queue, that wait; not
/// the remainder the tool saw ("did not answer within 201 ms").
#[tokio::test]
async fn a_tools_own_timeout_at_the_deadline_names_the_configured_limit() {
    let up = tool(
        ToolSpec::new("up", "Answers at its deadline.").read_only(),
        |_, ctx: CallContext| async move {
            let deadline = ctx.deadline.expect("the timeout layer sets one");
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep_until((deadline - Duration::from_millis(5)).into()).await;
            Ok(Envelope::err(
                ErrKind::Timeout,
                format!("the server did not answer within {} ms", left.as_millis()),
            ))
        },
    );
    let cfg = DispatchConfig::default()
        .with_timeout(TimeoutConfig::default().with_default(Duration::from_millis(400)))
        .with_concurrency(ConcurrencyConfig::default().with_tool("up", 1));
    let d = Dispatcher::builder(catalog_with(vec![up]))
        .config(cfg)
        .build();
    let first = tokio::spawn({
        let d = d.clone();
        async move { d.call("up", json!({}), ctx()).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let queued = d.call("up", json!({}), ctx()).await;
    let first = first.await.unwrap();
    assert_eq!(first.err_kind(), Some(&ErrKind::Timeout), "{first:?}");
    assert!(
        text(&first)
            .contains("did not finish within its 400 ms limit; the call was abandoned. Try")
            && !text(&first).contains("may have run"),
        "a read-only tool changed nothing: {}",
        text(&first)
    );
    assert_eq!(queued.err_kind(), Some(&ErrKind::Timeout), "{queued:?}");
    assert!(
        text(&queued).contains("did not finish within its 400 ms limit (")
            && text(&queued).contains("of it waiting for a free slot behind other calls)"),
        "{}",
        text(&queued)
    );
}

#[tokio::test]
async fn concurrency_limits_queue_and_waiting_respects_cancellation() {
    let running = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Notify::new());
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let started_tx = Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let (r2, rel2) = (running.clone(), release.clone());
    let t = tool(ToolSpec::new("gate", "Waits.").read_only(), move |_, _| {
        let (running, release, started) = (r2.clone(), rel2.clone(), started_tx.clone());
        async move {
            running.fetch_add(1, Ordering::SeqCst);
            if let Some(tx) = started.lock().unwrap().take() {
                let _ = tx.send(());
            }
            release.notified().await;
            Ok(Envelope::text("done"))
        }
    });
    let cfg = DispatchConfig::default()
        .with_concurrency(ConcurrencyConfig::default().with_tool("gate", 1));
    let recorder = Arc::new(MemoryRecorder::new());
    let d = Dispatcher::builder(catalog_with(vec![t]))
        .config(cfg)
        .recorder(recorder.clone())
        .build();
    let first = tokio::spawn({
        let d = d.clone();
        async move {
            d.call("gate", json!({}), CallContext::for_session("a"))
                .await
        }
    });
    tokio::time::timeout(WAIT, started_rx)
        .await
        .unwrap()
        .unwrap();
    let cancel = CancellationToken::new();
    let second = tokio::spawn({
        let d = d.clone();
        let ctx = CallContext::for_session("b").with_cancel(cancel.clone());
        async move { d.call("gate", json!({}), ctx).await }
    });
    tokio::task::yield_now().await;
    cancel.cancel();
    let e = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    assert_eq!(e.err_kind(), Some(&ErrKind::Cancelled));
    assert_eq!(
        running.load(Ordering::SeqCst),
        1,
        "the queued call never ran"
    );
    release.notify_one();
    assert!(
        tokio::time::timeout(WAIT, first)
            .await
            .unwrap()
            .unwrap()
            .is_ok()
    );
    assert_eq!(recorder.len(), 2);
}

/// A call whose future is dropped mid-run (an HTTP client that went away while the call
/// ran in its request's task) is still recorded, as cancelled.
#[tokio::test]
async fn a_dropped_call_is_still_recorded() {
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let started_tx = Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let t = tool(
        ToolSpec::new("hang", "Never ends.").read_only(),
        move |_, _| {
            let started = started_tx.clone();
            async move {
                if let Some(tx) = started.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                std::future::pending::<()>().await;
                Ok(Envelope::text("never"))
            }
        },
    );
    let recorder = Arc::new(MemoryRecorder::new());
    let d = Dispatcher::builder(catalog_with(vec![t]))
        .recorder(recorder.clone())
        .build();
    let call = tokio::spawn({
        let d = d.clone();
        async move { d.call("hang", json!({"x": 1}), ctx()).await }
    });
    tokio::time::timeout(WAIT, started_rx)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recorder.len(), 0);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    tokio::time::timeout(WAIT, async {
        while recorder.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dropped call is recorded");
    let records = recorder.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].tool_name, "hang");
    assert_eq!(records[0].input, json!({"x": 1}));
    assert_eq!(records[0].session.as_deref(), Some("s1"));
    assert_eq!(records[0].envelope.err_kind(), Some(&ErrKind::Cancelled));
    assert!(text(&records[0].envelope).contains("caller went away"));
}

/// A recorder whose buffer is full until `room` is notified (the store's channel under
/// load).
struct FullRecorder {
    room: Notify,
    waiting: Notify,
    inner: MemoryRecorder,
}

#[async_trait::async_trait]
impl quiver_registry::ToolCallRecorder for FullRecorder {
    async fn record(&self, record: quiver_registry::CallRecord) {
        self.waiting.notify_one();
        self.room.notified().await;
        self.inner.record(record).await;
    }
}

/// A caller that goes away while its finished call's record waits for room in the
/// recorder does not take the record with it.
#[tokio::test]
async fn a_record_waiting_for_room_survives_its_caller() {
    let recorder = Arc::new(FullRecorder {
        room: Notify::new(),
        waiting: Notify::new(),
        inner: MemoryRecorder::new(),
    });
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .recorder(recorder.clone())
        .build();
    let call = tokio::spawn({
        let d = d.clone();
        async move { d.call("echo", json!({"text": "hi"}), ctx()).await }
    });
    tokio::time::timeout(WAIT, recorder.waiting.notified())
        .await
        .expect("the record reached the recorder");
    call.abort();
    let _ = call.await;
    recorder.room.notify_one();
    tokio::time::timeout(WAIT, async {
        while recorder.inner.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the record is handed over after its caller went away");
    let records = recorder.inner.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].tool_name, "echo");
    assert!(records[0].envelope.is_ok());

    // Shutting down waits for such a hand-over before the store closes.
    let call = tokio::spawn({
        let d = d.clone();
        async move { d.call("echo", json!({"text": "again"}), ctx()).await }
    });
    tokio::time::timeout(WAIT, recorder.waiting.notified())
        .await
        .expect("the second record reached the recorder");
    call.abort();
    let _ = call.await;
    let drained = tokio::spawn({
        let d = d.clone();
        async move { d.drain_records().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!drained.is_finished(), "a record is still waiting for room");
    recorder.room.notify_one();
    tokio::time::timeout(WAIT, drained)
        .await
        .expect("drained once handed over")
        .unwrap();
    assert_eq!(recorder.inner.records().len(), 2);
}

#[tokio::test]
async fn results_are_limited_in_characters_and_parts_in_bytes() {
    let t = tool(
        ToolSpec::new("big", "Big output.").read_only(),
        |_, _| async {
            Ok(Envelope::text("ж".repeat(500))
                .with_part(Part::image("image/png", "a".repeat(60)))
                .with_part(Part::image("image/png", "b".repeat(60))))
        },
    );
    let rows = tool(ToolSpec::new("rows", "Rows.").read_only(), |_, _| async {
        Ok(Envelope::ok(json!(
            (0..100).map(|i| json!({"i": i})).collect::<Vec<_>>()
        )))
    });
    let cfg = DispatchConfig::default().with_result_limit(
        ResultLimitConfig::default()
            .with_max_chars(100)
            .with_max_part_bytes(100),
    );
    let d = Dispatcher::builder(catalog_with(vec![t, rows]))
        .config(cfg)
        .build();
    let with_id = |id: &str| {
        let mut c = ctx();
        c.call_id = Some(id.into());
        c
    };
    let e = d.call("big", json!({}), with_id("c1")).await;
    let Envelope::Ok {
        data,
        warnings,
        parts,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    let s = data.as_str().unwrap();
    let (head, rest) = s
        .split_once("\n…[")
        .expect("the marker between head and tail");
    let tail = rest.split_once("]…\n").expect("the marker ends").1;
    assert!(
        head.chars().count() + tail.chars().count() <= 100,
        "head and tail are within the budget: {s}"
    );
    assert!(!head.is_empty() && !tail.is_empty(), "{s}");
    assert_eq!(parts.len(), 1);
    let kinds: Vec<_> = warnings.iter().map(|w| w.kind.as_str()).collect();
    assert_eq!(kinds, vec!["truncated", "parts_dropped"]);
    insta::assert_snapshot!("truncated", text(&e));
    // The whole text is kept for the session: page 2 starts where the head stopped.
    let kept = d
        .kept_results()
        .get("s1", "c1")
        .expect("kept for the session");
    assert_eq!(kept.1.whole_text(), "ж".repeat(500));
    assert!(
        d.kept_results().get("other", "c1").is_none(),
        "only for its session"
    );
    let e = d.call("rows", json!({}), with_id("c2")).await;
    let Envelope::Ok {
        rows,
        data,
        warnings,
        ..
    } = &e
    else {
        panic!()
    };
    assert_eq!(*rows, 100, "the true row count survives paging");
    let page = data.as_array().expect("a page of whole items");
    assert!(!page.is_empty() && page.len() < 100, "{page:?}");
    assert_eq!(page[0], json!({"i": 0}));
    assert_eq!(warnings[0].kind, "paged");
    insta::assert_snapshot!("paged", text(&e));
    // Without a session nothing is kept, and the note says how to get less instead.
    let mut anonymous = CallContext::default();
    anonymous.call_id = Some("c3".into());
    let e = d.call("rows", json!({}), anonymous).await;
    insta::assert_snapshot!("paged_not_kept", text(&e));
}

/// Structured data is measured as the model reads it, pretty-printed: deeply nested data
/// whose compact form fits the limit but whose rendering is several times longer is cut
/// (it went through whole), and the cut text keeps the pretty layout.
#[tokio::test]
async fn nested_data_is_limited_as_it_is_rendered() {
    let mut deep = json!("leaf");
    for _ in 0..30 {
        deep = json!({ "k": deep });
    }
    let compact = deep.to_string().chars().count();
    let pretty = serde_json::to_string_pretty(&deep).unwrap().chars().count();
    let limit = 400;
    assert!(
        compact < limit && pretty > 2 * limit,
        "{compact} / {pretty}"
    );
    let data = deep.clone();
    let t = tool(ToolSpec::new("deep", "Deep.").read_only(), move |_, _| {
        let data = data.clone();
        async move { Ok(Envelope::ok(data)) }
    });
    let d = Dispatcher::builder(catalog_with(vec![t]))
        .config(
            DispatchConfig::default()
                .with_result_limit(ResultLimitConfig::default().with_max_chars(limit)),
        )
        .build();
    let e = d.call("deep", json!({}), ctx()).await;
    let Envelope::Ok { data, warnings, .. } = &e else {
        panic!("{e:?}")
    };
    // One nested value, no items to page by: shaped as its pretty text.
    let s = data.as_str().expect("cut to text");
    let (head, rest) = s
        .split_once("\n…[")
        .expect("the marker between head and tail");
    let tail = rest.split_once("]…\n").expect("the marker ends").1;
    assert!(head.chars().count() + tail.chars().count() <= limit, "{s}");
    assert!(s.starts_with("{\n  \"k\": {"), "{s}");
    assert!(
        warnings[0].message.contains(&format!(
            "({} characters)",
            quiver_registry::shape::thousands(pretty)
        )),
        "{:?}",
        warnings
    );
}

#[tokio::test]
async fn telemetry_counts_outcomes_per_tool() {
    let d = dispatcher(vec![echo(), add()]);
    d.call("echo", json!({"text": "a"}), ctx()).await;
    d.call("echo", json!({"text": "b"}), ctx()).await;
    d.call("echo", json!({}), ctx()).await;
    d.call("nope", json!({}), ctx()).await;
    let echo = d.metrics().tool("echo");
    assert_eq!((echo.ok, echo.hint, echo.err), (2, 1, 0));
    assert_eq!(echo.hint_kinds.get("schema"), Some(&1));
    assert_eq!(
        d.metrics()
            .tool(UNDEFINED_TOOLS)
            .err_kinds
            .get("undefined_tool"),
        Some(&1),
        "made-up names share one counter"
    );
    assert_eq!(d.metrics().tool("nope").err, 0);
}

#[tokio::test]
async fn policy_denies_or_warns_with_growing_emphasis() {
    let policy = RulePolicy::new(vec![
        PolicyRule::new(
            "no-add-for-guests",
            "add",
            PolicyAction::Deny,
            "guests may not add",
        )
        .for_tenant("guest"),
        PolicyRule::new(
            "preview-first",
            "add",
            PolicyAction::Warn,
            "call `echo` before `add`",
        )
        .requires_prior("echo"),
    ]);
    let d = Dispatcher::builder(catalog_with(vec![echo(), add()]))
        .policy(Arc::new(policy))
        .build();
    let denied = d
        .call(
            "add",
            json!({"a": 1, "b": 1}),
            CallContext::for_session("g").with_tenant("guest"),
        )
        .await;
    assert_eq!(denied.err_kind(), Some(&ErrKind::PolicyDenied));
    insta::assert_snapshot!("policy_denied", text(&denied));
    let mut warnings = Vec::new();
    for i in 0..3 {
        let e = d.call("add", json!({"a": i, "b": 1}), ctx()).await;
        assert!(e.is_ok());
        warnings.push(text(&e));
    }
    insta::assert_snapshot!("policy_warnings", warnings.join("\n---\n"));
    assert_eq!(d.metrics().tool("add").policy_violations, 4);
    d.call("echo", json!({"text": "now"}), ctx()).await;
    let after = d.call("add", json!({"a": 9, "b": 1}), ctx()).await;
    assert!(
        after.warnings().is_empty(),
        "the prior tool was called: {}",
        text(&after)
    );
}

/// A deny rule whose pattern also covers the tool it requires first does not refuse that
/// tool: the call that satisfies the rule runs, and the rule then lets the others through.
#[tokio::test]
async fn a_rule_never_holds_back_the_tool_it_requires_first() {
    let policy = RulePolicy::new(vec![
        PolicyRule::new(
            "echo-first",
            "*",
            PolicyAction::Deny,
            "call `echo` before any other tool",
        )
        .requires_prior("echo"),
    ]);
    let d = Dispatcher::builder(catalog_with(vec![echo(), add()]))
        .policy(Arc::new(policy))
        .build();
    let refused = d.call("add", json!({"a": 1, "b": 2}), ctx()).await;
    assert_eq!(
        refused.err_kind(),
        Some(&ErrKind::PolicyDenied),
        "{}",
        text(&refused)
    );
    let first = d.call("echo", json!({"text": "hi"}), ctx()).await;
    assert!(first.is_ok(), "{}", text(&first));
    let then = d.call("add", json!({"a": 1, "b": 2}), ctx()).await;
    assert!(then.is_ok(), "{}", text(&then));
}

/// A repeat the loop guard refuses did not run, so it is not one more skipping of a warn
/// policy: after three warned calls and three refused repeats, the next call is the fourth
/// skipping, not the seventh.
#[tokio::test]
async fn loop_guard_refusals_are_not_counted_as_policy_skips() {
    let policy = RulePolicy::new(vec![
        PolicyRule::new(
            "preview-first",
            "add",
            PolicyAction::Warn,
            "call `echo` before `add`",
        )
        .requires_prior("echo"),
    ]);
    let d = Dispatcher::builder(catalog_with(vec![echo(), add()]))
        .policy(Arc::new(policy))
        .build();
    let mut refused = 0;
    for _ in 0..6 {
        let e = d.call("add", json!({"a": 1, "b": 2}), ctx()).await;
        if e.err_kind() == Some(&ErrKind::LoopGuard) {
            refused += 1;
        }
    }
    assert_eq!(refused, 3);
    let next = d.call("add", json!({"a": 5, "b": 2}), ctx()).await;
    let shown = text(&next);
    assert!(
        shown.contains("skipped policy `preview-first` 4 times"),
        "{shown}"
    );
    // The metric counts the same: the refused repeats were not violations.
    assert_eq!(d.metrics().tool("add").policy_violations, 4);
}

/// A session continued in a new process counts as called what the live process counted:
/// the calls that answered (Ok or a Hint). A prior that failed (an upstream that was not
/// available, a tool's own error kind) did not happen as `requires_prior` means it, live or
/// restored; once it answers, it does.
#[tokio::test]
async fn restored_calls_count_what_the_live_process_counted() {
    let fails = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fails.clone();
    let down = tool(
        ToolSpec::new("down", "Fails until it is up."),
        move |_, _| {
            let failing = f.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                if failing {
                    Err(ToolError::err(
                        ErrKind::NotAvailable,
                        "the upstream is down",
                    ))
                } else {
                    Ok(Envelope::text("up"))
                }
            }
        },
    );
    let quota = tool(ToolSpec::new("quota", "Fails its own way."), |_, _| async {
        Err(ToolError::err(
            ErrKind::Other("quota_exceeded".into()),
            "over quota",
        ))
    });
    let rules = || {
        RulePolicy::new(vec![
            PolicyRule::new("a", "add", PolicyAction::Deny, "call down first")
                .requires_prior("down"),
            PolicyRule::new("e", "echo", PolicyAction::Deny, "call quota first")
                .requires_prior("quota"),
        ])
    };
    let log = Arc::new(quiver_registry::store::MemoryCallLog::new());
    let live = Dispatcher::builder(catalog_with(vec![
        echo(),
        add(),
        down.clone(),
        quota.clone(),
    ]))
    .policy(Arc::new(rules()))
    .recorder(log.clone())
    .build();
    let s = || CallContext::for_session("s");
    assert!(live.call("down", json!({}), s()).await.is_err());
    assert!(live.call("quota", json!({}), s()).await.is_err());
    live.drain_records().await;
    let restored = || async {
        let d = Dispatcher::builder(catalog_with(vec![
            echo(),
            add(),
            down.clone(),
            quota.clone(),
        ]))
        .policy(Arc::new(rules()))
        .build();
        d.restore_called("s", &*log).await.unwrap();
        d
    };
    let first = restored().await;
    for d in [&live, &first] {
        let e = d.call("add", json!({"a": 1, "b": 2}), s()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied), "{}", text(&e));
        assert!(text(&e).contains("call down first"), "{}", text(&e));
        let e = d.call("echo", json!({"text": "x"}), s()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied), "{}", text(&e));
    }
    fails.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(live.call("down", json!({}), s()).await.is_ok());
    live.drain_records().await;
    let second = restored().await;
    for d in [&live, &second] {
        let e = d.call("add", json!({"a": 1, "b": 2}), s()).await;
        assert!(e.is_ok(), "{}", text(&e));
    }
}

/// Neither a schema hint the tool itself returned (it ran, and refused its input) nor the
/// dispatcher's refusal of bad arguments (the tool never ran) counts as called, live or
/// after a restart: only an Ok does.
#[tokio::test]
async fn restored_calls_count_neither_a_tools_schema_hint_nor_refused_arguments() {
    let picky = tool(ToolSpec::new("picky", "Checks dates."), |_, _| async {
        Ok(Envelope::hint(
            HintKind::Schema,
            "the date must be YYYY-MM-DD",
            Vec::new(),
        ))
    });
    let other = tool(ToolSpec::new("other", "Something else."), |_, _| async {
        Ok(Envelope::text("done"))
    });
    let rules = || {
        RulePolicy::new(vec![
            PolicyRule::new("e", "echo", PolicyAction::Deny, "call picky first")
                .requires_prior("picky"),
            PolicyRule::new("o", "other", PolicyAction::Deny, "call add first")
                .requires_prior("add"),
        ])
    };
    let tools = || vec![echo(), add(), picky.clone(), other.clone()];
    let log = Arc::new(quiver_registry::store::MemoryCallLog::new());
    let live = Dispatcher::builder(catalog_with(tools()))
        .policy(Arc::new(rules()))
        .recorder(log.clone())
        .build();
    let s = || CallContext::for_session("s");
    let e = live.call("picky", json!({}), s()).await;
    assert_eq!(e.hint_kind(), Some(HintKind::Schema), "{}", text(&e));
    let e = live.call("add", json!({"a": "one"}), s()).await;
    assert_eq!(e.hint_kind(), Some(HintKind::Schema), "{}", text(&e));
    let e = live.call_json("add", "[1, 2]", s()).await;
    assert_eq!(e.hint_kind(), Some(HintKind::Schema), "{}", text(&e));
    live.drain_records().await;
    let restored = Dispatcher::builder(catalog_with(tools()))
        .policy(Arc::new(rules()))
        .build();
    restored.restore_called("s", &*log).await.unwrap();
    // Neither counts: the tool's own schema hint showed nothing (it refused its input),
    // and the dispatcher's refusal never reached the tool.
    for d in [&live, &restored] {
        let e = d.call("echo", json!({"text": "x"}), s()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied), "{}", text(&e));
        let e = d.call("other", json!({}), s()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied), "{}", text(&e));
    }
}

/// A rule's tool pattern and its required earlier tool take `*` anywhere in the name.
#[tokio::test]
async fn policy_patterns_take_a_star_anywhere() {
    let policy = RulePolicy::new(vec![
        PolicyRule::new("no-dd", "*d*", PolicyAction::Deny, "nothing with a d")
            .for_tenant("strict"),
        PolicyRule::new(
            "look-first",
            "a*d",
            PolicyAction::Deny,
            "echo something first",
        )
        .requires_prior("e*o"),
    ]);
    let d = Dispatcher::builder(catalog_with(vec![echo(), add()]))
        .policy(Arc::new(policy))
        .build();
    let strict = CallContext::for_session("s").with_tenant("strict");
    let e = d.call("add", json!({"a": 1, "b": 1}), strict).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied));
    assert!(text(&e).contains("nothing with a d"), "{}", text(&e));
    let e = d.call("add", json!({"a": 1, "b": 1}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::PolicyDenied));
    assert!(text(&e).contains("echo something first"), "{}", text(&e));
    assert!(d.call("echo", json!({"text": "hi"}), ctx()).await.is_ok());
    let e = d.call("add", json!({"a": 1, "b": 1}), ctx()).await;
    assert!(e.is_ok(), "a tool matching `e*o` was called: {}", text(&e));
}

#[tokio::test]
async fn the_fourth_identical_call_in_a_row_is_refused_ignoring_narration() {
    let d = dispatcher(vec![echo()]);
    for reason in ["a", "b", "c"] {
        let e = d
            .call("echo", json!({"text": "same", "reasoning": reason}), ctx())
            .await;
        assert!(e.is_ok());
    }
    let e = d
        .call("echo", json!({"text": "same", "reasoning": "d"}), ctx())
        .await;
    assert_eq!(e.err_kind(), Some(&ErrKind::LoopGuard));
    insta::assert_snapshot!("loop_guard", text(&e));
    // Another session is unaffected; a different call breaks the streak.
    assert!(
        d.call(
            "echo",
            json!({"text": "same"}),
            CallContext::for_session("other")
        )
        .await
        .is_ok()
    );
    assert!(
        d.call("echo", json!({"text": "different"}), ctx())
            .await
            .is_ok()
    );
    assert!(d.call("echo", json!({"text": "same"}), ctx()).await.is_ok());
}

/// The loop guard refuses only repeats that keep returning the same: a tool whose answer
/// changes from call to call (one that asks the user, reads a clock, pages a queue) runs
/// as often as it is called; once it starts returning the same, the streak counts again.
#[tokio::test]
async fn repeats_that_return_something_new_each_time_are_not_a_loop() {
    let n = Arc::new(AtomicUsize::new(0));
    let counter = n.clone();
    let t = tool(
        ToolSpec::new("ask", "Asks the user.")
            .read_only()
            .with_schema(json!({"type": "object"})),
        move |_, _| {
            let counter = counter.clone();
            async move {
                let i = counter.fetch_add(1, Ordering::SeqCst);
                // Different answers for the first eight calls, then always the same.
                Ok(Envelope::text(format!("answer {}", i.min(8))))
            }
        },
    );
    let d = dispatcher(vec![t]);
    for i in 0..8 {
        let e = d.call("ask", json!({}), ctx()).await;
        assert!(e.is_ok(), "call {i}: {}", text(&e));
    }
    // From the ninth call (index 8) on: "answer 8" each time. That call's answer differs
    // from the one before, so the streak starts again at it; three calls return "answer 8"
    // (indexes 8, 9, 10) and the fourth (11) is refused, as three identical calls are.
    let mut refused_at = None;
    for i in 8..14 {
        let e = d.call("ask", json!({}), ctx()).await;
        if e.err_kind() == Some(&ErrKind::LoopGuard) {
            refused_at = Some(i);
            break;
        }
    }
    assert_eq!(
        refused_at,
        Some(11),
        "calls made: {}",
        n.load(Ordering::SeqCst)
    );
    assert_eq!(n.load(Ordering::SeqCst), 11);
}

/// A call whose backend is down does not count toward the loop guard or the repeated-failure
/// hint: its error advises trying again, and the retry once the backend is back runs.
#[tokio::test]
async fn retries_while_a_backend_is_down_are_not_a_loop() {
    let down = Arc::new(AtomicUsize::new(6));
    let left = down.clone();
    let t = tool(
        ToolSpec::new("remote", "Calls a server.").with_schema(json!({"type": "object"})),
        move |_, _| {
            let left = left.clone();
            async move {
                if left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    Err(ToolError::err(
                        ErrKind::NotAvailable,
                        "MCP server \"fx\" is not connected",
                    ))
                } else {
                    Ok(Envelope::ok(json!("done")))
                }
            }
        },
    );
    let d = dispatcher(vec![t]);
    for _ in 0..6 {
        let e = d.call("remote", json!({}), ctx()).await;
        assert_eq!(e.err_kind(), Some(&ErrKind::NotAvailable), "{}", text(&e));
        assert!(!text(&e).contains("different approach"), "{}", text(&e));
    }
    let e = d.call("remote", json!({}), ctx()).await;
    assert!(e.is_ok(), "{}", text(&e));
    // The guard still counts calls that ran: three more in a row make four.
    for _ in 0..2 {
        assert!(d.call("remote", json!({}), ctx()).await.is_ok());
    }
    let e = d.call("remote", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::LoopGuard), "{}", text(&e));
}

/// Identical calls side by side (a model fanning out one call) are not a loop: none has
/// come back yet, so none says repeating will not change the result. Once they have come
/// back the same, the next one in a row is refused. Before, the fourth to start was refused
/// while the first three still ran.
#[tokio::test]
async fn identical_calls_side_by_side_are_not_refused_before_any_returns() {
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let release = Arc::new(Notify::new());
    let t = {
        let (started, release) = (started.clone(), release.clone());
        tool(
            ToolSpec::new("slow", "Waits.").with_schema(json!({"type": "object"})),
            move |_, _| {
                let (started, release) = (started.clone(), release.clone());
                async move {
                    let waiting = release.notified();
                    started.fetch_add(1, Ordering::SeqCst);
                    waiting.await;
                    Ok(Envelope::ok(json!("same")))
                }
            },
        )
    };
    let d = dispatcher(vec![t]);
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let d = d.clone();
            async move { d.call("slow", json!({}), ctx()).await }
        })
        .collect();
    let all = tokio::spawn(futures::future::join_all(calls));
    // Every one reaches its tool (none is refused on the way), then they all return.
    let reached = tokio::time::timeout(Duration::from_secs(10), async {
        while started.load(Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    release.notify_waiters();
    let results = all.await.unwrap();
    let refused: Vec<String> = results.iter().filter(|e| !e.is_ok()).map(text).collect();
    assert!(
        reached.is_ok() && refused.is_empty(),
        "refused side by side: {refused:?}"
    );
    // Five in a row came back the same: the sixth is refused (without reaching the tool).
    let e = tokio::time::timeout(Duration::from_secs(10), d.call("slow", json!({}), ctx()))
        .await
        .expect("refused, not run");
    assert_eq!(e.err_kind(), Some(&ErrKind::LoopGuard), "{}", text(&e));
}

#[tokio::test]
async fn repeated_failures_carry_a_try_something_else_hint() {
    let t = tool(
        ToolSpec::new("flaky", "Fails.")
            .with_schema(json!({"type": "object", "properties": {"n": {"type": "integer"}}})),
        |_, _| async { Err(ToolError::failed("upstream said no")) },
    );
    let d = dispatcher(vec![t]);
    let mut texts = Vec::new();
    for n in [1, 1, 2, 1] {
        texts.push(text(&d.call("flaky", json!({"n": n}), ctx()).await));
    }
    assert!(!texts[1].contains("different approach"));
    assert!(!texts[2].contains("different approach"));
    assert!(texts[3].contains("failed 3 times"), "{}", texts[3]);
    insta::assert_snapshot!("repeat_failure", texts[3]);
}

#[tokio::test]
async fn every_call_is_recorded_exactly_once_even_early_exits() {
    let mut mock = MockToolCallRecorder::new();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    mock.expect_record().times(5).returning(move |r| {
        seen2
            .lock()
            .unwrap()
            .push((r.tool_name.clone(), r.envelope.kind_str()));
    });
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .recorder(Arc::new(mock))
        .build();
    d.call("echo", json!({"text": "ok"}), ctx()).await;
    d.call("echo", json!({}), ctx()).await;
    d.call("missing", json!({}), ctx()).await;
    d.call_json("echo", "{not json", ctx()).await;
    d.call("echo", json!(7), ctx()).await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            ("echo".into(), "ok"),
            ("echo".into(), "hint"),
            ("missing".into(), "err"),
            ("echo".into(), "hint"),
            ("echo".into(), "hint")
        ]
    );
}

/// Rows of early exits carry a call id like any other (malformed JSON was logged with an
/// empty one), and a name sent with control characters is escaped in what the model reads
/// and in the log (a newline or a terminal escape could forge rows in `quiver log`).
#[tokio::test]
async fn early_exits_have_call_ids_and_names_are_escaped() {
    let mut mock = MockToolCallRecorder::new();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    mock.expect_record().times(3).returning(move |r| {
        seen2
            .lock()
            .unwrap()
            .push((r.tool_name.clone(), r.call_id.to_string()));
    });
    let d = Dispatcher::builder(catalog_with(vec![echo()]))
        .recorder(Arc::new(mock))
        .build();
    let bad = d.call_json("echo", "{not json", ctx()).await;
    assert!(text(&bad).contains("are not valid JSON"), "{}", text(&bad));
    let deep = format!("{{\"text\": {}{}}}", "[".repeat(200), "]".repeat(200));
    let deep = d.call_json("echo", &deep, ctx()).await;
    assert!(
        text(&deep).contains("are nested too deeply") && text(&deep).contains("128 levels"),
        "{}",
        text(&deep)
    );
    let forged = d.call("x\u{1b}[2J\nfake_row ok", json!({}), ctx()).await;
    let shown = text(&forged);
    assert!(
        !shown.contains('\u{1b}') && shown.contains("x\\u001b[2J\\nfake_row ok"),
        "{shown}"
    );
    let seen = seen.lock().unwrap();
    assert!(seen.iter().all(|(_, id)| !id.is_empty()), "{seen:?}");
    assert_eq!(seen[2].0, "x\\u001b[2J\\nfake_row ok");
}

#[tokio::test]
async fn cancelling_releases_the_caller_at_once_and_the_tool_sees_its_token() {
    let (saw_tx, saw_rx) = oneshot::channel::<()>();
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let slots = Arc::new(std::sync::Mutex::new((Some(saw_tx), Some(started_tx))));
    let t = tool(
        ToolSpec::new("long", "Long.").read_only(),
        move |_, ctx: CallContext| {
            let slots = slots.clone();
            async move {
                let (saw, started) = {
                    let mut s = slots.lock().unwrap();
                    (s.0.take(), s.1.take())
                };
                let token = ctx.cancel.clone();
                tokio::spawn(async move {
                    token.cancelled().await;
                    if let Some(tx) = saw {
                        let _ = tx.send(());
                    }
                });
                if let Some(tx) = started {
                    let _ = tx.send(());
                }
                std::future::pending::<()>().await;
                Ok(Envelope::text("never"))
            }
        },
    );
    let d = dispatcher(vec![t]);
    let cancel = CancellationToken::new();
    let call = tokio::spawn({
        let d = d.clone();
        let ctx = ctx().with_cancel(cancel.clone());
        async move { d.call("long", json!({}), ctx).await }
    });
    tokio::time::timeout(WAIT, started_rx)
        .await
        .unwrap()
        .unwrap();
    cancel.cancel();
    let e = tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
    assert_eq!(e.err_kind(), Some(&ErrKind::Cancelled));
    tokio::time::timeout(WAIT, saw_rx).await.unwrap().unwrap();
}

/// A call cancelled by the shutdown says so (it said "cancelled by the caller", and the
/// model was told its own client had given up); one cancelled before says "by the caller".
#[tokio::test]
async fn a_call_cancelled_by_the_shutdown_says_so() {
    let t = tool(ToolSpec::new("long", "Long.").read_only(), |_, _| async {
        std::future::pending::<()>().await;
        Ok(Envelope::text("never"))
    });
    // A tool that watches the token and answers `cancelled` itself (an MCP upstream's)
    // gets the same words: its own "the call was cancelled" says neither who nor what next.
    let w = tool(
        ToolSpec::new("watcher", "Watches.").read_only(),
        |_, ctx: CallContext| async move {
            ctx.cancel.cancelled().await;
            Ok(Envelope::err(ErrKind::Cancelled, "the call was cancelled"))
        },
    );
    let d = dispatcher(vec![t, w]);
    for (stopping, says) in [
        (false, "was cancelled by the caller"),
        (true, "was cancelled because Quiver is shutting down"),
    ] {
        if stopping {
            d.begin_shutdown();
        }
        for name in ["long", "watcher"] {
            let cancel = CancellationToken::new();
            let call = tokio::spawn({
                let d = d.clone();
                let ctx = ctx().with_cancel(cancel.clone());
                async move { d.call(name, json!({}), ctx).await }
            });
            tokio::task::yield_now().await;
            cancel.cancel();
            let e = tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
            assert_eq!(e.err_kind(), Some(&ErrKind::Cancelled), "{name}: {e:?}");
            assert!(e.message().unwrap().contains(says), "{name}: {e:?}");
        }
    }
}

#[tokio::test]
async fn a_tool_calls_another_tool_through_the_same_pipeline() {
    let outer = tool(
        ToolSpec::new("twice", "Echoes twice.").read_only(),
        |input, ctx: CallContext| async move {
            let first = ctx
                .call_tool("echo", json!({"text": input["text"].clone()}))
                .await;
            let bad = ctx.call_tool("echo", json!({"wrong": 1})).await;
            let Some(serde_json::Value::String(s)) = first.data().cloned() else {
                return Err(ToolError::failed("inner call failed"));
            };
            Ok(Envelope::ok(
                json!({"twice": format!("{s}{s}"), "bad_kind": bad.kind_str()}),
            ))
        },
    );
    let recorder = Arc::new(MemoryRecorder::new());
    let d = Dispatcher::builder(catalog_with(vec![outer, echo()]))
        .recorder(recorder.clone())
        .build();
    let e = d.call("twice", json!({"text": "ab"}), ctx()).await;
    assert_eq!(
        e.data().unwrap(),
        &json!({"twice": "abab", "bad_kind": "hint"})
    );
    let names: Vec<_> = recorder
        .records()
        .iter()
        .map(|r| r.tool_name.clone())
        .collect();
    assert_eq!(names, vec!["echo", "echo", "twice"]);
}

#[tokio::test]
async fn a_caller_without_permission_is_refused_and_not_told_of_hidden_tools() {
    let d = dispatcher(vec![echo(), add()]);
    let caps = Capabilities::all().with_allowed_tools(vec!["echo".into()]);
    let e = d
        .call(
            "add",
            json!({"a": 1, "b": 2}),
            ctx().with_capabilities(caps.clone()),
        )
        .await;
    // A hidden tool is answered as one that does not exist, word for word: guessing names
    // does not tell which tools exist behind the allow-list.
    assert_eq!(e.err_kind(), Some(&ErrKind::UndefinedTool));
    let absent = d
        .call(
            "sub",
            json!({"a": 1, "b": 2}),
            ctx().with_capabilities(caps.clone()),
        )
        .await;
    assert_eq!(
        text(&e).replace("`add`", "`sub`"),
        text(&absent),
        "a hidden tool and an absent one differ"
    );
    let e = d.call("ad", json!({}), ctx().with_capabilities(caps)).await;
    assert!(!text(&e).contains("`add`"), "{}", text(&e));
}

/// A stand-in for the surface's `tool_search`, which refusals advise calling.
fn search_stub() -> Arc<dyn quiver_contract::Tool> {
    tool(
        ToolSpec::new("tool_search", "Finds tools.").read_only(),
        |_, _| async { Ok(Envelope::ok(json!([]))) },
    )
}

/// The advice to call `tool_search` is given only to a caller who may call it and has it:
/// else it would send a model round in circles.
#[tokio::test]
async fn a_refusal_advises_tool_search_only_to_a_caller_who_may_call_it() {
    let d = dispatcher(vec![echo(), search_stub()]);
    let may = d.call("nope", json!({}), ctx()).await;
    assert!(text(&may).contains("Call tool_search"), "{}", text(&may));
    let caps = Capabilities::all().with_allowed_tools(vec!["echo".into()]);
    let may_not = d
        .call("nope", json!({}), ctx().with_capabilities(caps))
        .await;
    assert!(
        !text(&may_not).contains("tool_search"),
        "{}",
        text(&may_not)
    );
    assert!(
        text(&may_not).contains("Use one of the tools in your tool list."),
        "{}",
        text(&may_not)
    );
    // Without a tool_search in the catalog, nobody is told to call it.
    let d = dispatcher(vec![echo()]);
    let none = d.call("nope", json!({}), ctx()).await;
    assert!(!text(&none).contains("tool_search"), "{}", text(&none));
}

#[tokio::test]
async fn a_tabular_tool_with_no_columns_draws_a_validator_warning() {
    let t = tool(
        ToolSpec::new("table", "Rows.").read_only().tabular(),
        |_, _| async { Ok(Envelope::ok(json!([]))) },
    );
    let d = dispatcher(vec![t]);
    let e = d.call("table", json!({}), ctx()).await;
    assert_eq!(e.warnings()[0].kind, "validator");
}

#[tokio::test]
async fn many_sessions_and_calls_never_panic_the_dispatcher() {
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(echo());
    let d = Dispatcher::new(catalog);
    let inputs = [
        json!(null),
        json!("str"),
        json!(1.5),
        json!(true),
        json!({"text": null}),
        json!({"text": {"deep": [1, 2, {"x": "y"}]}}),
        json!({"text": "\u{0}\u{7}\u{1F600}"}),
    ];
    for (i, input) in inputs.iter().enumerate() {
        let e = d
            .call(
                "echo",
                input.clone(),
                CallContext::for_session(format!("s{i}")),
            )
            .await;
        assert!(!text(&e).is_empty());
    }
    for raw in ["", "   ", "[", "{\"text\":", "null", "\"x\""] {
        let e = d.call_json("echo", raw, ctx()).await;
        assert!(
            !e.is_ok() || raw.trim().is_empty() || raw == "null",
            "{raw}: {}",
            text(&e)
        );
    }
}

/// A client channel that answers sampling with a fixed text and records log messages.
struct FakeClient {
    logs: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl quiver_contract::ClientChannel for FakeClient {
    fn features(&self) -> quiver_contract::ClientFeatures {
        quiver_contract::ClientFeatures::new(true, false, false)
    }
    async fn create_message(
        &self,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, quiver_contract::ChannelError> {
        Ok(
            json!({"role": "assistant", "content": {"type": "text", "text": format!("answer to {}", params["q"])}}),
        )
    }
    async fn elicit(
        &self,
        _params: serde_json::Value,
    ) -> Result<serde_json::Value, quiver_contract::ChannelError> {
        Err(quiver_contract::ChannelError::Unsupported(
            "no elicitation".into(),
        ))
    }
    async fn list_roots(&self) -> Result<serde_json::Value, quiver_contract::ChannelError> {
        Err(quiver_contract::ChannelError::Unsupported(
            "no roots".into(),
        ))
    }
    async fn log(
        &self,
        level: quiver_contract::LogLevel,
        _logger: Option<&str>,
        data: serde_json::Value,
    ) {
        self.logs
            .lock()
            .unwrap()
            .push(format!("{}: {data}", level.as_str()));
    }
    async fn progress(&self, _progress: f64, _total: Option<f64>, _message: Option<String>) {}
}

fn asks_the_client() -> Arc<dyn quiver_contract::Tool> {
    tool(
        ToolSpec::new("ask", "Asks the calling client's model.").read_only(),
        |_, ctx: CallContext| async move {
            ctx.log(quiver_contract::LogLevel::Info, None, json!("asking"))
                .await;
            match ctx.create_message(json!({"q": "why"})).await {
                Ok(r) => Ok(Envelope::ok(r["content"]["text"].clone())),
                Err(e) => Err(ToolError::failed(e.to_string())),
            }
        },
    )
}

#[tokio::test]
async fn a_composed_call_keeps_the_channel_to_the_calling_client() {
    let outer = tool(
        ToolSpec::new("relay", "Calls ask.").read_only(),
        |_, ctx: CallContext| async move {
            let inner = ctx.call_tool("ask", json!({})).await;
            Ok(Envelope::ok(inner.data().cloned().unwrap_or_default()))
        },
    );
    let d = dispatcher(vec![outer, asks_the_client()]);
    let client = Arc::new(FakeClient {
        logs: std::sync::Mutex::new(Vec::new()),
    });
    let e = d
        .call("relay", json!({}), ctx().with_client(client.clone()))
        .await;
    assert_eq!(e.data().unwrap(), &json!("answer to \"why\""));
    assert_eq!(*client.logs.lock().unwrap(), vec!["info: \"asking\""]);
}

#[tokio::test]
async fn a_call_without_a_client_is_refused_sampling_in_words() {
    let d = dispatcher(vec![asks_the_client()]);
    let e = d.call("ask", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::ToolFailed));
    assert!(
        text(&e).contains("cannot send sampling/createMessage: this call has no MCP client"),
        "{}",
        text(&e)
    );
}

/// A tool that declares an output schema and returns `data` (whatever its arguments).
fn typed_returning(data: serde_json::Value) -> Arc<dyn quiver_contract::Tool> {
    tool(
        ToolSpec::new("forecast", "Forecast.").with_output_schema(json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "high_c": {"type": "number"}},
            "required": ["city", "high_c"]
        })),
        move |_, _| {
            let data = data.clone();
            async move {
                Ok(match data {
                    serde_json::Value::String(s) => Envelope::text(s),
                    other => Envelope::ok(other),
                })
            }
        },
    )
}

#[tokio::test]
async fn a_structured_result_is_checked_against_the_output_schema() {
    // A result that keeps the promise passes untouched.
    let d = dispatcher(vec![typed_returning(
        json!({"city": "Paris", "high_c": 21}),
    )]);
    let e = d.call("forecast", json!({}), ctx()).await;
    assert_eq!(
        e.data(),
        Some(&json!({"city": "Paris", "high_c": 21})),
        "{e:?}"
    );

    // One that breaks it is an error naming where, with what the tool returned, and the
    // call is recorded as failed.
    let recorder = Arc::new(MemoryRecorder::default());
    let d = Dispatcher::builder(catalog_with(vec![typed_returning(
        json!({"city": "Paris", "high_c": "warm"}),
    )]))
    .recorder(recorder.clone())
    .build();
    let e = d.call("forecast", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::ToolFailed), "{e:?}");
    let msg = text(&e);
    assert!(
        msg.contains("does not match the output schema it declares")
            && msg.contains("`/high_c`")
            && msg.contains(r#""warm""#)
            && msg.contains("It returned: {"),
        "{msg}"
    );
    let rows = recorder.records();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].envelope.err_kind(), Some(&ErrKind::ToolFailed));

    // A missing required field, and an array where an object is promised, fail too.
    let d = dispatcher(vec![typed_returning(json!({"city": "Paris"}))]);
    let e = d.call("forecast", json!({}), ctx()).await;
    assert!(
        text(&e).contains("\"high_c\" is a required property"),
        "{}",
        text(&e)
    );
    let d = dispatcher(vec![typed_returning(json!([1, 2]))]);
    let e = d.call("forecast", json!({}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::ToolFailed), "{e:?}");

    // What the broken result warned about is kept in the error's text.
    let warned =
        tool(
            ToolSpec::new("forecast", "Forecast.").with_output_schema(json!({
                "type": "object", "required": ["high_c"]
            })),
            |_, _| async move {
                Ok(Envelope::ok(json!({"city": "Paris"})).with_warning(
                    quiver_contract::Warning::new("parts_dropped", "an image was not base64"),
                ))
            },
        );
    let d = dispatcher(vec![warned]);
    let e = d.call("forecast", json!({}), ctx()).await;
    assert!(
        text(&e).contains("It also warned (parts_dropped): an image was not base64"),
        "{}",
        text(&e)
    );

    // Text is not structured content: left to the edge (an MCP client gets it as an error
    // result with the text).
    let d = dispatcher(vec![typed_returning(json!("sunny, 21 C"))]);
    let e = d.call("forecast", json!({}), ctx()).await;
    assert!(e.err_kind().is_none(), "{e:?}");
}

/// A tool that changes things and is abandoned at its limit may have done its work (or still
/// be doing it): the model is told to check before calling it again, where it was told only
/// to try a smaller request, and could repeat a payment or a write.
#[tokio::test]
async fn an_abandoned_mutating_call_says_it_may_have_run() {
    let slow = tool(
        ToolSpec::new("pay", "Pays an invoice."),
        |_, _ctx: CallContext| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Envelope::ok("paid".into()))
        },
    );
    let cfg = DispatchConfig::default()
        .with_timeout(TimeoutConfig::default().with_default(Duration::from_millis(50)));
    let d = Dispatcher::builder(catalog_with(vec![slow]))
        .config(cfg)
        .build();
    let out = d.call("pay", json!({}), ctx()).await;
    assert_eq!(out.err_kind(), Some(&ErrKind::Timeout), "{out:?}");
    assert!(
        text(&out).contains("the call was abandoned. It may have run, or still be running: check its effect before calling it again. Try a smaller request, or another tool."),
        "{}",
        text(&out)
    );
}

/// `read_result` reads a shortened result back by page, for the session that made the call
/// only, and says which page is next; a page that is not there, or another session, gets a
/// A long failure keeps its head and its tail (where the error usually is) within the
/// token budget, with the size left out said between them.
#[tokio::test]
async fn a_long_error_keeps_its_head_and_tail_within_the_budget() {
    let log: String = (0..20_000)
        .map(|i| format!("step {i} ok\n"))
        .collect::<String>()
        + "error: the build failed at step 20000";
    let failing = tool(ToolSpec::new("build", "Builds."), move |_, _| {
        let log = log.clone();
        async move { Err(ToolError::err(ErrKind::ToolFailed, log)) }
    });
    let d = Dispatcher::builder(catalog_with(vec![failing]))
        .config(DispatchConfig::default().with_result_limit(
            ResultLimitConfig::default().with_max_tokens(quiver_registry::shape::MIN_TOKENS),
        ))
        .build();
    let e = d.call("build", json!({}), ctx()).await;
    let said = e.message().unwrap_or_default().to_owned();
    assert!(said.starts_with("step 0 ok\nstep 1 ok"), "{said}");
    assert!(
        said.ends_with("error: the build failed at step 20000"),
        "the tail is kept: {said}"
    );
    assert!(
        said.contains("tokens of this message left out here"),
        "{said}"
    );
    let tokens = quiver_registry::shape::size_of(&said).tokens;
    assert!(
        tokens <= quiver_registry::shape::MIN_TOKENS + 20,
        "{tokens} tokens: {said}"
    );
}

/// A file read as `{"content": "..."}` over the budget is shaped as its text: head and
/// tail with real line breaks, not a cut of its JSON-escaped form, and its pages put
/// together are the text.
#[tokio::test]
async fn a_wrapped_text_over_the_budget_is_cut_as_text() {
    let lines: String = (0..400)
        .map(|i| format!("row {i}: the \"quick\" fox\n"))
        .collect();
    let whole = lines.clone();
    let t = tool(
        ToolSpec::new("read_file", "Reads a file.").read_only(),
        move |_, _| {
            let lines = lines.clone();
            async move { Ok(Envelope::ok(json!({"content": lines}))) }
        },
    );
    let d = paging_dispatcher(t);
    let mut first = ctx();
    first.call_id = Some("file-1".into());
    let e = d.call("read_file", json!({}), first).await;
    assert_eq!(e.warnings()[0].kind, "truncated", "{e:?}");
    let shown = text(&e);
    assert!(
        shown.starts_with("✓ ok. content:\nrow 0: the \"quick\" fox\nrow 1:")
            && !shown.contains("\\n"),
        "{shown}"
    );
    let mut read = String::new();
    for page in 1.. {
        let e = d
            .call("read_result", json!({"id": "file-1", "page": page}), ctx())
            .await;
        read.push_str(
            e.data()
                .and_then(serde_json::Value::as_str)
                .expect("a page of text"),
        );
        if e.warnings()[0].message.contains("It is the last page.") {
            break;
        }
    }
    assert_eq!(read, whole);
}

/// hint that says what to do instead.
#[tokio::test]
async fn read_result_reads_a_kept_result_back_by_page() {
    let lines: String = (0..400).map(|i| format!("line {i}\n")).collect();
    let whole = lines.clone();
    let t = tool(
        ToolSpec::new("log", "A long log.").read_only(),
        move |_, _| {
            let lines = lines.clone();
            async move { Ok(Envelope::text(lines)) }
        },
    );
    let d = paging_dispatcher(t);
    let mut first = ctx();
    first.call_id = Some("log-1".into());
    let e = d.call("log", json!({}), first).await;
    assert_eq!(e.warnings()[0].kind, "truncated", "{e:?}");
    let mut read = String::new();
    let mut page = 1;
    loop {
        let e = d
            .call("read_result", json!({"id": "log-1", "page": page}), ctx())
            .await;
        let Envelope::Ok { data, warnings, .. } = &e else {
            panic!("page {page}: {e:?}")
        };
        read.push_str(data.as_str().unwrap());
        let note = &warnings[0].message;
        if note.contains("It is the last page.") {
            break;
        }
        assert!(
            note.contains(&format!("\"page\": {}", page + 1)),
            "the note names the next page: {note}"
        );
        page += 1;
    }
    assert_eq!(read, whole, "the pages put together are the whole result");
    let past = d
        .call(
            "read_result",
            json!({"id": "log-1", "page": page + 1}),
            ctx(),
        )
        .await;
    assert_eq!(past.hint_kind(), Some(HintKind::Fetch), "{past:?}");
    assert!(
        text(&past).contains(&format!("pages 1 to {page}")),
        "{}",
        text(&past)
    );
    let other = d
        .call(
            "read_result",
            json!({"id": "log-1", "page": 1}),
            CallContext::for_session("s2"),
        )
        .await;
    assert!(
        text(&other).contains("no result of call `log-1` is kept in this session"),
        "{}",
        text(&other)
    );
}

/// The calls of one batch share the round's token budget: each result is shortened to its
/// share even when it is within its own budget.
#[tokio::test]
async fn a_batch_shares_the_rounds_token_budget() {
    let t = tool(ToolSpec::new("words", "Words.").read_only(), |_, _| async {
        Ok(Envelope::text("word ".repeat(900)))
    });
    let d = Dispatcher::builder(catalog_with(vec![t]))
        .config(
            DispatchConfig::default().with_result_limit(
                ResultLimitConfig::default()
                    .with_max_tokens(5_000)
                    .with_round_tokens(1_000),
            ),
        )
        .build();
    let alone = d.call("words", json!({}), ctx()).await;
    assert!(
        alone.warnings().is_empty(),
        "900 tokens fit a result's 5,000"
    );
    let calls = (0..2)
        .map(|i| quiver_registry::BatchCall::new("words", json!({"i": i})))
        .collect();
    for e in d.call_batch(calls, ctx()).await {
        let Envelope::Ok { data, warnings, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(warnings[0].kind, "truncated", "{e:?}");
        assert!(
            warnings[0]
                .message
                .contains("over its budget of 500 tokens"),
            "{}",
            warnings[0].message
        );
        assert!(data.as_str().unwrap().len() < "word ".repeat(900).len());
    }
}

/// An alias whose schema does not fit its target's: the target's schema hint would send
/// the model after a tool it was never shown, so the model is told the tool cannot be used
/// (the operator's to fix), and the target's name is not in what it reads.
#[tokio::test]
async fn an_alias_that_does_not_fit_its_target_is_the_operators_to_fix() {
    let alias = quiver_registry::curated::alias_tool(
        ToolSpec::new("plus", "Adds numbers. Use it when asked to add.").with_schema(json!({
            "type": "object",
            "properties": {
                "x": {"type": "integer", "description": "First."},
                "y": {"type": "integer", "description": "Second."}
            },
            "required": ["x", "y"]
        })),
        "add",
    );
    let d = dispatcher(vec![add(), alias]);
    let e = d.call("plus", json!({"x": 1, "y": 2}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::NotAvailable), "{e:?}");
    let said = text(&e);
    assert!(
        said.contains("`plus` cannot be used now: its definition does not match the tool it runs"),
        "{said}"
    );
    assert!(!said.contains("`add`"), "{said}");
}

/// An alias whose target the catalog does not hold (a misspelt `ref`): the model is told the
/// tool cannot be used, with no did-you-mean into the hidden target's name.
#[tokio::test]
async fn an_alias_whose_target_is_missing_is_the_operators_to_fix() {
    let alias = quiver_registry::curated::alias_tool(
        ToolSpec::new("plus", "Adds numbers. Use it when asked to add.").with_schema(json!({
            "type": "object",
            "properties": {"a": {"type": "integer", "description": "First."}},
        })),
        "mcp__calc__ad",
    );
    let d = dispatcher(vec![add(), alias]);
    let e = d.call("plus", json!({"a": 1}), ctx()).await;
    assert_eq!(e.err_kind(), Some(&ErrKind::NotAvailable), "{e:?}");
    let said = text(&e);
    assert!(
        said.contains("`plus` cannot be used now: the tool it runs does not exist"),
        "{said}"
    );
    assert!(
        !said.contains("mcp__calc") && !said.contains("`add`"),
        "{said}"
    );
}

/// The loop guard and the repeat-failure count watch the model's calls: a tool that makes
/// the same failing call five times (a script retrying) runs all five, and its one call is
/// not reported as failing repeatedly.
#[tokio::test]
async fn a_tools_own_repeated_calls_are_not_the_model_repeating_itself() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let flaky = tool(
        ToolSpec::new("flaky", "Fails. Use it to test failures."),
        move |_, _| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(Envelope::err(ErrKind::ToolFailed, "the backend said no"))
            }
        },
    );
    let retrier = tool(
        ToolSpec::new("retrier", "Retries flaky. Use it to test nesting."),
        |_, ctx: CallContext| async move {
            let invoker = ctx.invoker.clone().expect("an invoker");
            for _ in 0..5 {
                let _ = invoker.invoke("flaky", json!({}), &ctx).await;
            }
            Ok(Envelope::err(ErrKind::ToolFailed, "gave up after 5 tries"))
        },
    );
    let d = dispatcher(vec![flaky, retrier]);
    let e = d.call("retrier", json!({}), ctx()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 5, "every nested call ran");
    let said = text(&e);
    assert!(
        !said.contains("repeat_failure") && !said.contains("times with these same arguments"),
        "{said}"
    );
    // The model's own repeats still count.
    for _ in 0..2 {
        let _ = d.call("flaky", json!({}), ctx()).await;
    }
    let third = text(&d.call("flaky", json!({}), ctx()).await);
    assert!(third.contains("has now failed 3 times"), "{third}");
}

/// A caller allowed an alias (and not the tool it stands for, whose name it never sees)
/// runs it: the alias is the operator's grant of its target.
#[tokio::test]
async fn a_caller_allowed_an_alias_runs_it_without_being_allowed_its_target() {
    let alias = quiver_registry::curated::alias_tool(
        ToolSpec::new("plus", "Adds numbers. Use it when asked to add.").with_schema(json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "First."},
                "b": {"type": "integer", "description": "Second."}
            },
            "required": ["a", "b"]
        })),
        "add",
    );
    let d = dispatcher(vec![add(), alias]);
    let only_plus =
        ctx().with_capabilities(Capabilities::all().with_allowed_tools(vec!["plus".into()]));
    let e = d
        .call("plus", json!({"a": 2, "b": 3}), only_plus.clone())
        .await;
    assert!(e.is_ok(), "{e:?}");
    assert!(text(&e).contains('5'), "{}", text(&e));
    // The target itself stays refused to that caller.
    let direct = d.call("add", json!({"a": 2, "b": 3}), only_plus).await;
    assert!(!direct.is_ok(), "{direct:?}");
}

/// A dispatcher with `t` and `read_result`, the smallest token budget, and results kept.
fn paging_dispatcher(t: Arc<dyn quiver_contract::Tool>) -> Dispatcher {
    let kept = Arc::new(quiver_registry::kept::KeptResults::new(1 << 20));
    let reader = quiver_registry::kept::read_result_tool(kept.clone());
    Dispatcher::builder(catalog_with(vec![t, reader]))
        .config(DispatchConfig::default().with_result_limit(
            ResultLimitConfig::default().with_max_tokens(quiver_registry::shape::MIN_TOKENS),
        ))
        .kept_results(kept)
        .build()
}
