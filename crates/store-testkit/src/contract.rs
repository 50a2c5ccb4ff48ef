//! The store ports' contract: what every adapter of `DefinitionStore`, `JobStore`,
//! `CallLog`, `ToolCallRecorder`, `SessionStore` and `UsageSource` must do, as cases generic
//! over a [`Backend`]. An adapter's tests run them all with [`crate::contract_suite!`].
//!
//! Over 800 lines: test cases only, one function per case, each named for what it checks;
//! the list of all of them is [`crate::contract_suite!`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use quiver_contract::{Envelope, ErrKind, HintKind, Lifecycle, RenderOptions, ToolSpec, render};
use quiver_registry::{
    CallRecord, ToolCallRecorder,
    log_writer::Durability,
    store::{
        CallFilter, CallLog, DefinitionStore, JobStatus, JobStore, JobType, NewJob, StoreError,
        ToolDefinition, ToolType,
    },
};
use quiver_surface::ports::{
    SessionStore, StoredWorkingSet, TIER0_KEY, ToolUsage, UsageSource, WorkingSetEntry,
};
use serde_json::json;

/// Every store port at once, as an adapter implements them.
pub trait Ports:
    DefinitionStore + JobStore + CallLog + ToolCallRecorder + SessionStore + UsageSource + 'static
{
}

impl<T> Ports for T where
    T: DefinitionStore
        + JobStore
        + CallLog
        + ToolCallRecorder
        + SessionStore
        + UsageSource
        + 'static
{
}

/// What the suite needs of an adapter.
#[async_trait]
pub trait Backend: Send {
    /// The adapter's store.
    type Store: Ports;
    /// A new, empty store.
    async fn open(&mut self) -> Self::Store;
    /// A new, empty store with `durability`, whose log writer waits `linger` for more rows
    /// before a batched commit.
    async fn open_with(&mut self, durability: Durability, linger: Duration) -> Self::Store;
    /// Another handle on the data of the store [`Backend::open`] gave (what another
    /// process opening the same store has).
    async fn another(&mut self) -> Self::Store;
    /// Closes a handle as a clean shutdown does (everything recorded is written).
    async fn close(&mut self, store: Self::Store);
}

/// Runs every case of the contract, one `#[tokio::test]` each, against the backend `$make`
/// builds (evaluated afresh for each case).
#[macro_export]
macro_rules! contract_suite {
    ($make:expr) => {
        $crate::contract_suite!(@cases $make;
            seeding_inserts_refreshes_keeps_status_retires_and_reports_unknown,
            seeding_a_name_also_retired_is_a_conflict,
            visible_query_filters_status_enabled_internal_deleted_and_tenant,
            the_definitions_version_moves_with_every_change_from_any_handle,
            jobs_follow_the_transition_table,
            each_queued_job_is_claimed_once_across_two_handles,
            a_heartbeat_renews_only_a_running_job,
            a_release_takes_only_a_job_not_renewed_since,
            recorded_calls_read_back_filtered_with_summary_and_full_output,
            calls_page_by_time_and_filter_by_principal_and_id,
            calls_dispatched_in_one_microsecond_page_by_row,
            usage_counts_only_calls_that_answered,
            usage_is_bucketed_by_age_and_retention_purges_old_rows,
            the_log_is_chained_across_handles_and_purges,
            a_verify_while_rows_are_written_finds_the_chain_intact,
            working_sets_failures_and_surface_state_persist,
            a_replaced_working_set_moves_its_version_on_for_every_handle,
            a_conditional_replace_writes_only_over_the_version_expected,
            a_strict_record_returns_once_its_row_is_committed);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let mut backend = $make;
                $crate::contract::$case(&mut backend).await;
            }
        )*
    };
}

fn sys(name: &str, desc: &str) -> ToolDefinition {
    ToolDefinition::system(&ToolSpec::new(name, desc))
}

/// A call record of `tool` with call id `id`, ending in `kind` (`ok`, `hint` or `err`).
pub fn call(tool: &str, id: &str, kind: &str) -> CallRecord {
    let env = match kind {
        "ok" => Envelope::text(format!("result of {id}")),
        "hint" => Envelope::hint(HintKind::Schema, "did you mean `x`?", Vec::new()),
        _ => Envelope::err(ErrKind::ToolFailed, "boom"),
    };
    CallRecord::new(tool, id, json!({"id": id}), env)
}

