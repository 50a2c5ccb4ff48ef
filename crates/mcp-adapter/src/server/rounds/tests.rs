//! The input rounds' tests: calls parked and resumed, retries refused, each owner's share of parked
//! calls, undeclared capabilities refused without a round.

use super::*;
use rmcp::model::ContentBlock as Content;

/// The notification target of a round: counts log messages.
#[derive(Default)]
struct Notes(std::sync::atomic::AtomicUsize);

#[async_trait]
impl ClientChannel for Notes {
    fn features(&self) -> ClientFeatures {
        ClientFeatures::default()
    }
    async fn create_message(&self, _: Value) -> Result<Value, ChannelError> {
        unreachable!("requests go through the rounds")
    }
    async fn elicit(&self, _: Value) -> Result<Value, ChannelError> {
        unreachable!("requests go through the rounds")
    }
    async fn list_roots(&self) -> Result<Value, ChannelError> {
        unreachable!("requests go through the rounds")
    }
    async fn log(&self, _: LogLevel, _: Option<&str>, _: Value) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    async fn progress(&self, _: f64, _: Option<f64>, _: Option<String>) {}
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_string(&result.content).unwrap()
}

/// A call that elicits a name (and logs once before and after), or reports the
/// channel's refusal as its text.
fn eliciting(
    features: ClientFeatures,
    notes: Arc<Notes>,
) -> (Running, oneshot::Receiver<Option<ChannelError>>) {
    let (seen, seen_rx) = oneshot::channel();
    let run = Rounds::start(
        "greet",
        owner("key-a"),
        features,
        Arc::new(Missing::default()),
        None,
        notes,
        move |channel, cancel| async move {
            channel.log(LogLevel::Info, None, json!("asking")).await;
            let asked = channel.elicit(json!({
                "message": "name?",
                "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}
            }));
            let answer = tokio::select! {
                a = asked => a,
                _ = cancel.cancelled() => Err(ChannelError::Cancelled),
            };
            channel.log(LogLevel::Info, None, json!("answered")).await;
            let _ = seen.send(answer.as_ref().err().cloned());
            match answer {
                Ok(v) => CallToolResult::success(vec![Content::text(format!(
                    "hello {}",
                    v["content"]["name"]
                ))]),
                Err(e) => CallToolResult::error(vec![Content::text(e.to_string())]),
            }
        },
    );
    (run, seen_rx)
}

fn owner(key: &str) -> Owner {
    Owner {
        key: Arc::from(key),
        principal: None,
        tenant: None,
    }
}

fn elicit_only() -> ClientFeatures {
    ClientFeatures::new(false, true, false)
}

