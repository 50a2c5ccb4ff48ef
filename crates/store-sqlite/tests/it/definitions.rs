use quiver_contract::{Lifecycle, ToolSpec};
use quiver_registry::{DefinitionStore, StoreError, ToolDefinition, ToolType};

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
    store.set_embedding("a", vec![0.5, 1.5]).await.expect("emb");
    store.set_embedding("b", vec![2.0]).await.expect("emb");
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
