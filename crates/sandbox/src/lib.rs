//! The sandbox adapter (not built yet; see the roadmap). It will implement the registry's
//! `Sandbox` port with QuickJS (`rquickjs`): custom tools stored as JavaScript source, each
//! call in a fresh runtime on a dedicated worker thread with hard limits on time, heap,
//! stack and output, no ambient I/O, and `call_tool` re-entering the dispatcher; plus a tool
//! source that publishes approved custom tools into the catalog's `custom tools` family.
