//! Login sessions: a random id in an HttpOnly, SameSite=Strict cookie names a session kept
//! in a [`LoginStore`] (this process's memory, or the store several replicas share), which
//! holds the fingerprint of the token it was opened with (checked again on every request,
//! so a token rotated by a reload ends it) and the CSRF token its forms carry.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use axum::http::{HeaderMap, header};

/// The cookie's name.
pub(crate) const COOKIE: &str = "quiver_admin";

/// How long a login lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The most sessions [`MemoryLogins`] keeps; the oldest is dropped past it (each login
/// makes one).
const MAX_SESSIONS: usize = 1024;

/// A login as it is kept: no token, only its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredLogin {
    /// [`quiver_contract::secret_fingerprint`] of the token it was opened with.
    pub fingerprint: String,
    /// The CSRF token its forms carry.
    pub csrf: String,
    /// When it was opened (it lasts 12 hours).
    pub opened: SystemTime,
}

impl StoredLogin {
    /// Whether it is still within its lifetime.
    fn live(&self) -> bool {
        self.opened.elapsed().map_or(true, |age| age < LIFETIME)
    }
}

/// Where login sessions are kept, by their cookie's id.
#[async_trait]
pub trait LoginStore: Send + Sync {
    /// Keeps `login` under `id`.
    async fn put(&self, id: &str, login: &StoredLogin) -> Result<(), String>;
    /// The login kept under `id`, if any (live or not: the caller checks).
    async fn get(&self, id: &str) -> Result<Option<StoredLogin>, String>;
    /// Ends the login kept under `id`.
    async fn remove(&self, id: &str) -> Result<(), String>;
}

/// Logins in this process's memory: a replica's own.
#[derive(Debug, Default)]
pub struct MemoryLogins(Mutex<HashMap<String, StoredLogin>>);

impl MemoryLogins {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StoredLogin>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl LoginStore for MemoryLogins {
    async fn put(&self, id: &str, login: &StoredLogin) -> Result<(), String> {
        let mut sessions = self.lock();
        sessions.retain(|_, l| l.live());
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, l)| l.opened)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.to_owned(), login.clone());
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<StoredLogin>, String> {
        Ok(self.lock().get(id).cloned())
    }

    async fn remove(&self, id: &str) -> Result<(), String> {
        self.lock().remove(id);
        Ok(())
    }
}

/// A live login, as the handlers use it.
#[derive(Clone)]
pub(crate) struct Login {
    pub(crate) fingerprint: String,
    pub(crate) csrf: String,
}

/// 244 random bits (two v4 UUIDs), hex.
fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The login sessions of the page, over its store.
pub(crate) struct Logins(pub(crate) Arc<dyn LoginStore>);

impl Logins {
    /// Opens a session for `token` (already checked); its id.
    pub(crate) async fn open(&self, token: &str) -> Result<String, String> {
        let id = random();
        let login = StoredLogin {
            fingerprint: quiver_contract::secret_fingerprint(token),
            csrf: random(),
            opened: SystemTime::now(),
        };
        self.0.put(&id, &login).await?;
        Ok(id)
    }

    /// The session the request's cookie names, if it is live. A store that cannot be read
    /// is no login (warned).
    pub(crate) async fn find(&self, headers: &HeaderMap) -> Option<(String, Login)> {
        let id = cookie(headers)?;
        let login = match self.0.get(&id).await {
            Ok(found) => found?,
            Err(e) => {
                tracing::warn!(target: "quiver::admin", "admin page: the logins cannot be read ({e}); the request is taken as not logged in");
                return None;
            }
        };
        login.live().then_some((
            id,
            Login {
                fingerprint: login.fingerprint,
                csrf: login.csrf,
            },
        ))
    }

    /// Ends a session.
    pub(crate) async fn close(&self, id: &str) {
        if let Err(e) = self.0.remove(id).await {
            tracing::warn!(target: "quiver::admin", "admin page: a login could not be ended ({e}); it lasts until it expires");
        }
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

    #[tokio::test]
    async fn a_session_is_found_by_its_cookie_only() {
        let logins = Logins(Arc::new(MemoryLogins::default()));
        let id = logins.open("t0ken-t0ken-t0ken").await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("other=1; {COOKIE}={id}").parse().unwrap(),
        );
        let (found, login) = logins.find(&headers).await.expect("found");
        assert_eq!(found, id);
        assert_eq!(
            login.fingerprint,
            quiver_contract::secret_fingerprint("t0ken-t0ken-t0ken")
        );
        assert!(!login.fingerprint.contains("t0ken"));
        assert_eq!(login.csrf.len(), 64);
        headers.insert(header::COOKIE, format!("{COOKIE}=x{id}").parse().unwrap());
        assert!(logins.find(&headers).await.is_none());
        logins.close(&id).await;
        headers.insert(header::COOKIE, format!("{COOKIE}={id}").parse().unwrap());
        assert!(logins.find(&headers).await.is_none());
        assert!(set_cookie(&id).contains("HttpOnly; SameSite=Strict"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }

    /// A login past its lifetime is no login, whatever its store still holds.
    #[tokio::test]
    async fn an_expired_login_is_not_found() {
        let store = Arc::new(MemoryLogins::default());
        let old = StoredLogin {
            fingerprint: "f".into(),
            csrf: "c".into(),
            opened: SystemTime::now() - LIFETIME - Duration::from_secs(1),
        };
        store.put("old", &old).await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("{COOKIE}=old").parse().unwrap());
        assert!(Logins(store).find(&headers).await.is_none());
    }
}
