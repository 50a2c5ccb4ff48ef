//! The metrics adapter's behaviour, through its public API.

mod metrics;
