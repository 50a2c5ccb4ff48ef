use thiserror::Error;

/// Harness faults of the surface. A model's bad query is never one of these: it is a Hint.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SurfaceError {
    /// The composed surface is larger than the hard cap; nothing is truncated silently.
    #[error(
        "the composed surface for session `{session}` has {count} tools, above max_surface {max}; lower the round budget or raise max_surface"
    )]
    TooLarge {
        /// The session.
        session: String,
        /// How many tools were composed.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// The configuration contradicts itself.
    #[error("surface configuration: {0}")]
    InvalidConfig(String),
}
