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
                let mut row = UpstreamRow::new(s.name, state).with_counts(
                    s.tools.len(),
                    s.counters.connects,
                    s.counters.drops,
                    s.counters.calls,
                );
                if let Some(at) = s.counters.last_connect {
                    row = row.with_last_connect(at);
                }
                match why {
                    Some(why) => row.with_why(why),
                    None => row,
                }
            })
            .chain(self.0.disabled_servers().into_iter().map(|name| {
                UpstreamRow::new(name, "disabled")
                    .disabled()
                    .with_why("disabled by an operator: enable it to connect it again")
            }))
            .collect()
    }

    async fn reconnect(&self, name: &str) -> Result<String, String> {
        match self.0.restart_server(name).await {
            Ok(true) => Ok(format!(
                "`{name}` closed and dialled again on this replica (other replicas keep their connections); its tools return once it lists them"
            )),
            Ok(false) if self.0.disabled_servers().iter().any(|d| d == name) => Err(format!(
                "`{name}` is disabled: enable it to connect it again"
            )),
            Ok(false) => Err(format!("there is no upstream server named `{name}`")),
            Err(e) => Err(format!("`{name}` could not be dialled again: {e}")),
        }
    }

    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<String, String> {
        if enabled {
            match self.0.enable_server(name) {
                Ok(true) => Ok(format!(
                    "`{name}` enabled and dialled on this replica (other replicas are as they were); its tools return once it lists them"
                )),
                Ok(false) => Err(format!(
                    "there is no disabled upstream server named `{name}`"
                )),
                Err(e) => Err(format!("`{name}` could not be enabled: {e}")),
            }
        } else {
            match self.0.disable_server(name).await {
                Ok(true) => Ok(format!(
                    "`{name}` disabled on this replica only (other replicas keep serving it: disable it on each): closed, its tools gone, and left closed by reloads until enabled (a restart connects it again; to keep it off everywhere, remove it from the configuration)"
                )),
                Ok(false) => Err(format!("there is no upstream server named `{name}`")),
                Err(e) => Err(format!("`{name}` could not be disabled: {e}")),
            }
        }
    }
}

/// The configuration the reloader holds, its last result, and `quiver check`'s rules over
/// the app's parts.
struct ReloaderConfig(Arc<Reloader>, crate::check::CheckSources);

impl ConfigView for ReloaderConfig {
    fn effective(&self) -> String {
        self.0
            .effective_config()
            .unwrap_or_else(|| "a reload is under way: reload the page in a moment".to_owned())
    }

    fn last_reload(&self) -> Option<String> {
        self.0.last_result()
    }

    fn findings(&self) -> Option<Vec<quiver_contract::Finding>> {
        let config = self.0.config_in_force()?;
        Some(crate::check::findings_in(&self.1, &config))
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
        Arc::new(ReloaderConfig(
            reloader,
            crate::check::CheckSources::of(app),
        )),
        Arc::new(move |presented: &str| token.matches(presented)),
    )
}
