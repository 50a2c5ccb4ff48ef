use quiver_registry::store::{JobStatus, JobStore, JobType, NewJob, StoreError};
use serde_json::json;

use crate::support::store;

#[tokio::test]
async fn jobs_follow_the_transition_table() {
    let (_dir, _path, store) = store();
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

    // Terminal states are terminal.
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
}

/// Two stores open on one file (two processes, as `quiver serve` and `quiver custom` are)
/// claim from one queue: every job goes to exactly one of them, oldest first, and a named
/// claim takes only that job while it is still queued.
#[tokio::test]
async fn each_queued_job_is_claimed_once_across_two_stores_on_one_file() {
    let (_dir, path, a) = store();
    let b = quiver_store_sqlite::SqliteStore::open(&path).expect("second handle");
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
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let named = b
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
        let (x, y) = tokio::join!(a.claim_job(None), b.claim_job(None));
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
    // Oldest first within each store's own sequence of claims.
    assert!(got_a.windows(2).all(|w| w[0] < w[1]), "{got_a:?}");
    let stored = a.job("j00").await.expect("get").expect("j00");
    assert_eq!(stored.status, JobStatus::Building);
}
