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
