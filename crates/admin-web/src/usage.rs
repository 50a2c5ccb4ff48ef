//! The catalog's usage counts, cached: counting every tool's calls reads the whole execution
//! log (about 2 s for a million rows on SQLite), which a page view must not wait for. A view
//! takes the counts computed in the last [`FRESH`]; older ones start a count in the
//! background and are shown meanwhile, marked with their time; with none yet, a view waits
//! for the count at most [`WAIT`] and then shows the tools without it.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use quiver_surface::ports::UsageSource;
use tokio::sync::watch;

/// How long counts are used before they are counted again.
pub(crate) const FRESH: Duration = Duration::from_secs(60);

/// How long a view with no counts yet waits for the first.
pub(crate) const WAIT: Duration = Duration::from_millis(250);

/// Counts per tool: calls in the last 30 days, and in all.
pub(crate) struct Usage {
    pub(crate) at: SystemTime,
    taken: Instant,
    pub(crate) counts: HashMap<String, (u64, u64)>,
}

pub(crate) struct UsageCache {
    latest: watch::Sender<Option<Arc<Usage>>>,
    counting: AtomicBool,
}

impl Default for UsageCache {
    fn default() -> Self {
        UsageCache {
            latest: watch::Sender::new(None),
            counting: AtomicBool::new(false),
        }
    }
}

impl UsageCache {
    /// The counts to show now, if any (see the module's rules).
    pub(crate) async fn get(self: &Arc<Self>, source: &Arc<dyn UsageSource>) -> Option<Arc<Usage>> {
        let current = self.latest.borrow().clone();
        if current.as_ref().is_some_and(|u| u.taken.elapsed() < FRESH) {
            return current;
        }
        let mut next = self.latest.subscribe();
        next.mark_unchanged();
        if !self.counting.swap(true, Ordering::AcqRel) {
            let (cache, source) = (self.clone(), source.clone());
            tokio::spawn(async move {
                let at = SystemTime::now();
                match source.usage(at).await {
                    Ok(rows) => {
                        let counts = rows
                            .into_iter()
                            .map(|u| {
                                let total = u.total();
                                (u.tool, (u.last_30_days, total))
                            })
                            .collect();
                        cache.latest.send_replace(Some(Arc::new(Usage {
                            at,
                            taken: Instant::now(),
                            counts,
                        })));
                    }
                    Err(e) => {
                        tracing::warn!(target: "quiver::admin", "admin page: counting the tools' usage failed: {e}");
                    }
                }
                cache.counting.store(false, Ordering::Release);
            });
        }
        if current.is_some() {
            return current;
        }
        let _ = tokio::time::timeout(WAIT, next.changed()).await;
        next.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;
    use quiver_registry::store::StoreError;
    use quiver_surface::ports::ToolUsage;

    use super::*;

    /// Counts its calls; answers at once, or never (`stuck`).
    struct Source {
        calls: AtomicUsize,
        stuck: bool,
    }

    #[async_trait]
    impl UsageSource for Source {
        async fn usage(&self, _now: SystemTime) -> Result<Vec<ToolUsage>, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.stuck {
                std::future::pending::<()>().await;
            }
            Ok(vec![ToolUsage::new("read", 2, 1, 3)])
        }
    }

    #[tokio::test]
    async fn counts_are_counted_once_while_fresh_and_never_waited_for_long() {
        let quick = Arc::new(Source {
            calls: AtomicUsize::new(0),
            stuck: false,
        });
        let source: Arc<dyn UsageSource> = quick.clone();
        let cache = Arc::new(UsageCache::default());
        let first = cache.get(&source).await.expect("counted within the wait");
        assert_eq!(first.counts["read"], (2, 6));
        let again = cache.get(&source).await.expect("still there");
        assert!(Arc::ptr_eq(&first, &again), "fresh counts are reused");
        assert_eq!(quick.calls.load(Ordering::SeqCst), 1);

        let slow = Arc::new(Source {
            calls: AtomicUsize::new(0),
            stuck: true,
        });
        let source: Arc<dyn UsageSource> = slow.clone();
        let cache = Arc::new(UsageCache::default());
        assert!(
            cache.get(&source).await.is_none(),
            "no counts after the wait"
        );
        assert!(cache.get(&source).await.is_none());
        assert_eq!(slow.calls.load(Ordering::SeqCst), 1, "one count at a time");
    }
}