/// Seeding inserts new names, refreshes stored ones (never their status), retires only the
/// names given, reports live system rows it does not know, clears a stale embedding; what
/// it wrote outlives a restart.
pub async fn seeding_inserts_refreshes_keeps_status_retires_and_reports_unknown(
    b: &mut impl Backend,
) {
    let store = b.open().await;
    let first = store
        .seed_system_tools(
            vec![
                sys("a", "A"),
                sys("b", "B"),
                sys("old", "O"),
                sys("stray", "S"),
            ],
            vec![],
        )
        .await
        .expect("seed");
    assert_eq!(first.inserted, ["a", "b", "old", "stray"]);

    // Review turned `a` down and it got an embedding; a custom tool exists too.
    store
        .set_status("a", Lifecycle::Rejected, Some("unsafe".into()))
        .await
        .expect("status");
    let version = store.definitions_version().await.unwrap();
    store
        .set_embedding("a", "k1".into(), vec![0.5, 1.5])
        .await
        .expect("emb");
    store
        .set_embedding("b", "k2".into(), vec![2.0])
        .await
        .expect("emb");
    assert_eq!(
        store.definitions_version().await.unwrap(),
        version,
        "a stored vector is not a change of the definitions"
    );
    assert!(matches!(
        store.set_embedding("zz", "k".into(), vec![1.0]).await,
        Err(StoreError::NotFound { .. })
    ));
    let custom = ToolDefinition::from_spec(&ToolSpec::new("mine", "m"), ToolType::Custom, "js");
    store.put_definition(custom).await.expect("custom");

    let mut a = sys("a", "A, refreshed");
    a.status_message = Some("working".into());
    a.large_output = true;
    let a = a.with_status(Lifecycle::Approved); // must not overwrite the stored status
    let report = store
        .seed_system_tools(vec![a, sys("b", "B"), sys("c", "C")], vec!["old".into()])
        .await
        .expect("reseed");
    assert_eq!(report.inserted, ["c"]);
    assert_eq!(report.updated, ["a"]);
    assert_eq!(report.unchanged, ["b"]);
    assert_eq!(report.retired, ["old"]);
    assert_eq!(report.unknown, ["stray"]);

    let a = store.definition("a").await.expect("get").expect("a");
    assert_eq!(a.status, Lifecycle::Rejected);
    assert_eq!(a.description, "A, refreshed");
    assert_eq!(a.status_message.as_deref(), Some("working"));
    assert!(a.large_output);
    assert_eq!(
        a.embedding, None,
        "a changed description clears the embedding"
    );
    assert_eq!(a.embedding_key, None, "cleared with the embedding");
    let b2 = store.definition("b").await.expect("get").expect("b");
    assert_eq!(b2.embedding, Some(vec![2.0]));
    assert_eq!(b2.embedding_key.as_deref(), Some("k2"));
    let old = store.definition("old").await.expect("get").expect("old");
    assert!(old.deleted_at.is_some());
    let stray = store
        .definition("stray")
        .await
        .expect("get")
        .expect("stray");
    assert!(stray.deleted_at.is_none(), "unknown rows are never swept");
    assert!(store.definition("mine").await.expect("get").is_some());

    // It all survives a restart.
    b.close(store).await;
    let store = b.another().await;
    let a2 = store.definition("a").await.expect("get").expect("a");
    assert_eq!(a2, a);
    assert_eq!(a2.tool_type, ToolType::System);
    b.close(store).await;
}

/// A name both seeded and retired is refused, and nothing is written.
pub async fn seeding_a_name_also_retired_is_a_conflict(b: &mut impl Backend) {
    let store = b.open().await;
    let err = store
        .seed_system_tools(vec![sys("a", "A")], vec!["a".into()])
        .await
        .expect_err("conflict");
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert!(store.all_definitions().await.expect("all").is_empty());
    b.close(store).await;
}

/// A tenant sees approved, enabled, listed, live tools of its own or of everyone.
pub async fn visible_query_filters_status_enabled_internal_deleted_and_tenant(
    b: &mut impl Backend,
) {
    let store = b.open().await;
    let spec = |n: &str| ToolSpec::new(n, "d");
    let defs = vec![
        ToolDefinition::system(&spec("shown")),
        ToolDefinition::system(&spec("for_t1")).with_tenant("t1"),
        ToolDefinition::system(&spec("for_t2")).with_tenant("t2"),
        ToolDefinition::system(&spec("draft")).with_status(Lifecycle::Draft),
        ToolDefinition::system(&spec("hidden").with_category("internal")),
        ToolDefinition::system(&spec("off")),
        ToolDefinition::system(&spec("deleted")),
    ];
    for d in defs {
        store.put_definition(d).await.expect("put");
    }
    store.set_enabled("off", false).await.expect("disable");
    store.soft_delete("deleted").await.expect("delete");
    let names = |v: Vec<ToolDefinition>| v.into_iter().map(|d| d.name).collect::<Vec<_>>();
    assert_eq!(
        names(store.visible_definitions("t1").await.expect("t1")),
        ["for_t1", "shown"]
    );
    assert_eq!(
        names(store.visible_definitions("t3").await.expect("t3")),
        ["shown"]
    );
    assert!(matches!(
        store.set_enabled("nope", true).await,
        Err(StoreError::NotFound { .. })
    ));
    // A soft delete is revived by the next put.
    store
        .put_definition(ToolDefinition::system(&spec("deleted")))
        .await
        .expect("revive");
    let revived = store
        .definition("deleted")
        .await
        .expect("get")
        .expect("row");
    assert_eq!(revived.deleted_at, None);
    b.close(store).await;
}

/// Every change of a definition moves the version, whoever makes it: a second handle
/// (another process's `quiver custom approve`) is seen by the first, and one waiting for a
/// change learns of it; a custom tool's test cases and pending version come back as
/// written (key order included: the model reads schemas as stored).
pub async fn the_definitions_version_moves_with_every_change_from_any_handle(b: &mut impl Backend) {
    let store = b.open().await;
    let v0 = store.definitions_version().await.expect("version");
    let mut custom = ToolDefinition::from_spec(&ToolSpec::new("mine", "m"), ToolType::Custom, "js");
    custom.input_schema = json!({"type": "object", "properties": {"z": {}, "a": {}}});
    custom.test_cases = Some(json!([{"inputs": {}, "expect": 1}]));
    custom.pending = Some(json!({"version": 2}));
    store.put_definition(custom.clone()).await.expect("put");
    let v1 = store.definitions_version().await.expect("version");
    assert!(v1 > v0, "{v0} -> {v1}");
    let back = store
        .definition("mine")
        .await
        .expect("read")
        .expect("there");
    assert_eq!(
        (back.test_cases, back.pending),
        (custom.test_cases, custom.pending)
    );
    assert_eq!(
        back.input_schema.to_string(),
        custom.input_schema.to_string(),
        "the schema's key order is kept"
    );
    let other = b.another().await;
    other.set_enabled("mine", false).await.expect("disable");
    let seen = store
        .definitions_changed(Some(v1), Duration::from_secs(10))
        .await
        .expect("wait");
    assert_ne!(seen, v1, "the waiting handle learns of the other's change");
    let v2 = store.definitions_version().await.expect("version");
    assert!(v2 > v1, "{v1} -> {v2}");
    // A read that changes nothing does not move it.
    store.all_definitions().await.expect("read");
    assert_eq!(store.definitions_version().await.expect("version"), v2);
    b.close(other).await;
    b.close(store).await;
}

