//! Quiver's traces exported with OpenTelemetry.
//!
//! The spans are ordinary `tracing` spans under the [`quiver_contract::trace::TARGET`]
//! target, named and attributed after the OpenTelemetry semantic conventions for MCP and
//! GenAI tool calls. This adapter bridges them to OpenTelemetry (`tracing-opentelemetry`),
//! exports them batched over OTLP (HTTP with protobuf bodies, or gRPC), and fills the
//! contract's trace-context port with the W3C `traceparent` / `tracestate` propagator.
//!
//! Nothing here runs unless [`Telemetry::start`] is called: no exporter thread, no span
//! recorded. The host calls it only when `[telemetry] otlp_endpoint` is set.

use std::{collections::HashMap, fmt, time::Duration};

use opentelemetry::{
    propagation::TextMapPropagator,
    trace::{TraceContextExt, TracerProvider as _},
};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{Sampler, SdkTracerProvider},
};
use quiver_contract::trace::{Propagation, TARGET, TraceContext};
use tracing::{Level, Subscriber};
use tracing_subscriber::{Layer, filter::Targets, registry::LookupSpan};

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// OTLP over HTTP with protobuf bodies (`POST <endpoint>/v1/traces`), port 4318 by
    /// convention.
    HttpProtobuf,
    /// OTLP over gRPC, port 4317 by convention.
    Grpc,
}

/// Where and how to export.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExportConfig {
    /// The collector: `http://collector:4318` (HTTP, `/v1/traces` is added when the URL
    /// has no path) or `http://collector:4317` (gRPC).
    pub endpoint: String,
    /// HTTP or gRPC.
    pub protocol: Protocol,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Headers (HTTP) or metadata (gRPC) sent with every export, for a collector's API key.
    pub headers: Vec<(String, String)>,
    /// The share of new traces recorded, 0.0 to 1.0; a trace a client started keeps its
    /// client's sampling decision.
    pub sample_ratio: f64,
    /// How long one export may take.
    pub timeout: Duration,
}

impl ExportConfig {
    /// HTTP export to `endpoint`, every trace sampled, as service `quiver`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        ExportConfig {
            endpoint: endpoint.into(),
            protocol: Protocol::HttpProtobuf,
            service_name: "quiver".into(),
            headers: Vec::new(),
            sample_ratio: 1.0,
            timeout: Duration::from_secs(10),
        }
    }

    /// The URL spans are sent to.
    pub fn traces_url(&self) -> String {
        let endpoint = self.endpoint.trim_end_matches('/');
        match self.protocol {
            Protocol::Grpc => endpoint.to_owned(),
            Protocol::HttpProtobuf => {
                let after_scheme = endpoint
                    .split_once("://")
                    .map_or(endpoint, |(_, rest)| rest);
                if after_scheme.contains('/') {
                    endpoint.to_owned()
                } else {
                    format!("{endpoint}/v1/traces")
                }
            }
        }
    }
}

/// Why export cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The exporter refused its configuration (a bad endpoint or header).
    #[error("cannot export traces to {endpoint}: {reason}")]
    Exporter {
        /// The configured endpoint.
        endpoint: String,
        /// What the exporter said.
        reason: String,
    },
}

/// Running trace export: the provider whose batch processor sends spans.
pub struct Telemetry {
    provider: SdkTracerProvider,
    url: String,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry").field("url", &self.url).finish()
    }
}