#[tokio::test]
async fn a_call_that_asks_is_parked_and_resumed_with_the_answer() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let (first, second) = (Arc::new(Notes::default()), Arc::new(Notes::default()));
    let (run, _) = eliciting(elicit_only(), first.clone());
    let ct = CancellationToken::new();
    let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the call asks its client first");
    };
    let requests = asked.input_requests.expect("input requests");
    assert_eq!(
        requests.keys().collect::<Vec<_>>(),
        ["elicitation-create-1"]
    );
    let wire = serde_json::to_value(&requests["elicitation-create-1"]).unwrap();
    assert_eq!(wire["method"], "elicitation/create");
    assert_eq!(wire["params"]["message"], "name?");
    assert_eq!(rounds.len(), 1);
    let state = asked.request_state.expect("a request state");
    let answers = InputResponses::from([(
        "elicitation-create-1".to_owned(),
        json!({"action": "accept", "content": {"name": "Ada"}}),
    )]);
    let run = rounds
        .resume(
            &state,
            "greet",
            &owner("key-a"),
            Some(answers),
            second.clone(),
        )
        .unwrap();
    let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the answer completes the call");
    };
    assert!(text(&done).contains("hello \\\"Ada\\\""), "{}", text(&done));
    assert_eq!(rounds.len(), 0);
    // Notifications follow the rounds: the first log went to the first request, the
    // second to the retry.
    assert_eq!(first.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(second.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The handle is spent.
    let err = rounds
        .resume(&state, "greet", &owner("key-a"), None, second)
        .err()
        .expect("a spent state is refused");
    assert!(
        err.message
            .contains("does not name a call waiting on this server"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_retry_for_another_tool_or_key_is_refused_and_the_call_kept() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let notes = Arc::new(Notes::default());
    let (run, _) = eliciting(elicit_only(), notes.clone());
    let ct = CancellationToken::new();
    let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the call asks its client first");
    };
    let state = asked.request_state.unwrap();
    let mut tenant = owner("key-a");
    tenant.tenant = Some(Arc::from("other-tenant"));
    for (tool, who) in [
        ("other", owner("key-a")),
        ("greet", owner("key-b")),
        ("greet", tenant),
    ] {
        let err = rounds
            .resume(&state, tool, &who, None, notes.clone())
            .err()
            .expect("refused");
        assert!(err.message.contains("another call"), "{}", err.message);
    }
    assert_eq!(rounds.len(), 1, "a wrong retry does not end the call");
    // A retry without the answer: the tool's request fails in words, the call ends.
    let run = rounds
        .resume(&state, "greet", &owner("key-a"), None, notes)
        .unwrap();
    let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the call ends");
    };
    assert_eq!(done.is_error, Some(true));
    assert!(
        text(&done).contains("no response for input request `elicitation-create-1`"),
        "{}",
        text(&done)
    );
}

/// A tool that asks (without waiting for the answer) and then waits only for its
/// cancellation: it ends only if the call is cancelled.
fn asks_then_waits(who: Owner) -> (Running, oneshot::Receiver<&'static str>) {
    let (ended, ended_rx) = oneshot::channel();
    let run = Rounds::start(
        "wait",
        who,
        elicit_only(),
        Arc::new(Missing::default()),
        None,
        Arc::new(Notes::default()),
        move |channel, cancel| async move {
            tokio::spawn(async move {
                let _ = channel
                    .elicit(json!({"message": "x", "requestedSchema": {"type": "object", "properties": {}}}))
                    .await;
            });
            cancel.cancelled().await;
            let _ = ended.send("cancelled");
            CallToolResult::error(vec![Content::text("cancelled")])
        },
    );
    (run, ended_rx)
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_client_never_comes_back_is_cancelled() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(30)));
    let (run, ended) = asks_then_waits(owner("key-a"));
    let ct = CancellationToken::new();
    assert!(matches!(
        rounds.drive(run, &ct, None).await.unwrap(),
        CallToolResponse::InputRequired(_)
    ));
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(rounds.len(), 1, "still waiting before the deadline");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rounds.len(), 0, "the parked call is dropped");
    assert_eq!(
        ended.await,
        Ok("cancelled"),
        "the call's token was cancelled"
    );
}