/// Jobs move only along the transition table; terminal states are terminal.
pub async fn jobs_follow_the_transition_table(b: &mut impl Backend) {
    let store = b.open().await;
    let job = store
        .create_job(
            NewJob::new("j1", "tool", JobType::Build, json!({"goal": "x"})).with_tenant("t"),
        )
        .await
        .expect("create");
    assert_eq!(job.status, JobStatus::Queued);
    assert!(matches!(
        store
            .create_job(NewJob::new("j1", "tool", JobType::Build, json!({})))
            .await,
        Err(StoreError::Conflict { .. })
    ));

    // An illegal jump is an error and writes nothing.
    let err = store
        .transition_job("j1", JobStatus::Approved, Some(json!("nope")))
        .await
        .expect_err("queued -> approved");
    assert!(
        matches!(
            err,
            StoreError::InvalidTransition {
                from: JobStatus::Queued,
                to: JobStatus::Approved,
                ..
            }
        ),
        "{err}"
    );
    let still = store.job("j1").await.expect("get").expect("j1");
    assert_eq!(still.status, JobStatus::Queued);
    assert_eq!(still.result, None);

    for to in [
        JobStatus::Building,
        JobStatus::Testing,
        JobStatus::Building,
        JobStatus::Testing,
    ] {
        store.transition_job("j1", to, None).await.expect("legal");
    }
    store.set_job_progress("j1", 250).await.expect("progress");
    let done = store
        .transition_job("j1", JobStatus::Approved, Some(json!({"tests": "passed"})))
        .await
        .expect("approve");
    assert_eq!(done.status, JobStatus::Approved);
    assert_eq!(done.progress_pct, 100);
    assert_eq!(done.result, Some(json!({"tests": "passed"})));
    assert_eq!(done.tenant.as_deref(), Some("t"));

    for to in JobStatus::ALL {
        assert!(matches!(
            store.transition_job("j1", to, None).await,
            Err(StoreError::InvalidTransition { .. })
        ));
    }
    assert!(matches!(
        store
            .transition_job("missing", JobStatus::Building, None)
            .await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.set_job_progress("missing", 1).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        store.jobs(Some("tool".into())).await.expect("list").len(),
        1
    );
    assert!(
        store
            .jobs(Some("other".into()))
            .await
            .expect("list")
            .is_empty()
    );
    b.close(store).await;
}

/// A worker's heartbeat moves a running (`building` or `testing`) job's `updated_at`, seen
/// by another handle, and changes nothing else; a job queued, ended or gone answers `false`.
pub async fn a_heartbeat_renews_only_a_running_job(b: &mut impl Backend) {
    let store = b.open().await;
    let other = b.another().await;
    store
        .create_job(NewJob::new("j1", "tool", JobType::Build, json!({})))
        .await
        .expect("create");
    assert!(!store.heartbeat_job("j1").await.expect("beat"), "queued");
    let claimed = other
        .claim_job(Some("j1".into()))
        .await
        .expect("claim")
        .expect("queued");
    store.set_job_progress("j1", 40).await.expect("progress");
    let mut last = store.job("j1").await.expect("get").expect("j1").updated_at;
    for status in [JobStatus::Building, JobStatus::Testing] {
        if status == JobStatus::Testing {
            store
                .transition_job("j1", JobStatus::Testing, None)
                .await
                .expect("testing");
            last = store.job("j1").await.expect("get").expect("j1").updated_at;
        }
        // A distinct instant, so that the renewal shows.
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(store.heartbeat_job("j1").await.expect("beat"), "{status:?}");
        let seen = other.job("j1").await.expect("get").expect("j1");
        assert!(
            seen.updated_at > last,
            "{status:?}: the other handle sees it"
        );
        assert_eq!(
            (seen.status, seen.progress_pct, seen.result),
            (status, 40, None)
        );
        last = seen.updated_at;
    }
    assert!(last > claimed.updated_at);
    store
        .transition_job("j1", JobStatus::Failed, Some(json!({"interrupted": "x"})))
        .await
        .expect("released");
    assert!(!store.heartbeat_job("j1").await.expect("beat"), "failed");
    let after = other.job("j1").await.expect("get").expect("j1");
    assert_eq!(after.status, JobStatus::Failed);
    assert!(!store.heartbeat_job("missing").await.expect("beat"), "gone");
    b.close(other).await;
    b.close(store).await;
}

/// A release takes a running job only when it was not renewed since the bound given: a
/// heartbeat after the bound keeps it; one of two handles releasing it at once does it; a
/// release without a bound takes a running job whatever its last heartbeat; a queued,
/// ended or missing job is never taken.
pub async fn a_release_takes_only_a_job_not_renewed_since(b: &mut impl Backend) {
    let store = b.open().await;
    let other = b.another().await;
    let why = json!({"interrupted": "test"});
    for id in ["j1", "j2"] {
        store
            .create_job(NewJob::new(id, "tool", JobType::Build, json!({})))
            .await
            .expect("create");
    }
    assert!(
        !store
            .release_job("j1", None, why.clone())
            .await
            .expect("release"),
        "a queued job is not running"
    );
    other
        .claim_job(Some("j1".into()))
        .await
        .expect("claim")
        .expect("queued");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let bound = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Renewed after the bound (as if its worker beat after the jobs were read): kept.
    assert!(other.heartbeat_job("j1").await.expect("beat"));
    assert!(
        !store
            .release_job("j1", Some(bound), why.clone())
            .await
            .expect("release"),
        "a heartbeat since the bound keeps the job"
    );
    assert_eq!(
        other.job("j1").await.expect("get").expect("j1").status,
        JobStatus::Building
    );
    // Not renewed since a later bound: released, by one of the two handles.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let later = std::time::SystemTime::now();
    let (one, two) = tokio::join!(
        store.release_job("j1", Some(later), why.clone()),
        other.release_job("j1", Some(later), why.clone())
    );
    assert_eq!(
        u8::from(one.expect("release")) + u8::from(two.expect("release")),
        1,
        "one handle releases it"
    );
    let released = other.job("j1").await.expect("get").expect("j1");
    assert_eq!(
        (released.status, released.result),
        (JobStatus::Failed, Some(why.clone()))
    );
    assert!(
        !other.heartbeat_job("j1").await.expect("beat"),
        "its worker's lease is gone"
    );
    assert!(
        !store
            .release_job("j1", None, why.clone())
            .await
            .expect("release"),
        "an ended job"
    );
    // Without a bound (a server handing back its own job as it stops): taken at once.
    store
        .claim_job(Some("j2".into()))
        .await
        .expect("claim")
        .expect("queued");
    assert!(store.heartbeat_job("j2").await.expect("beat"));
    assert!(
        store
            .release_job("j2", None, why.clone())
            .await
            .expect("release")
    );
    assert_eq!(
        other.job("j2").await.expect("get").expect("j2").status,
        JobStatus::Failed
    );
    assert!(
        !store
            .release_job("missing", None, why)
            .await
            .expect("release")
    );
    b.close(other).await;
    b.close(store).await;
}

/// Two handles (two processes) claim from one queue: every job goes to exactly one of
/// them, oldest first, and a named claim takes only that job while it is still queued.
pub async fn each_queued_job_is_claimed_once_across_two_handles(b: &mut impl Backend) {
    let a = b.open().await;
    let other = b.another().await;
    for i in 0..20 {
        a.create_job(NewJob::new(
            format!("j{i:02}"),
            "tool",
            JobType::Audit,
            json!({}),
        ))
        .await
        .expect("create");
        // Distinct creation times, so "oldest first" has one answer.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let named = other
        .claim_job(Some("j07".into()))
        .await
        .expect("claim")
        .expect("j07 is queued");
    assert_eq!(
        (named.id.as_str(), named.status),
        ("j07", JobStatus::Building)
    );
    assert!(
        a.claim_job(Some("j07".into()))
            .await
            .expect("claim")
            .is_none()
    );

    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    loop {
        let (x, y) = tokio::join!(a.claim_job(None), other.claim_job(None));
        let (x, y) = (x.expect("claim a"), y.expect("claim b"));
        if x.is_none() && y.is_none() {
            break;
        }
        got_a.extend(x.map(|j| j.id));
        got_b.extend(y.map(|j| j.id));
    }
    let mut all: Vec<String> = got_a.iter().chain(&got_b).cloned().collect();
    all.sort();
    let want: Vec<String> = (0..20)
        .filter(|i| *i != 7)
        .map(|i| format!("j{i:02}"))
        .collect();
    assert_eq!(all, want, "a took {got_a:?}, b took {got_b:?}");
    assert!(got_a.windows(2).all(|w| w[0] < w[1]), "{got_a:?}");
    let stored = a.job("j00").await.expect("get").expect("j00");
    assert_eq!(stored.status, JobStatus::Building);
    b.close(other).await;
    b.close(a).await;
}

/// Recorded calls read back whole (summary cut at 500 characters, the full output only
/// when asked), newest first, filtered by tool, session and kind; another handle reads
/// them too.
pub async fn recorded_calls_read_back_filtered_with_summary_and_full_output(b: &mut impl Backend) {
    let store = b.open().await;
    let long = Envelope::text("x".repeat(2_000));
    store
        .record(
            CallRecord::new("read", "c1", json!({"path": "/a"}), long.clone())
                .with_session("s1")
                .with_tenant("t")
                .with_principal("ci")
                .with_trace_id("4bf92f3577b34da6a3ce929d0e0e4736")
                .with_reasoning("looking")
                .with_timings(Duration::from_micros(7), Duration::from_micros(42)),
        )
        .await;
    store
        .record(call("read", "c2", "hint").with_session("s2"))
        .await;
    store
        .record(call("write", "c3", "err").with_session("s1"))
        .await;
    store.flush().await;

    let all = store
        .recent_calls(CallFilter::recent(10))
        .await
        .expect("all");
    assert_eq!(all.len(), 3);
    let c1 = all.iter().find(|c| c.call_id == "c1").expect("c1");
    assert_eq!(c1.output_summary.chars().count(), 500);
    assert!(render(&long, &RenderOptions::default()).starts_with(&c1.output_summary));
    assert_eq!(c1.output, None, "full output only when asked");
    assert_eq!(c1.input, json!({"path": "/a"}));
    assert_eq!(
        (c1.session.as_deref(), c1.tenant.as_deref()),
        (Some("s1"), Some("t"))
    );
    assert_eq!(c1.reasoning.as_deref(), Some("looking"));
    assert_eq!(c1.principal.as_deref(), Some("ci"));
    let c2 = all.iter().find(|c| c.call_id == "c2").expect("c2");
    assert_eq!(c2.principal, None);
    assert_eq!(
        c1.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(c2.trace_id, None);
    assert_eq!(
        (c1.queued, c1.took),
        (Duration::from_micros(7), Duration::from_micros(42))
    );
    assert!(c1.success);

    let other = b.another().await;
    for (filter, want) in [
        (CallFilter::recent(10).tool("read"), vec!["c1", "c2"]),
        (CallFilter::recent(10).session("s1"), vec!["c1", "c3"]),
        (CallFilter::recent(10).kind("hint"), vec!["c2"]),
    ] {
        let mut ids: Vec<String> = other
            .recent_calls(filter.clone())
            .await
            .expect("query")
            .into_iter()
            .map(|c| c.call_id)
            .collect();
        ids.sort();
        assert_eq!(ids, want, "{filter:?}");
    }
    assert_eq!(
        other
            .recent_calls(CallFilter::recent(1))
            .await
            .expect("one")
            .len(),
        1
    );

    let errs = store
        .recent_calls(CallFilter::recent(10).kind("err").with_output())
        .await
        .expect("errs");
    assert_eq!(errs[0].err_kind, Some(ErrKind::ToolFailed));
    assert_eq!(errs[0].error.as_deref(), Some("boom"));
    assert!(!errs[0].success);
    assert_eq!(
        errs[0].output,
        Some(Envelope::err(ErrKind::ToolFailed, "boom"))
    );
    let hint = store
        .recent_calls(CallFilter::recent(10).kind("hint"))
        .await
        .expect("hints");
    assert_eq!(hint[0].hint_kind, Some(HintKind::Schema));
    b.close(other).await;
    b.close(store).await;
}

/// The admin page's call-log queries: by principal, by call id, by the call they were made
/// from, and pages by time (rows strictly before a cursor, strictly after one), newest
/// first, each alone and together with the other filters.
pub async fn calls_page_by_time_and_filter_by_principal_and_id(b: &mut impl Backend) {
    let store = b.open().await;
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_551_200);
    let at = |s: u64| t0 + Duration::from_secs(s);
    for (i, principal) in ["ci", "ops", "ci", "ci", "ops"].iter().enumerate() {
        let kind = if i == 3 { "err" } else { "ok" };
        store
            .record(
                call("read", &format!("c{i}"), kind)
                    .with_principal(*principal)
                    .with_at(at(i as u64)),
            )
            .await;
    }
    store
        .record(call("read", "anon", "ok").with_at(at(10)))
        .await;
    for (i, parent) in [(11, "c2"), (12, "c4"), (13, "c2")] {
        store
            .record(
                call("nested", &format!("n{i}"), "ok")
                    .with_parent(parent)
                    .with_at(at(i)),
            )
            .await;
    }
    store.flush().await;
    let other = b.another().await;
    for (filter, want) in [
        (
            CallFilter::recent(10).principal("ci"),
            vec!["c3", "c2", "c0"],
        ),
        (CallFilter::recent(10).principal("ops"), vec!["c4", "c1"]),
        (CallFilter::recent(10).call_id("c2"), vec!["c2"]),
        (CallFilter::recent(10).call_id("nope"), vec![]),
        (CallFilter::recent(10).before(at(3)), vec!["c2", "c1", "c0"]),
        (CallFilter::recent(2).before(at(3)), vec!["c2", "c1"]),
        (
            CallFilter::recent(10).after(at(3)),
            vec!["n13", "n12", "n11", "anon", "c4"],
        ),
        (CallFilter::recent(10).parent("c2"), vec!["n13", "n11"]),
        (CallFilter::recent(10).parent("c4"), vec!["n12"]),
        (CallFilter::recent(10).parent("c1"), vec![]),
        (
            CallFilter::recent(10).parent("c2").before(at(13)),
            vec!["n11"],
        ),
        (
            CallFilter::recent(10).after(at(0)).before(at(4)),
            vec!["c3", "c2", "c1"],
        ),
        (
            CallFilter::recent(10).principal("ci").before(at(3)),
            vec!["c2", "c0"],
        ),
        (
            CallFilter::recent(10).principal("ci").kind("err"),
            vec!["c3"],
        ),
    ] {
        let ids: Vec<String> = other
            .recent_calls(filter.clone())
            .await
            .expect("query")
            .into_iter()
            .map(|c| c.call_id)
            .collect();
        assert_eq!(ids, want, "{filter:?}");
        // The in-memory rule says the same of every row.
        let all = other.recent_calls(CallFilter::recent(100)).await.unwrap();
        let mut matched: Vec<String> = all
            .into_iter()
            .filter(|c| filter.matches(c))
            .map(|c| c.call_id)
            .take(filter.limit)
            .collect();
        matched.truncate(filter.limit);
        assert_eq!(matched, want, "CallFilter::matches agrees: {filter:?}");
    }
    b.close(other).await;
    b.close(store).await;
}

/// Calls dispatched in the same microsecond are told apart by their row: pages cut by the
/// cursor `(time, row)` of each page's oldest row hold every call once, and the live
/// view's `after` cursor does the same forwards.
pub async fn calls_dispatched_in_one_microsecond_page_by_row(b: &mut impl Backend) {
    let store = b.open().await;
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_551_200);
    store.record(call("read", "early", "ok").with_at(t0)).await;
    let same = t0 + Duration::from_micros(5);
    for i in 0..7 {
        store
            .record(call("read", &format!("s{i}"), "ok").with_at(same))
            .await;
    }
    store
        .record(call("read", "late", "ok").with_at(same + Duration::from_micros(1)))
        .await;
    store.flush().await;
    let other = b.another().await;
    let all: Vec<String> = other
        .recent_calls(CallFilter::recent(100))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.call_id)
        .collect();
    assert_eq!(
        all,
        ["late", "s6", "s5", "s4", "s3", "s2", "s1", "s0", "early"],
        "newest first, the same microsecond in the order written"
    );
    // Pages of three, each after the previous page's oldest row.
    let mut paged: Vec<String> = Vec::new();
    let mut filter = CallFilter::recent(3);
    loop {
        let page = other.recent_calls(filter.clone()).await.unwrap();
        paged.extend(page.iter().map(|c| c.call_id.clone()));
        let Some(last) = page.last() else { break };
        assert!(last.row > 0, "a row read back has its number: {last:?}");
        filter = CallFilter::recent(3).before_row(last.at, last.row);
    }
    assert_eq!(paged, all, "every call once, in order");
    // Forwards: after a row of the crowded microsecond come the rest of it, then later.
    let s2 = other
        .recent_calls(CallFilter::recent(1).call_id("s2"))
        .await
        .unwrap()
        .remove(0);
    let newer: Vec<String> = other
        .recent_calls(CallFilter::recent(100).after_row(s2.at, s2.row))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.call_id)
        .collect();
    assert_eq!(newer, ["late", "s6", "s5", "s4", "s3"]);
    // The in-memory rule agrees.
    let rows = other.recent_calls(CallFilter::recent(100)).await.unwrap();
    let f = CallFilter::recent(100).before_row(s2.at, s2.row);
    let older: Vec<&str> = rows
        .iter()
        .filter(|c| f.matches(c))
        .map(|c| c.call_id.as_str())
        .collect();
    assert_eq!(older, ["s1", "s0", "early"]);
    b.close(other).await;
    b.close(store).await;
}

