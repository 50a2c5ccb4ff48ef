use thiserror::Error;

/// Errors in the vocabulary itself: a name or a spec that breaks the rules.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ContractError {
    /// A tool or server name that breaks the naming rules; it is never rewritten.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// `tool`, `MCP tool` or `server`.
        what: &'static str,
        /// The rejected name, lossily shown.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A spec whose input schema is not a JSON object schema, or whose output schema does
    /// not describe an object.
    #[error("tool `{name}` has an invalid schema: {reason}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
    },
}
