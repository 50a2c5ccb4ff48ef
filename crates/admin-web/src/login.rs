//! Login sessions: a random id in an HttpOnly, SameSite=Strict cookie names a session kept
//! here, which holds the token it was opened with (checked again on every request, so a
//! token rotated by a reload ends it) and the CSRF token its forms carry.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, header};

/// The cookie's name.
pub(crate) const COOKIE: &str = "quiver_admin";

/// How long a login lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The most sessions kept; the oldest is dropped past it (each login makes one).
const MAX_SESSIONS: usize = 1024;

#[derive(Clone)]
pub(crate) struct Login {
    pub(crate) token: String,
    pub(crate) csrf: String,
    opened: Instant,
}

#[derive(Default)]
pub(crate) struct Logins {
    sessions: Mutex<HashMap<String, Login>>,
}

/// 244 random bits (two v4 UUIDs), hex.
fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Logins {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Login>> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a session for `token` (already checked); its id.
    pub(crate) fn open(&self, token: &str) -> String {
        let id = random();
        let mut sessions = self.lock();
        sessions.retain(|_, l| l.opened.elapsed() < LIFETIME);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, l)| l.opened)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            Login {
                token: token.to_owned(),
                csrf: random(),
                opened: Instant::now(),
            },
        );
        id
    }

    /// The session the request's cookie names, if it is live.
    pub(crate) fn find(&self, headers: &HeaderMap) -> Option<(String, Login)> {
        let id = cookie(headers)?;
        let sessions = self.lock();
        let login = sessions.get(&id)?;
        (login.opened.elapsed() < LIFETIME).then(|| (id.clone(), login.clone()))
    }

    /// Ends a session.
    pub(crate) fn close(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The session id in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// The `Set-Cookie` value of a new session (no `Secure`: `quiver serve` speaks plain HTTP,
/// usually on loopback; a TLS proxy in front may add it).
pub(crate) fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that removes the cookie.
pub(crate) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Compares in constant time (the length aside).
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_cookie_only() {
        let logins = Logins::default();
        let id = logins.open("t0ken-t0ken-t0ken");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("other=1; {COOKIE}={id}").parse().unwrap(),
        );
        let (found, login) = logins.find(&headers).expect("found");
        assert_eq!(found, id);
        assert_eq!(login.token, "t0ken-t0ken-t0ken");
        assert_eq!(login.csrf.len(), 64);
        headers.insert(header::COOKIE, format!("{COOKIE}=x{id}").parse().unwrap());
        assert!(logins.find(&headers).is_none());
        logins.close(&id);
        headers.insert(header::COOKIE, format!("{COOKIE}={id}").parse().unwrap());
        assert!(logins.find(&headers).is_none());
        assert!(set_cookie(&id).contains("HttpOnly; SameSite=Strict"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