/// Usage counts the calls that answered (Ok or a Hint): not a call refused before it ran
/// (denied, unknown, looping, too large, its arguments refused by the schema check, its
/// server not up), and not a call that failed; a schema hint the tool returned after it ran
/// counts.
pub async fn usage_counts_only_calls_that_answered(b: &mut impl Backend) {
    let store = b.open().await;
    let now = SystemTime::now();
    let rec = |tool: &str, id: &str, env: Envelope| CallRecord::new(tool, id, json!({}), env);
    for (i, kind) in [
        ErrKind::PolicyDenied,
        ErrKind::UndefinedTool,
        ErrKind::Forbidden,
        ErrKind::LoopGuard,
        ErrKind::Other("input_too_large".into()),
        ErrKind::Other("too_deep".into()),
        ErrKind::Other("invalid_params".into()),
    ]
    .into_iter()
    .enumerate()
    {
        store
            .record(rec(
                "denied",
                &format!("d{i}"),
                Envelope::err(kind, "refused"),
            ))
            .await;
    }
    store
        .record(rec(
            "denied",
            "h0",
            Envelope::hint(
                HintKind::Schema,
                format!(
                    "{}denied` do not fit its schema: `/a`: wrong type",
                    quiver_registry::REFUSED_ARGUMENTS
                ),
                Vec::new(),
            ),
        ))
        .await;
    for (i, kind) in [ErrKind::ToolFailed, ErrKind::NotAvailable, ErrKind::Timeout]
        .into_iter()
        .enumerate()
    {
        store
            .record(rec("failed", &format!("f{i}"), Envelope::err(kind, "boom")))
            .await;
    }
    store.record(rec("used", "u0", Envelope::text("ok"))).await;
    store.record(rec("used", "u1", Envelope::text("ok"))).await;
    store
        .record(rec(
            "used",
            "u2",
            Envelope::hint(HintKind::Schema, "the row id is unknown", Vec::new()),
        ))
        .await;
    store
        .record(rec(
            "used",
            "u3",
            Envelope::hint(
                HintKind::Schema,
                format!(
                    "{}other` do not fit its schema",
                    quiver_registry::REFUSED_ARGUMENTS
                ),
                Vec::new(),
            ),
        ))
        .await;
    store.record(rec("used", "u4", Envelope::text("ok"))).await;
    store.flush().await;
    assert_eq!(
        store.usage(now).await.expect("usage"),
        [ToolUsage::new("used", 5, 0, 0)]
    );
    b.close(store).await;
}

