//! The registry is the one place tools live and the one path every call takes. [`Catalog`]
//! holds the registered tools (first registration wins; every skipped name is reported);
//! [`Dispatcher`] runs each call through lookup, narration stripping, schema validation,
//! policy, the loop guard, the tower middleware stack (recover, timeout, concurrency, result
//! limit, telemetry) and the recorder. The ports it consumes ([`ToolCallRecorder`],
//! [`PolicyCheck`]) are defined here, in its own vocabulary, with in-memory implementations.
//! The [`sandbox`] module holds the port custom tools' JavaScript runs through (`Sandbox`,
//! `SandboxHost`, their limits and errors); its engine lives in an adapter crate.
//! The [`store`] module holds the store ports (definitions, build jobs, the execution log)
//! with their types and in-memory implementations; [`skill`] holds skills and the tool that
//! loads them. Each middleware layer's config ([`TimeoutConfig`], [`ConcurrencyConfig`],
//! [`ResultLimitConfig`], [`RecoverConfig`]) is also named at the root, beside
//! [`DispatchConfig`], which holds the ones the dispatcher is built with.
//!
//! # Example
//!
//! Register a typed tool, build a dispatcher that records every call in memory, and call
//! the tool through the whole pipeline; a call of a name nobody registered is answered, and
//! recorded, too:
//!
//! ```
//! use std::sync::Arc;
//!
//! use quiver_contract::{CallContext, Envelope, ToolSpec, typed_tool};
//! use quiver_registry::{Catalog, Dispatcher, MemoryRecorder};
//! use serde_json::json;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Greet {
//!     name: String,
//! }
//!
//! let catalog = Arc::new(Catalog::new());
//! catalog.must_register(Arc::new(typed_tool(
//!     ToolSpec::new("greet", "Greets someone by name.").read_only(),
//!     |args: Greet, _ctx: CallContext| async move {
//!         Ok(Envelope::ok(json!(format!("Hello, {}!", args.name))))
//!     },
//! )));
//! let recorder = Arc::new(MemoryRecorder::new());
//! let dispatcher = Dispatcher::builder(catalog).recorder(recorder.clone()).build();
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! runtime.block_on(async {
//!     let hello = dispatcher
//!         .call("greet", json!({"name": "Ada"}), CallContext::for_session("s1"))
//!         .await;
//!     assert_eq!(hello.data(), Some(&json!("Hello, Ada!")));
//!
//!     // A typo gets an error the model can act on (a did-you-mean), not a panic.
//!     let typo = dispatcher.call("gret", json!({}), CallContext::for_session("s1")).await;
//!     assert!(typo.is_err());
//! });
//! assert_eq!(recorder.len(), 2);
//! ```

mod catalog;
pub mod chain;
pub mod curated;
pub mod custom;
mod dispatch;
mod error;
pub mod identity;
pub mod kept;
pub mod layers;
pub mod log_writer;
mod policy;
mod ports;
mod refs;
pub mod sandbox;
pub mod shape;
pub mod skill;
mod state;
pub mod store;
mod suggest;
mod sync;
mod validate;

pub use catalog::{
    AbsentExplainer, AdvertiseOptions, Catalog, CatalogEvent, Entry, Family, FamilyOrder,
    FamilyTools, RegisterReport, Skipped, advertise, advertised_extra_bytes, order_families,
};
pub use dispatch::{
    BatchCall, DispatchConfig, Dispatcher, DispatcherBuilder, UNDEFINED_TOOLS,
    refused_before_running,
};
pub use error::RegistryError;
pub use layers::{
    concurrency::ConcurrencyConfig,
    recover::RecoverConfig,
    result_limit::ResultLimitConfig,
    telemetry::{Metrics, ToolCounters},
    timeout::TimeoutConfig,
};
pub use policy::{PolicyAction, PolicyRule, RulePolicy, policy_findings};
pub use ports::{
    CallMeasure, CallObserver, CallRecord, MemoryRecorder, NoPolicy, NullRecorder, Outcome,
    PolicyCheck, PolicyRequest, PolicyVerdict, ToolCallRecorder,
};
pub use refs::{ToolRef, unmatched_tool_refs};
pub use suggest::{did_you_mean, suggestion};
pub use validate::REFUSED_ARGUMENTS;

#[cfg(feature = "mock")]
pub use ports::{MockPolicyCheck, MockToolCallRecorder};
