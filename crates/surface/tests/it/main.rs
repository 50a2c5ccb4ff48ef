//! Integration tests of the surface: floor, composition per mode, working sets, budgets and
//! the built-in tools, through a real catalog and dispatcher.

mod compose;
mod floor;
mod persist;
mod support;
mod tools;
mod vectors;
mod view;
mod working_set;
