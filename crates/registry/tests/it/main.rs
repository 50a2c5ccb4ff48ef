//! Behaviour tests of the catalog and the dispatch pipeline, one module per area.

mod batch;
mod catalog;
mod custom;
mod pipeline;
mod skills;
mod support;