#[tokio::test]
async fn one_owner_cannot_park_more_than_its_share() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let ct = CancellationToken::new();
    for _ in 0..MAX_PARKED_PER_OWNER {
        let (run, _) = asks_then_waits(owner("greedy"));
        assert!(matches!(
            rounds.drive(run, &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
    }
    // The next call of the same owner has its request refused in words (and runs on).
    let (run, seen) = eliciting(elicit_only(), Arc::new(Notes::default()));
    let mut run = run;
    run.owner = owner("greedy");
    let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("not parked");
    };
    assert!(
        text(&done).contains("of this client's calls already wait for its input"),
        "{}",
        text(&done)
    );
    assert!(matches!(seen.await, Ok(Some(ChannelError::Unsupported(_)))));
    // Another owner still can.
    let (run, _) = eliciting(elicit_only(), Arc::new(Notes::default()));
    assert!(matches!(
        rounds.drive(run, &ct, None).await.unwrap(),
        CallToolResponse::InputRequired(_)
    ));
    assert_eq!(rounds.len(), MAX_PARKED_PER_OWNER + 1);
}

/// A token that varies its working-set key (client-chosen) still has one share.
#[tokio::test]
async fn one_token_cannot_park_more_than_its_share_by_varying_keys() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let ct = CancellationToken::new();
    let of = |token: &str, key: String| Owner {
        key: Arc::from(key),
        principal: Some(Arc::from(token)),
        tenant: None,
    };
    for i in 0..MAX_PARKED_PER_TOKEN {
        let (run, _) = asks_then_waits(of("greedy", format!("k{i}")));
        assert!(matches!(
            rounds.drive(run, &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
    }
    let (mut run, seen) = eliciting(elicit_only(), Arc::new(Notes::default()));
    run.owner = of("greedy", "a-new-key".into());
    let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("not parked");
    };
    assert!(
        text(&done).contains("calls of this token already wait for input"),
        "{}",
        text(&done)
    );
    assert!(matches!(seen.await, Ok(Some(ChannelError::Unsupported(_)))));
    // Another token still can.
    let (run, _) = asks_then_waits(of("modest", "k0".into()));
    assert!(matches!(
        rounds.drive(run, &ct, None).await.unwrap(),
        CallToolResponse::InputRequired(_)
    ));
}

/// Calls that ended while parked (their own timeout, say) make room for new ones once
/// they kept their result for a minute.
#[tokio::test(start_paused = true)]
async fn ended_parked_calls_make_room() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(600)));
    let ct = CancellationToken::new();
    let ends_soon = || {
        Rounds::start(
            "soon",
            owner("busy"),
            elicit_only(),
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |channel, _cancel| async move {
                tokio::spawn(async move {
                    let _ = channel
                        .elicit(json!({"message": "x", "requestedSchema": {"type": "object", "properties": {}}}))
                        .await;
                });
                tokio::time::sleep(Duration::from_secs(10)).await;
                CallToolResult::error(vec![Content::text("timed out")])
            },
        )
    };
    for _ in 0..MAX_PARKED_PER_OWNER {
        assert!(matches!(
            rounds.drive(ends_soon(), &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
    }
    // Full, and the calls still run: the next one's request is refused.
    let CallToolResponse::Complete(_) = rounds.drive(ends_soon(), &ct, None).await.unwrap() else {
        panic!("refused while the others run");
    };
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert_eq!(
        rounds.len(),
        MAX_PARKED_PER_OWNER,
        "nothing is dropped before it is needed"
    );
    assert!(matches!(
        rounds.drive(ends_soon(), &ct, None).await.unwrap(),
        CallToolResponse::InputRequired(_)
    ));
    assert_eq!(rounds.len(), 1, "the ended ones made room");
}

#[tokio::test]
async fn an_answer_of_the_wrong_shape_is_refused_before_the_tool_sees_it() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let notes = Arc::new(Notes::default());
    let (run, seen) = eliciting(elicit_only(), notes.clone());
    let ct = CancellationToken::new();
    let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the call asks first");
    };
    let answers = InputResponses::from([(
        "elicitation-create-1".to_owned(),
        json!({"action": "maybe"}),
    )]);
    let run = rounds
        .resume(
            &asked.request_state.unwrap(),
            "greet",
            &owner("key-a"),
            Some(answers),
            notes,
        )
        .unwrap();
    let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the call ends");
    };
    assert!(
        text(&done).contains("is not a elicitation/create result"),
        "{}",
        text(&done)
    );
    assert!(matches!(seen.await, Ok(Some(ChannelError::Invalid(_)))));
}

#[tokio::test]
async fn an_undeclared_capability_is_refused_without_a_round() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let (run, seen) = eliciting(
        ClientFeatures::new(true, false, true),
        Arc::new(Notes::default()),
    );
    // The tool's request is refused at once; the call, failed for want of it, is the
    // -32021 error naming the capability (SEP-2575).
    let err = rounds
        .drive::<CallToolResponse>(run, &CancellationToken::new(), None)
        .await
        .expect_err("a protocol error");
    assert_eq!(
        err.code,
        rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
    );
    assert!(err.message.contains("elicitation"), "{}", err.message);
    assert!(
        serde_json::to_string(&err.data)
            .unwrap()
            .contains("elicitation"),
        "{:?}",
        err.data
    );
    assert!(matches!(seen.await, Ok(Some(ChannelError::Unsupported(_)))));
    assert_eq!(rounds.len(), 0);
}

/// A tool refused a capability that then fails for another reason keeps its own error.
#[tokio::test]
async fn an_unrelated_failure_is_not_a_missing_capability() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let run = Rounds::start(
        "fallback",
        owner("key-a"),
        ClientFeatures::new(false, true, false),
        Arc::new(Missing::default()),
        None,
        Arc::new(Notes::default()),
        move |channel, _cancel| async move {
            let refused = channel
                .create_message(json!({"messages": [], "maxTokens": 1}))
                .await;
            assert!(matches!(refused, Err(ChannelError::Unsupported(_))));
            CallToolResult::error(vec![Content::text("the disk is full")])
        },
    );
    let CallToolResponse::Complete(done) = rounds
        .drive(run, &CancellationToken::new(), None)
        .await
        .unwrap()
    else {
        panic!("the tool's own error");
    };
    assert!(text(&done).contains("the disk is full"), "{}", text(&done));
}

