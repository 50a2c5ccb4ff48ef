//! Tool vectors for the search index, computed in the background: a task takes the tools
//! that wait for their vector, reuses the vectors the store holds for the same model and
//! text, embeds the rest in batches on a blocking thread, and gives them to the index and
//! the store. Until a tool has its vector it is ranked lexically, so no search waits for
//! the model.

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
    time::Instant,
};

use quiver_registry::store::DefinitionStore;
use tokio::sync::watch;

use crate::{Surface, sync::lock};

/// Tools embedded in one batch: a batch's vectors go to the index (under its write lock)
/// and the store together, so a search waits at most for one batch's writes.
const BATCH: usize = 32;

/// How far the background task is: tools with their vector out of the indexed tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VectorProgress {
    /// Indexed tools that have their vector.
    pub ready: usize,
    /// Indexed tools.
    pub total: usize,
    /// Whether the embedder failed (the tools left are ranked lexically until the catalog
    /// changes and the task tries again).
    pub failed: bool,
}

impl Surface {
    /// How far the computation of tool vectors is (all zeros without a retriever).
    pub fn vector_progress(&self) -> watch::Receiver<VectorProgress> {
        self.vector_progress.subscribe()
    }

    /// Spawns the task that gives indexed tools their vectors (see the module docs), with
    /// `store` for the vectors kept across restarts. It runs until the surface is dropped;
    /// without a retriever ([`Surface::set_vector_retriever`]) it waits for one.
    pub fn spawn_vector_worker(
        self: &Arc<Self>,
        store: Option<Arc<dyn DefinitionStore>>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run(Arc::downgrade(self), store))
    }

    /// Wakes the vector task: the index may have tools without a vector. The progress is
    /// brought up to date at once, so a waiter never reads the count of before the change.
    pub(crate) fn wake_vectors(&self) {
        if lock(&self.retriever).is_some() {
            let failed = self.vector_progress.borrow().failed;
            self.publish_progress(failed);
        }
        self.vector_wake.notify_one();
    }

    fn publish_progress(&self, failed: bool) -> VectorProgress {
        let ix = self.index.read().unwrap_or_else(|p| p.into_inner());
        let progress = VectorProgress {
            ready: ix.index.vectors_ready(),
            total: if ix.index.has_embedder() {
                ix.index.len()
            } else {
                0
            },
            failed,
        };
        drop(ix);
        self.vector_progress.send_replace(progress);
        progress
    }

    /// Gives waiting tools the vectors `stored` holds for their current text; returns how
    /// many it gave. A used vector leaves `stored`.
    fn adopt_stored(&self, stored: &mut HashMap<String, (String, Vec<f32>)>) -> usize {
        if stored.is_empty() {
            return 0;
        }
        let mut ix = self.index.write().unwrap_or_else(|p| p.into_inner());
        let mut adopted = 0;
        for p in ix.index.pending_vectors(usize::MAX) {
            if let Some((key, v)) = stored.get(&p.name)
                && *key == p.key
                && ix.index.set_vector(&p.name, key, v)
            {
                stored.remove(&p.name);
                adopted += 1;
            }
        }
        adopted
    }
}

/// The stored vectors by tool name, with their keys.
async fn load_stored(store: &dyn DefinitionStore) -> HashMap<String, (String, Vec<f32>)> {
    match store.all_definitions().await {
        Ok(defs) => defs
            .into_iter()
            .filter(|d| d.deleted_at.is_none())
            .filter_map(|d| Some((d.name, (d.embedding_key?, d.embedding?))))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the stored tool vectors; computing them");
            HashMap::new()
        }
    }
}

async fn run(surface: Weak<Surface>, store: Option<Arc<dyn DefinitionStore>>) {
    let mut stored = match &store {
        Some(s) => load_stored(&**s).await,
        None => HashMap::new(),
    };
    let mut failed = false;
    let mut started: Option<(Instant, usize, usize)> = None;
    loop {
        let Some(s) = surface.upgrade() else { return };
        let wake = s.vector_wake.clone();
        let notified = wake.notified();
        let retriever = lock(&s.retriever).clone();
        let Some((embedder, _)) = retriever else {
            drop(s);
            notified.await;
            continue;
        };
        let adopted = s.adopt_stored(&mut stored);
        let batch = if failed {
            Vec::new()
        } else {
            s.index
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .index
                .pending_vectors(BATCH)
        };
        let progress = s.publish_progress(failed);
        let run = started.get_or_insert((Instant::now(), 0, 0));
        run.1 += adopted;
        if batch.is_empty() {
            if progress.ready == progress.total && progress.total > 0 {
                let (at, from_store, computed) = *run;
                tracing::info!(
                    tools = progress.total,
                    from_store,
                    computed,
                    seconds = at.elapsed().as_secs_f64(),
                    "tool_search: every tool has its search vector"
                );
            }
            started = None;
            drop(s);
            notified.await;
            // A catalog change: the task tries the embedder again.
            failed = false;
            continue;
        }
        if run.2 == 0 && run.1 == 0 {
            tracing::info!(
                waiting = progress.total - progress.ready,
                "tool_search: computing search vectors in the background; tools without one rank lexically"
            );
        }
        drop(s);
        let texts: Vec<String> = batch.iter().map(|p| p.text.clone()).collect();
        let embedded = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            embedder.embed(&refs)
        })
        .await;
        let Some(s) = surface.upgrade() else { return };
        let vectors = match embedded {
            Ok(Ok(vs)) if vs.len() == batch.len() => vs,
            Ok(Ok(_)) | Ok(Err(_)) | Err(_) => {
                let why = match embedded {
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                    _ => "the embedder returned the wrong number of vectors".into(),
                };
                tracing::warn!(
                    error = %why,
                    "tool_search: computing search vectors failed; the tools without one rank lexically"
                );
                failed = true;
                continue;
            }
        };
        let mut kept: Vec<(String, String, Vec<f32>)> = Vec::with_capacity(batch.len());
        {
            let mut ix = s.index.write().unwrap_or_else(|p| p.into_inner());
            for (p, v) in batch.into_iter().zip(vectors) {
                if ix.index.set_vector(&p.name, &p.key, &v) {
                    kept.push((p.name, p.key, v));
                }
            }
        }
        if let Some(run) = started.as_mut() {
            run.2 += kept.len();
        }
        if kept.is_empty() {
            tracing::warn!(
                "tool_search: the embedder's vectors were unusable (empty, zero or of another length); the tools without one rank lexically"
            );
            failed = true;
        }
        drop(s);
        if let Some(store) = &store {
            for (name, key, v) in kept {
                // Only tools the store records (upstream MCP and custom tools) are kept.
                if let Err(e) = store.set_embedding(&name, key, v).await
                    && !matches!(e, quiver_registry::store::StoreError::NotFound { .. })
                {
                    tracing::debug!(tool = %name, error = %e, "could not store a tool's search vector");
                }
            }
        }
    }
}

/// The vector progress channel and wake-up of a new surface.
pub(crate) fn channels() -> (watch::Sender<VectorProgress>, Arc<tokio::sync::Notify>) {
    (
        watch::channel(VectorProgress::default()).0,
        Arc::new(tokio::sync::Notify::new()),
    )
}
