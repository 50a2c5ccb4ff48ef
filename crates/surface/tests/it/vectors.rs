//! Tool vectors computed in the background: reused from the store, never blocking a search,
//! and a failing embedder leaves the search lexical.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};
use std::time::Duration;

use quiver_contract::{Capabilities, Mode};
use quiver_registry::{
    Catalog,
    store::{DefinitionStore, MemoryDefinitionStore, ToolDefinition, ToolType},
};
use quiver_surface::{
    MemoryUsage, Surface, SurfaceConfig, VectorProgress,
    search::{EmbedError, Embedder, HashedNgrams, HybridConfig},
};

use crate::support::{ro, stub};

/// Hashed trigrams, counting the texts it embeds; `fail` makes every call fail, and
/// `gate` holds every call until it is released.
#[derive(Debug, Default)]
struct Counting {
    texts: AtomicUsize,
    fail: bool,
    gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Embedder for Counting {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if let Some(gate) = self.gate.lock().unwrap().take() {
            gate.recv().ok();
        }
        if self.fail {
            return Err(EmbedError("no model".into()));
        }
        self.texts.fetch_add(texts.len(), Ordering::SeqCst);
        HashedNgrams::default().embed(texts)
    }

    fn model_id(&self) -> &str {
        "counting"
    }
}

const TOOLS: [(&str, &str); 3] = [
    ("mcp__stats__csv_stats", "Summary statistics of a CSV file."),
    ("mcp__docs__yaml_check", "Checks a YAML document."),
    ("mcp__geo__geocode", "Turns an address into coordinates."),
];

fn surface() -> (Arc<Catalog>, Arc<Surface>) {
    let catalog = Arc::new(Catalog::new());
    let surface = Surface::new(
        catalog.clone(),
        SurfaceConfig::default(),
        Arc::new(MemoryUsage::default()),
    )
    .unwrap();
    for (name, desc) in TOOLS {
        catalog.register_in("test", stub(ro(name, desc))).unwrap();
    }
    surface.resync_index();
    (catalog, surface)
}

async fn settled(surface: &Surface, done: impl Fn(&VectorProgress) -> bool) -> VectorProgress {
    let mut progress = surface.vector_progress();
    *tokio::time::timeout(Duration::from_secs(5), progress.wait_for(done))
        .await
        .expect("the vector task settles")
        .unwrap()
}

fn first_hit(surface: &Surface, query: &str) -> Option<String> {
    surface
        .search(query, 5, Mode::Chat, &Capabilities::all())
        .into_iter()
        .next()
        .map(|h| h.name)
}

#[tokio::test]
async fn stored_vectors_are_reused_after_a_restart_and_a_changed_text_is_embedded_again() {
    let store = Arc::new(MemoryDefinitionStore::new());
    for (name, desc) in TOOLS {
        let spec = ro(name, desc);
        store
            .put_definition(ToolDefinition::from_spec(&spec, ToolType::Mcp, "mcp:x:y"))
            .await
            .unwrap();
    }
    let first = Arc::new(Counting::default());
    let (_c1, s1) = surface();
    s1.set_vector_retriever(Some((first.clone(), HybridConfig::default())));
    let _w1 = s1.spawn_vector_worker(Some(store.clone()));
    settled(&s1, |p| p.total == 3 && p.ready == 3).await;
    assert_eq!(first.texts.load(Ordering::SeqCst), 3);
    // The store has each vector, with its key, once the task wrote it.
    for _ in 0..100 {
        if store
            .all_definitions()
            .await
            .unwrap()
            .iter()
            .all(|d| d.embedding.is_some())
        {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let defs = store.all_definitions().await.unwrap();
    assert!(
        defs.iter()
            .all(|d| d.embedding.is_some() && d.embedding_key.is_some()),
        "{defs:?}"
    );

    // A new process over the same store: nothing is embedded again.
    let second = Arc::new(Counting::default());
    let (c2, s2) = surface();
    s2.set_vector_retriever(Some((second.clone(), HybridConfig::default())));
    let _w2 = s2.spawn_vector_worker(Some(store.clone()));
    settled(&s2, |p| p.total == 3 && p.ready == 3).await;
    assert_eq!(second.texts.load(Ordering::SeqCst), 0);
    assert_eq!(
        first_hit(&s2, "gecode").as_deref(),
        Some("mcp__geo__geocode")
    );

    // A tool whose description changes gets a new vector; the others keep theirs (the
    // search above embedded its query).
    let before = second.texts.load(Ordering::SeqCst);
    let mut updates = s2.index_updates();
    updates.borrow_and_update();
    c2.upsert_in(
        "test",
        stub(ro(
            "mcp__geo__geocode",
            "Finds coordinates for a street address.",
        )),
    )
    .unwrap();
    tokio::time::timeout(Duration::from_secs(5), updates.changed())
        .await
        .unwrap()
        .unwrap();
    settled(&s2, |p| p.total == 3 && p.ready == 3).await;
    assert_eq!(second.texts.load(Ordering::SeqCst), before + 1);
}

#[tokio::test]
async fn a_search_before_the_vectors_are_computed_ranks_lexically_without_waiting() {
    let (tx, rx) = std::sync::mpsc::channel();
    let gated = Arc::new(Counting {
        gate: Mutex::new(Some(rx)),
        ..Counting::default()
    });
    let (_c, s) = surface();
    s.set_vector_retriever(Some((gated.clone(), HybridConfig::default())));
    let _w = s.spawn_vector_worker(None);
    // The task is held inside the embedder: a search answers now, lexically (the typo
    // meets no indexed term).
    assert_eq!(first_hit(&s, "gecode"), None);
    assert_eq!(
        first_hit(&s, "address coordinates").as_deref(),
        Some("mcp__geo__geocode")
    );
    assert_eq!(s.vector_progress().borrow().ready, 0);
    tx.send(()).unwrap();
    settled(&s, |p| p.total == 3 && p.ready == 3).await;
    assert_eq!(
        first_hit(&s, "gecode").as_deref(),
        Some("mcp__geo__geocode")
    );
}

#[tokio::test]
async fn a_failing_embedder_is_reported_and_the_search_stays_lexical() {
    let failing = Arc::new(Counting {
        fail: true,
        ..Counting::default()
    });
    let (_c, s) = surface();
    s.set_vector_retriever(Some((failing, HybridConfig::default())));
    let _w = s.spawn_vector_worker(None);
    let p = settled(&s, |p| p.failed).await;
    assert_eq!((p.ready, p.total), (0, 3));
    assert_eq!(
        first_hit(&s, "address coordinates").as_deref(),
        Some("mcp__geo__geocode")
    );
    assert_eq!(first_hit(&s, "gecode"), None);
}