/// A URL-mode elicitation for a client that declared form mode only is refused without
/// a round (MCP: servers MUST NOT send an undeclared mode); the tool hears why.
#[tokio::test]
async fn an_undeclared_elicitation_mode_is_refused_without_a_round() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let run = Rounds::start(
        "sign-in",
        owner("key-a"),
        elicit_only(),
        Arc::new(Missing::default()),
        None,
        Arc::new(Notes::default()),
        move |channel, _cancel| async move {
            let refused = channel
                .elicit(json!({"mode": "url", "message": "m", "url": "https://x", "elicitationId": "e"}))
                .await
                .expect_err("refused");
            CallToolResult::error(vec![Content::text(refused.to_string())])
        },
    );
    let CallToolResponse::Complete(done) = rounds
        .drive(run, &CancellationToken::new(), None)
        .await
        .unwrap()
    else {
        panic!("no round: the refusal is the call's result");
    };
    assert!(text(&done).contains("in url mode"), "{}", text(&done));
    assert_eq!(rounds.len(), 0);
}

/// Requests a tool sends at once share one round, under the names it gave them; a
/// `roots/list` request carries empty params.
#[tokio::test]
async fn concurrent_named_requests_share_one_round() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let run = Rounds::start(
        "three",
        owner("key-a"),
        ClientFeatures::new(true, true, true),
        Arc::new(Missing::default()),
        None,
        Arc::new(Notes::default()),
        move |channel, _cancel| async move {
            let (a, b, c) = tokio::join!(
                channel.request_named(
                    "user_name",
                    "elicitation/create",
                    json!({"message": "name?", "requestedSchema": {"type": "object", "properties": {}}})
                ),
                channel.request_named(
                    "greeting",
                    "sampling/createMessage",
                    json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5})
                ),
                channel.request_named("client_roots", "roots/list", json!({})),
            );
            let text = format!(
                "{} {} {}",
                a.unwrap()["content"]["name"],
                b.unwrap()["content"]["text"],
                c.unwrap()["roots"][0]["uri"]
            );
            CallToolResult::success(vec![Content::text(text)])
        },
    );
    let ct = CancellationToken::new();
    let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("one round");
    };
    let requests = asked.input_requests.unwrap();
    assert_eq!(
        requests.keys().map(String::as_str).collect::<Vec<_>>(),
        ["client_roots", "greeting", "user_name"]
    );
    let roots = serde_json::to_value(&requests["client_roots"]).unwrap();
    assert_eq!(roots["method"], "roots/list");
    let answers = InputResponses::from([
        (
            "user_name".to_owned(),
            json!({"action": "accept", "content": {"name": "Ada"}}),
        ),
        (
            "greeting".to_owned(),
            json!({"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"}),
        ),
        (
            "client_roots".to_owned(),
            json!({"roots": [{"uri": "file:///r"}]}),
        ),
    ]);
    let run = rounds
        .resume(
            &asked.request_state.unwrap(),
            "three",
            &owner("key-a"),
            Some(answers),
            Arc::new(Notes::default()),
        )
        .unwrap();
    let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("done");
    };
    assert!(
        text(&done).contains(r#"\"Ada\" \"hello\" \"file:///r\""#),
        "{}",
        text(&done)
    );
}

/// Answers sent with the first call (the ephemeral style) serve the requests named with
/// their keys without a round; values that are not objects are refused up front.
#[tokio::test]
async fn answers_sent_up_front_need_no_round() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let preset = InputResponses::from([
        (
            "user_name".to_owned(),
            json!({"action": "accept", "content": {"name": "Ada"}}),
        ),
        ("unrelated".to_owned(), json!({"ignored": true})),
    ]);
    assert!(check_responses(Some(&preset)).is_ok());
    let bad = InputResponses::from([("user_name".to_owned(), json!(12345))]);
    let err = check_responses(Some(&bad)).expect_err("refused");
    assert!(
        err.message
            .contains("inputResponses.user_name must be an object"),
        "{}",
        err.message
    );
    let run = Rounds::start(
        "named",
        owner("key-a"),
        elicit_only(),
        Arc::new(Missing::default()),
        Some(preset),
        Arc::new(Notes::default()),
        move |channel, _cancel| async move {
            let a = channel
                .request_named(
                    "user_name",
                    "elicitation/create",
                    json!({"message": "name?", "requestedSchema": {"type": "object", "properties": {}}}),
                )
                .await
                .unwrap();
            CallToolResult::success(vec![Content::text(format!(
                "hello {}",
                a["content"]["name"]
            ))])
        },
    );
    let CallToolResponse::Complete(done) = rounds
        .drive(run, &CancellationToken::new(), None)
        .await
        .unwrap()
    else {
        panic!("no round needed");
    };
    assert!(text(&done).contains("hello \\\"Ada\\\""), "{}", text(&done));
    assert_eq!(rounds.len(), 0);
}