impl Telemetry {
    /// Starts export (a batch processor thread). gRPC export needs to be started inside a
    /// Tokio runtime, whose reactor its channel uses.
    pub fn start(config: &ExportConfig) -> Result<Telemetry, TelemetryError> {
        let url = config.traces_url();
        let failed = |e: &dyn fmt::Display| TelemetryError::Exporter {
            endpoint: url.clone(),
            reason: e.to_string(),
        };
        // The process's TLS provider, for an https collector (installed once, by whichever
        // adapter comes first).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = match config.protocol {
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .with_timeout(config.timeout)
                .with_headers(config.headers.iter().cloned().collect::<HashMap<_, _>>())
                .build()
                .map_err(|e| failed(&e))?,
            Protocol::Grpc => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (name, value) in &config.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(
                        name.to_ascii_lowercase().as_bytes(),
                    )
                    .map_err(|e| failed(&format!("header {name:?}: {e}")))?;
                    let value = value
                        .parse()
                        .map_err(|e| failed(&format!("header {name:?}: {e}")))?;
                    metadata.insert(key, value);
                }
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(url.clone())
                    .with_timeout(config.timeout)
                    .with_metadata(metadata)
                    .build()
                    .map_err(|e| failed(&e))?
            }
        };
        let ratio = config.sample_ratio.clamp(0.0, 1.0);
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        Ok(Telemetry { provider, url })
    }

    /// The URL spans go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The `tracing` layer that turns Quiver's trace spans into OpenTelemetry spans. It
    /// sees only the [`TARGET`] spans, whatever the log filter says.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("quiver"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target(TARGET, Level::TRACE))
    }

    /// The W3C trace-context propagation for [`quiver_contract::trace::install`].
    pub fn propagation(&self) -> Box<dyn Propagation> {
        Box::new(W3cPropagation(TraceContextPropagator::new()))
    }

    /// Sends what is batched and stops the processor; waits at most `timeout`.
    pub fn shutdown(&self, timeout: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(timeout) {
            tracing::warn!(url = %self.url, "traces still batched were not all sent at shutdown: {e}");
        }
    }
}

/// `traceparent` / `tracestate` in and out.
struct W3cPropagation(TraceContextPropagator);

impl Propagation for W3cPropagation {
    fn current(&self) -> Option<TraceContext> {
        let cx = opentelemetry::Context::current();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = HashMap::new();
        self.0.inject_context(&cx, &mut carrier);
        let traceparent = carrier.remove("traceparent")?;
        let tracestate = carrier.remove("tracestate").filter(|s| !s.is_empty());
        Some(TraceContext::new(traceparent, tracestate))
    }

    fn with_remote_parent(&self, remote: &TraceContext, make: &mut dyn FnMut()) {
        let mut carrier = HashMap::from([("traceparent".to_owned(), remote.traceparent.clone())]);
        if let Some(state) = &remote.tracestate {
            carrier.insert("tracestate".to_owned(), state.clone());
        }
        let cx = self.0.extract(&carrier);
        if cx.span().span_context().is_valid() {
            let _attached = cx.attach();
            make();
        } else {
            make();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_endpoint_without_a_path_gets_the_traces_path() {
        let mut c = ExportConfig::new("http://collector:4318");
        assert_eq!(c.traces_url(), "http://collector:4318/v1/traces");
        c.endpoint = "http://collector:4318/".into();
        assert_eq!(c.traces_url(), "http://collector:4318/v1/traces");
        c.endpoint = "https://otlp.example.com/custom/traces".into();
        assert_eq!(c.traces_url(), "https://otlp.example.com/custom/traces");
        c.protocol = Protocol::Grpc;
        c.endpoint = "http://collector:4317".into();
        assert_eq!(c.traces_url(), "http://collector:4317");
    }

    #[test]
    fn a_remote_parent_is_current_while_the_closure_runs_and_a_bad_one_is_ignored() {
        let p = W3cPropagation(TraceContextPropagator::new());
        let remote = TraceContext::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("vendor=x".into()),
        );
        let mut seen = None;
        p.with_remote_parent(&remote, &mut || seen = p.current());
        assert_eq!(seen, Some(remote));
        assert_eq!(
            p.current(),
            None,
            "the remote context ends with the closure"
        );
        let mut ran = false;
        p.with_remote_parent(&TraceContext::new("garbage", None), &mut || {
            ran = true;
            assert_eq!(p.current(), None);
        });
        assert!(ran);
    }
}