/// Usage is bucketed by age (under 30 days, 30 to 90, older); purging deletes the rows
/// before a cutoff, in batches, and says how many. Rows are recorded oldest first, as a log
/// is written (a row is written when its call ends, so the order follows dispatch times up
/// to a call's length).
pub async fn usage_is_bucketed_by_age_and_retention_purges_old_rows(b: &mut impl Backend) {
    const DAY: Duration = Duration::from_secs(86_400);
    let store = b.open().await;
    let now = SystemTime::now();
    store
        .record(call("a", "a6", "ok").with_at(now - DAY * 400))
        .await;
    // Enough old rows to take several purge batches.
    for i in 0..2_500 {
        store
            .record(call("c", &format!("old{i}"), "ok").with_at(now - DAY * 200))
            .await;
    }
    store
        .record(call("b", "b0", "ok").with_at(now - DAY * 100))
        .await;
    for (i, days) in [91, 89, 31, 29, 1, 0].iter().enumerate() {
        store
            .record(call("a", &format!("a{}", 5 - i), "ok").with_at(now - DAY * *days))
            .await;
    }
    store.flush().await;
    assert_eq!(
        store.usage(now).await.expect("usage"),
        [
            ToolUsage::new("a", 3, 2, 2),
            ToolUsage::new("b", 0, 0, 1),
            ToolUsage::new("c", 0, 0, 2_500)
        ]
    );
    let purged = store
        .purge_calls_before(now - DAY * 90)
        .await
        .expect("purge");
    assert_eq!(purged, 2_500 + 3);
    assert_eq!(
        store.usage(now).await.expect("usage"),
        [ToolUsage::new("a", 3, 2, 0)]
    );
    assert_eq!(
        store
            .recent_calls(CallFilter::recent(100))
            .await
            .expect("rest")
            .len(),
        5
    );
    b.close(store).await;
}

