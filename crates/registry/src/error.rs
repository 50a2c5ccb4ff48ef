use quiver_contract::ContractError;
use thiserror::Error;

/// Harness faults of the registry. A tool's own failure is never one of these: it is an
/// Err envelope.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A tool of that name is already registered.
    #[error("a tool named `{name}` is already registered")]
    Conflict {
        /// The name.
        name: String,
    },
    /// The spec breaks a contract rule.
    #[error(transparent)]
    InvalidSpec(#[from] ContractError),
    /// The input or output schema does not compile.
    #[error("tool `{name}`: {reason}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// The compiler's complaint.
        reason: String,
    },
    /// The declared family order and the families given disagree.
    #[error("catalog assembly: {0}")]
    Assembly(String),
    /// No such tool.
    #[error("no tool named `{name}`")]
    NotFound {
        /// The name.
        name: String,
    },
}
