//! The admin web page's wiring: the host's parts behind the page's ports (the MCP client as
//! [`Upstreams`], the reloader's configuration as [`ConfigView`]) and the page over the
//! app's store, surface and custom tools.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_admin_web::{AdminPage, ConfigView, UpstreamRow, Upstreams};
use quiver_mcp_adapter::{AdminToken, McpClient, ServerState};

use crate::{App, reload::Reloader};

/// The upstream servers as the MCP client knows them.
struct ClientUpstreams(McpClient);

#[async_trait]
impl Upstreams for ClientUpstreams {
    fn upstreams(&self) -> Vec<UpstreamRow> {
        self.0
            .status()
            .into_iter()
            .map(|s| {
                let (state, why) = match &s.state {
                    ServerState::Connecting => ("connecting", None),
                    ServerState::Connected => ("connected", None),
                    ServerState::Reconnecting => ("reconnecting", s.diagnostics.last().cloned()),
                    ServerState::Down => (
                        "down",
                        s.cannot_start
                            .clone()
                            .or_else(|| s.diagnostics.last().cloned()),
                    ),
                    ServerState::Rejected(why) => ("rejected", Some(why.clone())),
                    ServerState::Closed => ("closed", None),
                    _ => ("unknown", None),
                };
                let row = UpstreamRow::new(s.name, state).with_counts(
                    s.tools.len(),
                    s.counters.connects,
                    s.counters.drops,
                    s.counters.calls,
                );
                match why {
                    Some(why) => row.with_why(why),
                    None => row,
                }
            })
            .collect()
    }

    async fn reconnect(&self, name: &str) -> Result<String, String> {
        match self.0.restart_server(name).await {
            Ok(true) => Ok(format!(
                "`{name}` closed and dialled again; its tools return once it lists them"
            )),
            Ok(false) => Err(format!("there is no upstream server named `{name}`")),
            Err(e) => Err(format!("`{name}` could not be dialled again: {e}")),
        }
    }
}

/// The configuration the reloader holds, and its last result.
struct ReloaderConfig(Arc<Reloader>);

impl ConfigView for ReloaderConfig {
    fn effective(&self) -> String {
        self.0
            .effective_config()
            .unwrap_or_else(|| "a reload is under way: reload the page in a moment".to_owned())
    }

    fn last_reload(&self) -> Option<String> {
        self.0.last_result()
    }
}

/// The admin page over `app`'s parts; `token` is the admin token the server checks (a
/// reload replaces it in place).
pub fn admin_page(app: &App, reloader: Arc<Reloader>, token: AdminToken) -> AdminPage {
    AdminPage::new(
        app.surface.clone(),
        app.store.clone(),
        app.store.clone(),
        app.custom.clone(),
        Arc::new(ClientUpstreams(app.mcp.clone())),
        Arc::new(ReloaderConfig(reloader)),
        Arc::new(move |presented: &str| token.matches(presented)),
    )
}