/// Every logged row is chained: `seq` 1, 2, 3 with no gap across two handles writing the
/// same store, each link recomputed from the stored row; export pages resume after a `seq`
/// and filter by time; a retention purge leaves a checkpoint that anchors the rest, and the
/// chain stays whole through it and through rows written after it.
pub async fn the_log_is_chained_across_handles_and_purges(b: &mut impl Backend) {
    use quiver_registry::chain::{self, ChainPoint};
    const DAY: Duration = Duration::from_secs(86_400);
    let first = b.open().await;
    let second = b.another().await;
    let now = SystemTime::now();
    let mut kinds = ["ok", "hint", "err"].iter().cycle();
    for i in 0..30 {
        let store: &dyn ToolCallRecorder = if i % 2 == 0 { &first } else { &second };
        let mut r = call("t", &format!("c{i}"), kinds.next().expect("cycles"))
            .with_at(now - DAY * (60 - i))
            .with_session("s")
            .with_reasoning("why");
        if i % 3 == 0 {
            r = r.with_tenant("acme").with_principal("ci");
        }
        if i % 4 == 0 {
            r = r.with_trace_id(format!("{i:032x}"));
        }
        store.record(r).await;
        // Each handle's rows go in its own batches, interleaved with the other's.
        store.flush().await;
    }
    let rows = first.chain_rows(0, None, 100).await.expect("rows");
    assert_eq!(
        rows.iter().map(|r| r.point.seq).collect::<Vec<_>>(),
        (1..=30).collect::<Vec<u64>>()
    );
    let mut prev = ChainPoint::START;
    for r in &rows {
        assert_eq!(
            r.entry.link(r.point.seq, &prev.link),
            r.point.link,
            "row {}",
            r.point.seq
        );
        prev = r.point;
    }
    let report = chain::verify(&first, None).await.expect("verify");
    assert!(report.intact(), "{:?}", report.problems);
    assert_eq!(
        (report.rows, report.span, report.last),
        (30, Some((1, 30)), Some(prev))
    );
    // The head a verify printed is found again later.
    let report = chain::verify(&second, Some(prev)).await.expect("verify");
    assert!(report.intact(), "{:?}", report.problems);

    // Pages: after a cursor, and from a time.
    let page = first.chain_rows(10, None, 5).await.expect("page");
    assert_eq!(
        page.iter().map(|r| r.point.seq).collect::<Vec<_>>(),
        [11, 12, 13, 14, 15]
    );
    let recent = first
        .chain_rows(0, Some(now - DAY * 35), 100)
        .await
        .expect("since");
    assert_eq!(recent.first().map(|r| r.point.seq), Some(26));
    assert_eq!(recent.len(), 5);

    // A purge removes a prefix and anchors what is left.
    let purged = first
        .purge_calls_before(now - DAY * 50)
        .await
        .expect("purge");
    assert_eq!(purged, 10);
    second.record(call("t", "after", "ok").with_at(now)).await;
    second.flush().await;
    let report = chain::verify(&first, None).await.expect("verify");
    assert!(report.intact(), "{:?}", report.problems);
    assert_eq!((report.rows, report.span), (21, Some((11, 31))));
    let state = first.chain_state().await.expect("state");
    assert_eq!(state.head.map(|h| h.seq), Some(31));
    assert!(
        state.checkpoints.iter().any(|c| c.seq == 10),
        "{:?}",
        state.checkpoints
    );
    assert_eq!((state.unchained_count, state.older_rows), (0, 0));
    // A head from before the purge is in the part purged: no longer provable.
    let report = chain::verify(&first, Some(rows[4].point))
        .await
        .expect("verify");
    assert!(!report.intact());
    b.close(first).await;
    b.close(second).await;
}

