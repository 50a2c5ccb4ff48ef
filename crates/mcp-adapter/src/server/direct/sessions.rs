//! The sessions the direct path may answer: their registry (filled by the session's handler
//! once it is initialized), the request ids in use on each, the idle timer a session used
//! only here keeps alive, and what this path says about a session's start and end (a second
//! `initialize`, the session limit, `DELETE`).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::Request,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use rmcp::{
    RoleServer, model::RequestId, service::Peer,
    transport::streamable_http_server::session::SessionManager,
};
use serde_json::Value;

use super::{Direct, SESSION_HEADER, answer::json_rpc_error, forward::forward};
use crate::server::{invalid::INVALID_REQUEST, scope::Connection};
use crate::sync::lock;

/// How often a session used on the direct path touches rmcp's idle timer.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// A registered session: its connection state and its client.
pub(in crate::server) struct Entry {
    pub(in crate::server) conn: Arc<Connection>,
    pub(super) peer: Peer<RoleServer>,
    touched: Mutex<Instant>,
}

/// The HTTP sessions whose handler registered them, by session id.
#[derive(Default)]
pub(crate) struct DirectSessions {
    map: Mutex<HashMap<Arc<str>, Arc<Entry>>>,
}

impl DirectSessions {
    pub(crate) fn insert(&self, sid: Arc<str>, conn: Arc<Connection>, peer: Peer<RoleServer>) {
        let entry = Arc::new(Entry {
            conn,
            peer,
            touched: Mutex::new(Instant::now()),
        });
        lock(&self.map).insert(sid, entry);
    }

    pub(crate) fn remove(&self, sid: &str) {
        lock(&self.map).remove(sid);
    }

    pub(in crate::server) fn get(&self, sid: &str) -> Option<Arc<Entry>> {
        lock(&self.map).get(sid).cloned()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

/// A request id held in use on its session; released when dropped.
pub(super) struct IdHeld {
    conn: Arc<Connection>,
    id: RequestId,
}

impl IdHeld {
    /// Holds `id`, unless a request of the session already does.
    pub(super) fn claim(entry: &Entry, id: &RequestId) -> Option<IdHeld> {
        lock(&entry.conn.ids_in_use)
            .insert(id.clone())
            .then(|| IdHeld {
                conn: entry.conn.clone(),
                id: id.clone(),
            })
    }
}

impl Drop for IdHeld {
    fn drop(&mut self) {
        lock(&self.conn.ids_in_use).remove(&self.id);
    }
}

/// Keeps rmcp's idle timer of a session used only here from closing it.
pub(super) fn touch(direct: &Direct, sid: &Arc<str>, entry: &Entry) {
    {
        let mut touched = lock(&entry.touched);
        if touched.elapsed() < TOUCH_EVERY {
            return;
        }
        *touched = Instant::now();
    }
    let sessions = direct.sessions.clone();
    let sid = sid.clone();
    tokio::spawn(async move {
        let handle = sessions.sessions.read().await.get(&*sid).cloned();
        if let Some(handle) = handle
            && let Ok(channel) = handle.establish_request_wise_channel().await
            && let Some(id) = channel.http_request_id
        {
            let _ = handle.close_request_wise_channel(id).await;
        }
    });
}

/// The refusal of an `initialize` (`head`: the request's method and id) on the live session
/// `sid`: rmcp would answer it with the version it asks for, while the session keeps the
/// first one's.
pub(super) async fn second_initialize(
    direct: &Direct,
    sid: &Arc<str>,
    head: Option<&(String, RequestId)>,
) -> Option<Response> {
    let (method, id) = head?;
    if method != "initialize" || !direct.sessions.has_session(sid).await.unwrap_or(false) {
        return None;
    }
    Some(json_rpc_error(
        StatusCode::BAD_REQUEST,
        serde_json::to_value(id).unwrap_or(Value::Null),
        INVALID_REQUEST,
        "Invalid Request: this session is already initialized (`initialize` comes once, as its first request); to negotiate again, open a new session: POST `initialize` without `Mcp-Session-Id`",
    ))
}

/// 503 with a JSON-RPC error: the server has `max` sessions open.
pub(super) fn too_many_sessions(id: Value, max: usize) -> Response {
    let mut response = json_rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        -32000,
        &format!(
            "this server has {max} sessions open, its limit (`[limits] max_http_sessions`): end sessions you no longer use (DELETE), or try again later"
        ),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("30"),
    );
    response
}

/// `DELETE`: rmcp ends the session (after its Host, Origin and session checks); once it
/// has, the session's calls still running are cancelled (upstream too), instead of running
/// on for a client that has left.
pub(super) async fn end_session(direct: &Direct, request: Request) -> Response {
    let sid = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let known = match &sid {
        Some(sid) => direct
            .sessions
            .has_session(&sid.as_str().into())
            .await
            .unwrap_or(false),
        None => false,
    };
    let response = forward(direct, request).await;
    // rmcp accepts the end of a session it does not have (never had, or ended already); a
    // session id that is gone is answered 404, as for any other request.
    if response.status().is_success() && sid.is_some() && !known {
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    if response.status().is_success()
        && let Some(entry) = sid.and_then(|sid| direct.shared.direct.get(&sid))
    {
        entry.conn.deleted.cancel();
    }
    // Ended: 200, as the SDKs expect (rmcp says 202, which the official Python client
    // logs as "Session termination failed: 202" at every close).
    if response.status() == StatusCode::ACCEPTED {
        return StatusCode::OK.into_response();
    }
    response
}
