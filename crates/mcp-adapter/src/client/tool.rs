//! An upstream tool as a catalog tool: a spec and a proxy to the upstream.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{CallContext, Tool, ToolResult, ToolSpec};
use serde_json::Value;

use super::{to_contract::UpstreamTool, upstream::Upstream};

/// Proxies calls to one upstream tool.
pub(crate) struct McpTool {
    upstream: Arc<Upstream>,
    name: String,
    spec: ToolSpec,
}

impl McpTool {
    pub(crate) fn new(upstream: Arc<Upstream>, tool: UpstreamTool) -> Self {
        McpTool {
            upstream,
            name: tool.upstream,
            spec: tool.spec,
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        Ok(self.upstream.call(&self.name, input, ctx).await)
    }
}
