//! The admin web page's wiring: the host's parts behind the page's ports (the MCP client as
//! [`Upstreams`], the reloader's configuration as [`ConfigView`]) and the page over the
//! app's store, surface and custom tools.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_admin_web::{AdminPage, ConfigView, LoginStore, StoredLogin, UpstreamRow, Upstreams};
use quiver_mcp_adapter::{AdminToken, McpClient, ServerState};
use quiver_surface::ports::SessionStore;

use crate::{App, reload::Reloader, store::Store};

/// The admin page's logins in a store several replicas share, as surface-state values
/// (`admin_login/<id>`), so that a login on one replica holds on every other (a load
/// balancer may send each request anywhere). An ended login is written as null; an expired
/// one is refused by its time (its row stays, a few hundred bytes a login).
struct StoredLogins(Arc<Store>);

const LOGIN_KEY: &str = "admin_login/";

#[async_trait]
impl LoginStore for StoredLogins {
    async fn put(&self, id: &str, login: &StoredLogin) -> Result<(), String> {
        let value = serde_json::to_value(login).map_err(|e| e.to_string())?;
        self.0
            .put_state(&format!("{LOGIN_KEY}{id}"), value)
            .await
            .map_err(|e| e.to_string())
    }

    async fn get(&self, id: &str) -> Result<Option<StoredLogin>, String> {
        let Some(state) = self
            .0
            .state(&format!("{LOGIN_KEY}{id}"))
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        // Null (ended) or a value of another shape: no login.
        Ok(serde_json::from_value(state.value).ok())
    }

    async fn remove(&self, id: &str) -> Result<(), String> {
        self.0
            .put_state(&format!("{LOGIN_KEY}{id}"), serde_json::Value::Null)
            .await
            .map_err(|e| e.to_string())
    }
}

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
    let page = AdminPage::new(
        app.surface.clone(),
        app.store.clone(),
        app.store.clone(),
        app.custom.clone(),
        Arc::new(ClientUpstreams(app.mcp.clone())),
        Arc::new(ReloaderConfig(
            reloader,
            crate::check::CheckSources::of(app),
        )),
        Arc::new(move |fingerprint: &str| token.fingerprint_matches(fingerprint)),
    );
    // Replicas on one store share their logins; a store only this process uses keeps them
    // in memory (nothing to share, and no row written per login).
    if app.store.shared() {
        page.with_logins(Arc::new(StoredLogins(app.store.clone())))
    } else {
        page
    }
}