#[tokio::test]
async fn cancelling_a_round_cancels_the_call() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let (started_tx, started) = oneshot::channel::<()>();
    let run = Rounds::start(
        "slow",
        owner("key-a"),
        elicit_only(),
        Arc::new(Missing::default()),
        None,
        Arc::new(Notes::default()),
        move |_channel, cancel| async move {
            let _ = started_tx.send(());
            cancel.cancelled().await;
            CallToolResult::error(vec![Content::text("cancelled")])
        },
    );
    let ct = CancellationToken::new();
    let driving = {
        let (rounds, ct) = (rounds.clone(), ct.clone());
        tokio::spawn(async move { rounds.drive(run, &ct, None).await })
    };
    started.await.unwrap();
    ct.cancel();
    let CallToolResponse::Complete(done) = driving.await.unwrap().unwrap() else {
        panic!("the call ends");
    };
    assert!(text(&done).contains("cancelled"));
}

/// A `prompts/get` that elicits its context, as the passthrough runs it: the source's
/// answer, or its failure as the source reports it (the refusal text inside).
fn eliciting_prompt(features: ClientFeatures) -> Running {
    Rounds::start(
        Target::prompt("with_context"),
        owner("key-a"),
        features,
        Arc::new(Missing::default()),
        None,
        Arc::new(Notes::default()),
        move |channel, _cancel| async move {
            let asked = channel
                .elicit(json!({
                    "message": "context?",
                    "requestedSchema": {"type": "object", "properties": {"context": {"type": "string"}}}
                }))
                .await;
            match asked {
                Ok(v) => Ok(GetPromptResult::new(vec![
                    rmcp::model::PromptMessage::new_text(
                        rmcp::model::Role::User,
                        format!("context: {}", v["content"]["context"]),
                    ),
                ])),
                Err(e) => Err(ErrorData::invalid_params(
                    format!("MCP server \"docs\": {e}"),
                    None,
                )),
            }
        },
    )
}

#[tokio::test]
async fn a_prompt_takes_rounds_like_a_tool_and_its_state_is_its_own() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let ct = CancellationToken::new();
    let GetPromptResponse::InputRequired(asked) = rounds
        .drive(eliciting_prompt(elicit_only()), &ct, None)
        .await
        .unwrap()
    else {
        panic!("the prompt asks its client first");
    };
    let state = asked.request_state.expect("a request state");
    let key = asked
        .input_requests
        .expect("input requests")
        .into_keys()
        .next()
        .expect("one");
    let notes: Arc<dyn ClientChannel> = Arc::new(Notes::default());
    // The handle is a prompt's: a tool call of the same name, or another prompt, is refused
    // and the prompt keeps waiting.
    for other in [Target::tool("with_context"), Target::prompt("other")] {
        let err = rounds
            .resume(&state, other, &owner("key-a"), None, notes.clone())
            .err()
            .expect("refused");
        assert!(
            err.message.contains("prompts/get `with_context`"),
            "{}",
            err.message
        );
    }
    assert_eq!(rounds.len(), 1);
    let answers = InputResponses::from([(
        key,
        json!({"action": "accept", "content": {"context": "tests"}}),
    )]);
    let run = rounds
        .resume(
            &state,
            Target::prompt("with_context"),
            &owner("key-a"),
            Some(answers),
            notes,
        )
        .unwrap();
    let GetPromptResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
        panic!("the answer completes the prompt");
    };
    let wire = serde_json::to_value(&done).unwrap();
    assert_eq!(
        wire["messages"][0]["content"]["text"], "context: \"tests\"",
        "{wire}"
    );
    assert_eq!(rounds.len(), 0);
    // A spent handle names what to send again.
    let err = rounds
        .resume(
            &state,
            Target::prompt("with_context"),
            &owner("key-a"),
            None,
            Arc::new(Notes::default()),
        )
        .err()
        .expect("spent");
    assert!(
        err.message
            .contains("Send prompts/get for `with_context` again"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_prompt_refused_an_undeclared_capability_is_the_missing_capability_error() {
    let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
    let err = rounds
        .drive::<GetPromptResponse>(
            eliciting_prompt(ClientFeatures::new(true, false, false)),
            &CancellationToken::new(),
            None,
        )
        .await
        .expect_err("a protocol error");
    assert_eq!(
        err.code,
        rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
    );
    assert!(
        err.message.starts_with("the prompt needs"),
        "{}",
        err.message
    );
    let data = serde_json::to_string(&err.data).unwrap();
    assert!(
        data.contains("elicitation") && data.contains("MCP server \\\"docs\\\""),
        "{data}"
    );
    assert_eq!(rounds.len(), 0);
}