/// A [`CallLog`] that, between the head's read and the first page of rows, has another
/// handle record `rows` calls: what a verify sees on a store a server is writing.
struct WrittenMeanwhile<'a, S> {
    log: &'a S,
    writer: &'a dyn ToolCallRecorder,
    rows: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl<S: CallLog> CallLog for WrittenMeanwhile<'_, S> {
    async fn recent_calls(
        &self,
        filter: CallFilter,
    ) -> Result<Vec<quiver_registry::store::LoggedCall>, StoreError> {
        self.log.recent_calls(filter).await
    }

    async fn purge_calls_before(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        self.log.purge_calls_before(cutoff).await
    }

    async fn chain_rows(
        &self,
        after: u64,
        since: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<quiver_registry::chain::ChainedRow>, StoreError> {
        let n = self.rows.swap(0, std::sync::atomic::Ordering::SeqCst);
        for i in 0..n {
            self.writer
                .record(call("t", &format!("meanwhile-{i}"), "ok"))
                .await;
        }
        self.writer.flush().await;
        self.log.chain_rows(after, since, limit).await
    }

    async fn chain_state(&self) -> Result<quiver_registry::chain::ChainState, StoreError> {
        self.log.chain_state().await
    }
}

/// Rows a server commits while a verify walks the chain (after it read the head) are newer
/// rows, not rows added behind Quiver's back: the chain verifies intact, through them.
pub async fn a_verify_while_rows_are_written_finds_the_chain_intact(b: &mut impl Backend) {
    use quiver_registry::chain;
    let first = b.open().await;
    let second = b.another().await;
    for i in 0..5 {
        first.record(call("t", &format!("c{i}"), "ok")).await;
    }
    first.flush().await;
    let live = WrittenMeanwhile {
        log: &first,
        writer: &second,
        rows: 3.into(),
    };
    let report = chain::verify(&live, None).await.expect("verify");
    assert!(report.intact(), "{:?}", report.problems);
    assert_eq!((report.rows, report.span), (8, Some((1, 8))));
    b.close(first).await;
    b.close(second).await;
}

/// Working sets, failure counts and surface state are kept per session and key, outlive a
/// restart, and go with the session's end.
pub async fn working_sets_failures_and_surface_state_persist(b: &mut impl Backend) {
    let store = b.open().await;
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    store
        .replace_working_set(
            "s1",
            vec![
                WorkingSetEntry::new("a", t, 1),
                WorkingSetEntry::new("b", t, 1),
            ],
        )
        .await
        .expect("write");
    store
        .replace_working_set("s2", vec![WorkingSetEntry::new("z", t, 1)])
        .await
        .expect("other session");
    // Replaced whole: b leaves, a is refreshed.
    store
        .replace_working_set("s1", vec![WorkingSetEntry::new("a", t, 3)])
        .await
        .expect("replace");
    assert_eq!(
        store
            .record_failed_approach("s1", "h1", "a", "e1")
            .await
            .expect("f"),
        1
    );
    assert_eq!(
        store
            .record_failed_approach("s1", "h1", "a", "e2")
            .await
            .expect("f"),
        2
    );
    let before = SystemTime::now();
    store
        .put_state(TIER0_KEY, json!(["a", "b"]))
        .await
        .expect("floor");
    assert_eq!(store.state("nothing").await.expect("state"), None);

    b.close(store).await;
    let store = b.another().await;
    assert_eq!(
        store.working_set("s1").await.expect("ws"),
        [WorkingSetEntry::new("a", t, 3)]
    );
    let failures = store.failed_approaches("s1").await.expect("failures");
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0].count, failures[0].error.as_str()), (2, "e2"));
    let floor = store.state(TIER0_KEY).await.expect("state").expect("floor");
    assert_eq!(floor.value, json!(["a", "b"]));
    assert!(floor.written_at >= before - Duration::from_secs(1));

    store.end_session("s1").await.expect("end");
    assert!(store.working_set("s1").await.expect("ws").is_empty());
    assert!(store.failed_approaches("s1").await.expect("f").is_empty());
    assert_eq!(store.working_set("s2").await.expect("ws").len(), 1);
    b.close(store).await;
}

