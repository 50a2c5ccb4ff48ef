//! Sandbox runs by result, and the runs a limit stopped, by limit.

use std::sync::Arc;

use async_trait::async_trait;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use quiver_registry::sandbox::{Sandbox, SandboxError, SandboxLimits, SandboxOutput, SandboxRun};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KillLabels {
    limit: &'static str,
}

#[derive(Debug)]
pub(crate) struct SandboxCounters {
    runs: Family<RunLabels, Counter>,
    kills: Family<KillLabels, Counter>,
}

impl SandboxCounters {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "sandbox_runs",
            "Custom-tool script runs by result: ok; killed (a limit stopped it); error (it threw, did not compile, returned no JSON, was cancelled, or the sandbox was unavailable)",
            runs.clone(),
        );
        let kills = Family::<KillLabels, Counter>::default();
        registry.register(
            "sandbox_kills",
            "Custom-tool script runs a limit stopped, by limit (timeout, memory, stack, source_too_large, input_too_large, output_too_large, call_limit, depth_limit)",
            kills.clone(),
        );
        SandboxCounters { runs, kills }
    }

    fn count(&self, outcome: &Result<SandboxOutput, SandboxError>) {
        let result = match outcome {
            Ok(_) => "ok",
            Err(e) => match limit(e) {
                Some(limit) => {
                    self.kills.get_or_create(&KillLabels { limit }).inc();
                    "killed"
                }
                None => "error",
            },
        };
        self.runs.get_or_create(&RunLabels { result }).inc();
    }
}

/// The limit that stopped a run, if a limit did.
fn limit(e: &SandboxError) -> Option<&'static str> {
    match e {
        SandboxError::Timeout
        | SandboxError::Memory
        | SandboxError::Stack
        | SandboxError::SourceTooLarge
        | SandboxError::InputTooLarge
        | SandboxError::OutputTooLarge
        | SandboxError::CallLimit
        | SandboxError::DepthLimit => Some(e.kind()),
        _ => None,
    }
}

pub(crate) struct CountingSandbox {
    inner: Arc<dyn Sandbox>,
    counters: Arc<SandboxCounters>,
}

impl CountingSandbox {
    pub(crate) fn new(inner: Arc<dyn Sandbox>, counters: Arc<SandboxCounters>) -> Self {
        CountingSandbox { inner, counters }
    }
}

#[async_trait]
impl Sandbox for CountingSandbox {
    fn engine(&self) -> String {
        self.inner.engine()
    }

    fn validate(&self, source: &str, limits: &SandboxLimits) -> Result<(), SandboxError> {
        self.inner.validate(source, limits)
    }

    async fn run(&self, run: SandboxRun) -> Result<SandboxOutput, SandboxError> {
        let outcome = self.inner.run(run).await;
        self.counters.count(&outcome);
        outcome
    }
}
