//! Behaviour tests of the catalog and the dispatch pipeline, one module per area.

mod batch;
mod catalog;
mod pipeline;
mod support;
