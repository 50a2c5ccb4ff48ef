//! An upstream tool as a catalog tool: a spec and a proxy to the upstream.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, ErrKind, Tool, ToolResult, ToolSpec};
use serde_json::Value;

use super::{to_contract::UpstreamTool, upstream::Upstream};

/// What a timed-out call to a tool that is not read-only is told beside the timeout.
const MAY_HAVE_RUN: &str =
    "It may have run, or still be running: check its effect before calling it again.";

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
        let mut out = match self.upstream.users() {
            Some(users) => users.call(&self.name, input, ctx).await,
            None => self.upstream.call(&self.name, input, ctx).await,
        };
        // The server's own `call_timeout` ended the call: abandoned is not undone, as the
        // dispatcher's timeout says too. A tool that changes things may have done so, or
        // be at it still, and calling it again would do it twice.
        if let Envelope::Err {
            message,
            err_kind: ErrKind::Timeout,
        } = &mut out
            && !self.spec.annotations.read_only
            && !message.contains(MAY_HAVE_RUN)
        {
            message.push_str(". ");
            message.push_str(MAY_HAVE_RUN);
        }
        Ok(out)
    }
}
