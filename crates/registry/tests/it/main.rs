//! Behaviour tests of the catalog and the dispatch pipeline, one module per area.

mod batch;
mod catalog;
mod custom;
mod fuzz_args;
mod pipeline;
mod progressive_tokens;
mod skills;
mod support;
