//! Fixtures: a catalog of stub tools, the surface over it, and a dispatcher observing it.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{
    CallContext, Capabilities, Envelope, Mode, RenderOptions, Tool, ToolResult, ToolSpec, render,
};
use quiver_registry::{Catalog, Dispatcher};
use quiver_surface::{ComposedSurface, MemoryUsage, Surface, SurfaceConfig, core_tools};
use serde_json::Value;

struct Stub {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Stub {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(Envelope::text("ok"))
    }
}

pub(crate) fn stub(spec: ToolSpec) -> Arc<dyn Tool> {
    Arc::new(Stub { spec })
}

/// A read-only tool.
pub(crate) fn ro(name: &str, description: &str) -> ToolSpec {
    ToolSpec::new(name, description).read_only()
}

/// A mutating tool.
pub(crate) fn rw(name: &str, description: &str) -> ToolSpec {
    ToolSpec::new(name, description)
}

pub(crate) struct Fixture {
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) surface: Arc<Surface>,
    pub(crate) usage: Arc<MemoryUsage>,
    pub(crate) dispatcher: Dispatcher,
}

impl Fixture {
    pub(crate) fn new(
        config: SurfaceConfig,
        specs: Vec<ToolSpec>,
        usage: &[(&str, [u64; 3])],
    ) -> Fixture {
        let catalog = Arc::new(Catalog::new());
        let usage = Arc::new(MemoryUsage::new(
            usage.iter().map(|(n, b)| ((*n).to_owned(), *b)),
        ));
        let surface = Surface::new(catalog.clone(), config, usage.clone()).expect("valid config");
        let report = catalog.register_all("core", core_tools(&surface));
        assert!(report.skipped.is_empty(), "{report:?}");
        let report = catalog.register_all("test", specs.into_iter().map(stub).collect());
        assert!(report.skipped.is_empty(), "{report:?}");
        surface.resync_index();
        let dispatcher = Dispatcher::builder(catalog.clone())
            .observer(surface.clone())
            .build();
        Fixture {
            catalog,
            surface,
            usage,
            dispatcher,
        }
    }

    pub(crate) fn assemble(&self, session: &str, mode: Mode) -> ComposedSurface {
        self.surface
            .assemble_tools(session, mode, &Capabilities::all())
            .expect("composes")
    }

    pub(crate) fn names(&self, session: &str, mode: Mode) -> Vec<String> {
        self.assemble(session, mode)
            .names()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    pub(crate) async fn call(&self, session: &str, tool: &str, input: Value) -> Envelope {
        self.dispatcher
            .call(tool, input, CallContext::for_session(session))
            .await
    }

    /// `tool_search` with `args`, in `session`.
    pub(crate) async fn search(&self, session: &str, args: Value) -> Envelope {
        self.call(session, "tool_search", args).await
    }

    pub(crate) async fn call_with(&self, ctx: CallContext, tool: &str, input: Value) -> Envelope {
        self.dispatcher.call(tool, input, ctx).await
    }
}

/// `n` read-only tools `t00`, `t01`, ... with distinct descriptions.
pub(crate) fn many(n: usize) -> Vec<ToolSpec> {
    (0..n)
        .map(|i| ro(&format!("t{i:02}"), &format!("Tool number {i}.")))
        .collect()
}

pub(crate) fn text(e: &Envelope) -> String {
    render(e, &RenderOptions::default())
}

/// The names as one line, for compact expectations.
pub(crate) fn line(names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(" ")
}
