//! Counts the execution-log rows handed to the recorder.

use std::sync::{Arc, atomic::Ordering};

use async_trait::async_trait;
use quiver_registry::{CallRecord, ToolCallRecorder};

use crate::Count;

pub(crate) struct CountingRecorder {
    inner: Arc<dyn ToolCallRecorder>,
    handed: Count,
}

impl CountingRecorder {
    pub(crate) fn new(inner: Arc<dyn ToolCallRecorder>, handed: Count) -> Self {
        CountingRecorder { inner, handed }
    }
}

#[async_trait]
impl ToolCallRecorder for CountingRecorder {
    async fn record(&self, record: CallRecord) {
        // Counted as it is handed over: a row waiting for room in a full queue, or held
        // with its answer until it is committed (`durability = "strict"`), is waiting too.
        self.handed.fetch_add(1, Ordering::Relaxed);
        self.inner.record(record).await;
    }

    async fn flush(&self) {
        self.inner.flush().await;
    }
}
