//! Calls by tool, server and outcome, and their latency split into the wait for a permit
//! and the whole call.

use std::{
    collections::HashMap,
    sync::{PoisonError, RwLock},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};
use quiver_registry::{CallMeasure, CallObserver, Outcome};

/// Upper bounds of the latency buckets, in seconds: 100 µs (an in-process tool) to a minute
/// (a slow upstream near the default call timeout).
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0, 60.0,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    server: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    server: String,
    phase: &'static str,
}

type Latency = Family<LatencyLabels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The series of one tool, resolved once: the label sets are hashed and allocated on a
/// tool's first call only.
struct ToolSeries {
    /// The family it was counted under (a name re-registered by another family gets new
    /// series).
    family: Option<Box<str>>,
    /// By [`Outcome::ALL`]'s order.
    calls: [Counter; 4],
    queued: Histogram,
    took: Histogram,
}

/// The `server` label of a family: an MCP server's name (`mcp:git` gives `git`); Quiver's
/// own families in parentheses (`(core)`, `(custom)`), so no server name can collide with
/// them; `(undefined)` for a name the catalog does not have.
fn server_label(family: Option<&str>) -> String {
    match family {
        Some(f) => match f.strip_prefix("mcp:") {
            Some(server) => server.to_owned(),
            None => format!("({f})"),
        },
        None => "(undefined)".to_owned(),
    }
}

pub(crate) struct CallMetrics {
    calls: Family<CallLabels, Counter>,
    latency: Latency,
    by_tool: RwLock<HashMap<Box<str>, ToolSeries, foldhash::fast::RandomState>>,
}

impl CallMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls by tool, server (the MCP server, or Quiver's own family in parentheses) and outcome (ok, hint, err; refused: stopped before the tool ran)",
            calls.clone(),
        );
        let latency: Latency = Family::new_with_constructor(histogram);
        registry.register(
            "tool_call_seconds",
            "Latency of the tool calls that ran, by server; phase queued: the wait for a concurrency permit, phase took: the whole call, the wait included",
            latency.clone(),
        );
        CallMetrics {
            calls,
            latency,
            by_tool: RwLock::default(),
        }
    }

    fn resolve(&self, tool: &str, family: Option<&str>) -> ToolSeries {
        let server = server_label(family);
        let calls = Outcome::ALL.map(|o| {
            self.calls
                .get_or_create(&CallLabels {
                    tool: tool.to_owned(),
                    server: server.clone(),
                    outcome: o.as_str(),
                })
                .clone()
        });
        let phase = |phase| {
            self.latency
                .get_or_create(&LatencyLabels {
                    server: server.clone(),
                    phase,
                })
                .clone()
        };
        ToolSeries {
            family: family.map(Box::from),
            calls,
            queued: phase("queued"),
            took: phase("took"),
        }
    }
}

fn count(series: &ToolSeries, measure: &CallMeasure<'_>) {
    let i = match measure.outcome {
        Outcome::Ok => 0,
        Outcome::Hint => 1,
        Outcome::Err => 2,
        _ => 3,
    };
    series.calls[i].inc();
    if measure.outcome != Outcome::Refused {
        series.queued.observe(measure.queued.as_secs_f64());
        series.took.observe(measure.took.as_secs_f64());
    }
}

impl CallObserver for CallMetrics {
    fn call_finished(&self, _: Option<&str>, _: &str, _: &quiver_contract::Envelope) {}

    fn call_measured(&self, measure: &CallMeasure<'_>) {
        {
            let by_tool = self.by_tool.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = by_tool.get(measure.tool)
                && series.family.as_deref() == measure.family
            {
                count(series, measure);
                return;
            }
        }
        let series = self.resolve(measure.tool, measure.family);
        count(&series, measure);
        self.by_tool
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(measure.tool.into(), series);
    }
}

impl std::fmt::Debug for CallMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallMetrics").finish_non_exhaustive()
    }
}
