//! The model-facing renders, locked by snapshots: one case per template.

mod render;
