//! The registry is the one place tools live and the one path every call takes. [`Catalog`]
//! holds the registered tools (first registration wins; every skipped name is reported);
//! [`Dispatcher`] runs each call through lookup, narration stripping, schema validation,
//! policy, the loop guard, the tower middleware stack (recover, timeout, concurrency, result
//! limit, telemetry) and the recorder. The ports it consumes ([`ToolCallRecorder`],
//! [`PolicyCheck`]) are defined here, in its own vocabulary, with in-memory implementations.
//! The [`sandbox`] module holds the port custom tools' JavaScript runs through (`Sandbox`,
//! `SandboxHost`, their limits and errors); its engine lives in an adapter crate.

mod catalog;
mod dispatch;
mod error;
pub mod layers;
mod policy;
mod ports;
pub mod sandbox;
mod skill;
mod state;
mod store;
mod suggest;
mod validate;

pub use catalog::{
    AbsentExplainer, AdvertiseOptions, Catalog, CatalogEvent, Entry, Family, RegisterReport,
    Skipped, advertise, advertised_extra_bytes, order_families,
};
pub use dispatch::{
    ABSENT_TEXT, BatchCall, DispatchConfig, Dispatcher, DispatcherBuilder, REFUSED_KINDS,
    UNDEFINED_TOOLS, refused_before_running,
};
pub use error::RegistryError;
pub use layers::telemetry::{Metrics, ToolCounters};
pub use policy::{PolicyAction, PolicyRule, RulePolicy};
pub use ports::{
    CallObserver, CallRecord, MemoryRecorder, NoPolicy, NullRecorder, PolicyCheck, PolicyRequest,
    PolicyVerdict, ToolCallRecorder,
};
pub use skill::{
    LIST_ALL, MAX_LISTED_FILES, MAX_SKILL_BYTES, MAX_SKILL_LISTING_BYTES, SKILL_TOOL, Skill,
    SkillProblem, SkillSet, SkillSource, skill_tool,
};
pub use store::{
    ALL_TENANTS, CallFilter, CallLog, DefinitionStore, JobStatus, JobStore, JobType, LoggedCall,
    MemoryCallLog, MemoryDefinitionStore, MemoryJobStore, NewJob, OUTPUT_SUMMARY_CHARS, SeedPlan,
    SeedReport, StoreError, ToolDefinition, ToolJob, ToolType, output_summary, parse_lifecycle,
    plan_seed,
};
pub use suggest::did_you_mean;
pub use validate::REFUSED_ARGUMENTS;

#[cfg(feature = "mock")]
pub use ports::{MockPolicyCheck, MockToolCallRecorder};
#[cfg(feature = "mock")]
pub use skill::MockSkillSource;
#[cfg(feature = "mock")]
pub use store::{MockCallLog, MockDefinitionStore, MockJobStore};
