//! What an operator reads of the surface (the admin page): each session as its model sees
//! it, and the modes that list a tool. Read without starting a round, creating a session
//! or marking one used, so looking changes nothing a model sees.

use std::sync::Arc;

use quiver_contract::{Capabilities, Mode};

use crate::{ComposedSurface, Surface, SurfaceError, compose::Walk, sync::lock};

/// Who listed a session's tools last, as the server saw that request.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionClient {
    /// The authenticated token's name, if the request had one.
    pub principal: Option<String>,
    /// The protocol version and era the server names for the request
    /// (`2025-06-18 (session era)`), when it knows one.
    pub protocol: Option<String>,
    /// What the request was allowed: the session's surface is composed with it.
    pub capabilities: Arc<Capabilities>,
}

impl SessionClient {
    /// A client with these fields.
    pub fn new(
        principal: Option<String>,
        protocol: Option<String>,
        capabilities: Arc<Capabilities>,
    ) -> Self {
        SessionClient {
            principal,
            protocol,
            capabilities,
        }
    }
}

/// One tool of a session's working set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkingSetSlot {
    /// The tool.
    pub name: String,
    /// The definition bytes it takes of the set's budget.
    pub bytes: usize,
    /// Rounds since it was last paged in or called (it leaves after `idle_rounds`).
    pub idle_rounds: u64,
}

/// A session as an operator reads it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionView {
    /// The working-set key.
    pub key: String,
    /// The mode of its latest composition or call.
    pub mode: Mode,
    /// Its rounds so far.
    pub round: u64,
    /// Who listed its tools last (none: no `tools/list` yet, or not over MCP).
    pub client: Option<SessionClient>,
    /// The working set, most recently used first.
    pub working_set: Vec<WorkingSetSlot>,
    /// The bytes the working set takes of `working_set.max_bytes`.
    pub working_set_bytes: usize,
    /// The tools its model is listed now (composed with the client's capabilities, or
    /// every capability when no client is known), and those left off with why.
    pub surface: ComposedSurface,
}

impl Surface {
    /// Notes who listed the session's tools (the MCP server calls this on `tools/list`),
    /// for [`Surface::session_view`]. Nothing when the surface holds no such session.
    pub fn note_client(&self, session: &str, client: SessionClient) {
        if let Some(s) = lock(&self.sessions).get_mut(session) {
            s.client = Some(Arc::new(client));
        }
    }

    /// The session as its model sees it now, or `None` when the surface holds no such
    /// session. Neither starts a round nor marks the session used. An error when its list
    /// cannot be composed (see [`SurfaceError::TooLarge`]).
    pub fn session_view(&self, session: &str) -> Result<Option<SessionView>, SurfaceError> {
        let (mode, round, client, working_set, working_set_bytes) = {
            let sessions = lock(&self.sessions);
            let Some(s) = sessions.get(session) else {
                return Ok(None);
            };
            let slots: Vec<WorkingSetSlot> = s
                .by_recency_idle()
                .into_iter()
                .map(|(name, idle_rounds)| WorkingSetSlot {
                    bytes: s.slot_bytes(&name).unwrap_or(0),
                    name,
                    idle_rounds,
                })
                .collect();
            (s.mode, s.round, s.client.clone(), slots, s.bytes())
        };
        let all = Arc::new(Capabilities::all());
        let capabilities = client.as_ref().map_or(&all, |c| &c.capabilities);
        let (surface, _) = self.walk(session, mode, capabilities, Walk::View)?;
        Ok(Some(SessionView {
            key: session.to_owned(),
            mode,
            round,
            client: client.map(|c| (*c).clone()),
            working_set,
            working_set_bytes,
            surface,
        }))
    }

    /// The modes whose lists may hold `name` (in [`Mode::ALL`]'s order): the tool's own
    /// rule (plan mode lists read-only and plan-only tools) and the configured mode lists
    /// (`agentic_only`, `delegate_excluded`); none for a tool never offered (`unoffered`),
    /// internal, retired, or not in the catalog.
    pub fn listing_modes(&self, name: &str) -> Vec<Mode> {
        let Some(entry) = self.catalog.lookup(name) else {
            return Vec::new();
        };
        let settings = self.settings();
        if settings.unoffered(name) {
            return Vec::new();
        }
        Mode::ALL
            .into_iter()
            .filter(|m| entry.spec.listed_in(*m) && !settings.mode_excluded(*m, name))
            .collect()
    }
}