/// A conditional replace writes only when the set's version is the one expected: over a
/// version another handle moved on it writes nothing and says so; of two handles writing
/// over the same version at once, one does; an ended session starts over at 0.
pub async fn a_conditional_replace_writes_only_over_the_version_expected(b: &mut impl Backend) {
    let one = b.open().await;
    let two = b.another().await;
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let set = |tools: &[&str]| -> Vec<WorkingSetEntry> {
        tools
            .iter()
            .map(|n| WorkingSetEntry::new(*n, t, 0))
            .collect()
    };
    let names = |s: StoredWorkingSet| -> (u64, Vec<String>) {
        (s.version, s.entries.into_iter().map(|e| e.tool).collect())
    };
    assert_eq!(
        one.replace_working_set_if("c", set(&["a"]), 0)
            .await
            .expect("write"),
        Some(1)
    );
    assert_eq!(
        two.replace_working_set_if("c", set(&["x"]), 0)
            .await
            .expect("write"),
        None,
        "version 0 is gone"
    );
    assert_eq!(
        names(two.versioned_working_set("c").await.expect("read")),
        (1, vec!["a".to_owned()]),
        "nothing written by the refused replace"
    );
    assert_eq!(
        two.replace_working_set_if("c", set(&["a", "b"]), 1)
            .await
            .expect("write"),
        Some(2)
    );
    assert_eq!(
        one.replace_working_set_if("c", set(&["z"]), 1)
            .await
            .expect("write"),
        None
    );
    let (x, y) = tokio::join!(
        one.replace_working_set_if("c", set(&["b"]), 2),
        two.replace_working_set_if("c", set(&["a", "b", "c"]), 2)
    );
    let (x, y) = (x.expect("write"), y.expect("write"));
    assert_eq!(
        u8::from(x.is_some()) + u8::from(y.is_some()),
        1,
        "one of two writes over one version: {x:?} {y:?}"
    );
    let (version, tools) = names(one.versioned_working_set("c").await.expect("read"));
    assert_eq!(version, 3);
    assert!(
        tools == ["b"] || tools == ["a", "b", "c"],
        "the set of the write that won: {tools:?}"
    );
    one.end_session("c").await.expect("end");
    assert_eq!(
        one.replace_working_set_if("c", set(&["a"]), 3)
            .await
            .expect("write"),
        None,
        "an ended session's old version"
    );
    assert_eq!(
        names(two.versioned_working_set("c").await.expect("read")),
        (0, vec![])
    );
    assert_eq!(
        two.replace_working_set_if("c", set(&["a"]), 0)
            .await
            .expect("write"),
        Some(1)
    );
    b.close(two).await;
    b.close(one).await;
}

/// A working set replaced whole keeps only the new entries and moves its version on; a
/// second handle (another server) reads the set and the version together; an ended session
/// starts over at version 0.
pub async fn a_replaced_working_set_moves_its_version_on_for_every_handle(b: &mut impl Backend) {
    let one = b.open().await;
    let two = b.another().await;
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert_eq!(
        one.versioned_working_set("c").await.expect("read"),
        StoredWorkingSet::new(0, vec![])
    );
    let v1 = one
        .replace_working_set(
            "c",
            vec![
                WorkingSetEntry::new("a", t, 0),
                WorkingSetEntry::new("b", t, 2),
            ],
        )
        .await
        .expect("replace");
    one.replace_working_set("other", vec![WorkingSetEntry::new("z", t, 0)])
        .await
        .expect("another session");
    let read = two.versioned_working_set("c").await.expect("read");
    assert_eq!(read.version, v1);
    assert_eq!(
        read.entries,
        [
            WorkingSetEntry::new("a", t, 0),
            WorkingSetEntry::new("b", t, 2)
        ]
    );
    // The other handle replaces it: "a" leaves, "c" comes, "b" is rewritten.
    let v2 = two
        .replace_working_set(
            "c",
            vec![
                WorkingSetEntry::new("c", t, 0),
                WorkingSetEntry::new("b", t, 3),
            ],
        )
        .await
        .expect("replace");
    assert_ne!(v2, v1);
    let read = one.versioned_working_set("c").await.expect("read");
    assert_eq!(read.version, v2);
    assert_eq!(
        read.entries,
        [
            WorkingSetEntry::new("b", t, 3),
            WorkingSetEntry::new("c", t, 0)
        ]
    );
    assert_eq!(one.working_set("c").await.expect("ws").len(), 2);
    // Emptied: no entries, and still a version of its own.
    let v3 = one.replace_working_set("c", vec![]).await.expect("empty");
    assert_ne!(v3, v2);
    assert_eq!(
        two.versioned_working_set("c").await.expect("read"),
        StoredWorkingSet::new(v3, vec![])
    );
    assert_eq!(
        two.versioned_working_set("other")
            .await
            .expect("read")
            .entries
            .len(),
        1
    );
    two.end_session("c").await.expect("end");
    assert_eq!(
        one.versioned_working_set("c").await.expect("read"),
        StoredWorkingSet::new(0, vec![])
    );
    b.close(one).await;
    b.close(two).await;
}

/// With [`Durability::Strict`], `record` returns only once its row is committed: another
/// handle (another process) reads it at once, without a flush, even though the writer's
/// linger is far longer than the test; concurrent records (which share commits) each return
/// with their rows in.
pub async fn a_strict_record_returns_once_its_row_is_committed(b: &mut impl Backend) {
    let linger = Duration::from_secs(60);
    let store = b.open_with(Durability::Strict, linger).await;
    let other = b.another().await;
    store.record(call("read", "strict-1", "ok")).await;
    let seen = other
        .recent_calls(CallFilter::recent(10).call_id("strict-1"))
        .await
        .expect("read");
    assert_eq!(seen.len(), 1, "the row is committed when record returns");
    let store = std::sync::Arc::new(store);
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store
                .record(call("read", &format!("group-{i}"), "ok"))
                .await;
        }));
    }
    for t in tasks {
        t.await.expect("record");
    }
    let seen = other
        .recent_calls(CallFilter::recent(100))
        .await
        .expect("read");
    assert_eq!(seen.len(), 33, "every concurrent record is committed");
    let store = std::sync::Arc::into_inner(store).expect("the tasks are done");
    b.close(store).await;
    b.close(other).await;
}
