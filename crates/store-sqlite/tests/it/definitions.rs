use quiver_contract::{Lifecycle, ToolSpec};
use quiver_registry::store::{DefinitionStore, StoreError, ToolDefinition, ToolType};

use crate::support::store;

fn sys(name: &str, desc: &str) -> ToolDefinition {
    ToolDefinition::system(&ToolSpec::new(name, desc))
}

#[tokio::test]
async fn seeding_inserts_refreshes_keeps_status_retires_and_reports_unknown() {
    let (_dir, path, store) = store();
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
    assert!(
        store
            .set_embedding("zz", "k".into(), vec![1.0])
            .await
            .is_err()
    );
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
    let b = store.definition("b").await.expect("get").expect("b");
    assert_eq!(b.embedding, Some(vec![2.0]));
    assert_eq!(b.embedding_key.as_deref(), Some("k2"));
    assert_eq!(a.embedding_key, None, "cleared with the embedding");
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
    store.close().await.expect("close");
    drop(store);
    let store = quiver_store_sqlite::SqliteStore::open(&path).expect("reopen");
    let a2 = store.definition("a").await.expect("get").expect("a");
    assert_eq!(a2, a);
    assert_eq!(a2.tool_type, ToolType::System);
}

#[tokio::test]
async fn seeding_a_name_also_retired_is_a_conflict() {
    let (_dir, _path, store) = store();
    let err = store
        .seed_system_tools(vec![sys("a", "A")], vec!["a".into()])
        .await
        .expect_err("conflict");
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert!(store.all_definitions().await.expect("all").is_empty());
}

#[tokio::test]
async fn visible_query_filters_status_enabled_internal_deleted_and_tenant() {
    let (_dir, _path, store) = store();
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
}

/// Every change of a definition moves the version, whoever makes it: a second store
/// open on the same file (another process's `quiver custom approve`) is seen by the first;
/// a custom tool's test cases and pending version come back as written.
#[tokio::test]
async fn the_definitions_version_moves_with_every_change_from_any_connection() {
    let (_dir, path, store) = store();
    let v0 = store.definitions_version().await.expect("version");
    let mut custom = ToolDefinition::from_spec(&ToolSpec::new("mine", "m"), ToolType::Custom, "js");
    custom.test_cases = Some(serde_json::json!([{"inputs": {}, "expect": 1}]));
    custom.pending = Some(serde_json::json!({"version": 2}));
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
    let other = quiver_store_sqlite::SqliteStore::open(&path).expect("a second opener");
    other.set_enabled("mine", false).await.expect("disable");
    let v2 = store.definitions_version().await.expect("version");
    assert!(v2 > v1, "{v1} -> {v2}");
    // A read that changes nothing does not move it.
    store.all_definitions().await.expect("read");
    assert_eq!(store.definitions_version().await.expect("version"), v2);
}
