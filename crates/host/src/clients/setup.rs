//! `quiver client setup`: Quiver's entry written into a client's file, the rest of the file
//! kept (its other servers, its other keys, their order), a backup first, or the change
//! shown as a diff and nothing written.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{Map, Value, json};

use super::{Client, ClientFile};

/// How a client reaches Quiver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Connection {
    /// The client starts `command args` (`quiver serve --stdio`) and speaks MCP on its
    /// stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// Streamable HTTP at `url`, with `token` sent as a bearer token.
    Http {
        /// The MCP endpoint (`http://127.0.0.1:7345/mcp`).
        url: String,
        /// One of `[[auth.tokens]]`, if the server asks for one.
        token: Option<String>,
    },
}

/// The entry `client` takes for `connection`, in the client's own keys.
fn entry(client: Client, connection: &Connection) -> anyhow::Result<Value> {
    Ok(match connection {
        Connection::Stdio { command, args } => match client {
            Client::ClaudeCode | Client::VsCode => {
                json!({"type": "stdio", "command": command, "args": args})
            }
            _ => json!({"command": command, "args": args}),
        },
        Connection::Http { url, token } => {
            let mut e = Map::new();
            match client {
                Client::ClaudeDesktop => anyhow::bail!(
                    "Claude Desktop's configuration file takes servers it starts itself (stdio) only: set it up without --http (remote servers are added in its Settings, under Connectors)"
                ),
                Client::ClaudeCode | Client::VsCode => {
                    e.insert("type".into(), json!("http"));
                    e.insert("url".into(), json!(url));
                }
                Client::Cursor => {
                    e.insert("url".into(), json!(url));
                }
                Client::Windsurf => {
                    e.insert("serverUrl".into(), json!(url));
                }
            }
            if let Some(token) = token {
                e.insert(
                    "headers".into(),
                    json!({"Authorization": format!("Bearer {token}")}),
                );
            }
            Value::Object(e)
        }
    })
}

/// What `setup` would do to one client's file.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Plan {
    /// The client.
    pub client: Client,
    /// Whether an entry of that name was there (it is replaced).
    pub replaced: bool,
    /// The file's change.
    pub rewrite: Rewrite,
}

/// Plans writing `connection` into `client`'s file at `path` as the server `name`. A file
/// that does not read as a JSON object (or whose servers key is not an object) is refused
/// with its path and line.
pub fn plan_setup(
    client: Client,
    path: &Path,
    name: &str,
    connection: &Connection,
) -> anyhow::Result<Plan> {
    let file = ClientFile::read(path)?;
    let key = client.servers_key();
    let mut servers = file.servers(key)?.cloned().unwrap_or_default();
    let replaced = servers
        .insert(name.to_owned(), entry(client, connection)?)
        .is_some();
    let mut root = file.root.clone();
    root.insert(key.to_owned(), Value::Object(servers));
    let mut after = serde_json::to_string_pretty(&Value::Object(root))?;
    after.push('\n');
    let secret = matches!(connection, Connection::Http { token: Some(_), .. });
    Ok(Plan {
        client,
        replaced,
        rewrite: Rewrite::new(path, file.text, after, file.had_comments, secret),
    })
}

/// A file's new text beside its old one: shown as a diff, or written with a backup first.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Rewrite {
    /// The file.
    pub path: PathBuf,
    /// Its text now (`None`: it does not exist yet).
    pub before: Option<String>,
    /// The text it would have.
    pub after: String,
    /// Whether the file has comments or trailing commas, which the rewrite drops (the backup
    /// keeps them).
    pub drops_comments: bool,
    /// Whether the new text holds a secret (a new file is then its owner's alone).
    secret: bool,
}

impl Rewrite {
    pub(crate) fn new(
        path: &Path,
        before: Option<String>,
        after: String,
        drops_comments: bool,
        secret: bool,
    ) -> Self {
        Rewrite {
            path: path.to_owned(),
            before,
            after,
            drops_comments,
            secret,
        }
    }

    /// Whether the file would change.
    pub fn changes(&self) -> bool {
        self.before.as_deref() != Some(self.after.as_str())
    }

    /// The change as a unified diff (`--- a/PATH`, `+++ b/PATH`).
    pub fn diff(&self) -> String {
        let before = self.before.as_deref().unwrap_or("");
        let shown = self.path.display().to_string();
        similar::TextDiff::from_lines(before, &self.after)
            .unified_diff()
            .context_radius(3)
            .header(&format!("a/{shown}"), &format!("b/{shown}"))
            .to_string()
    }

    /// Writes the new text: the old file copied to a backup beside it first (returned), then
    /// the new one written to a temporary file and renamed over it, so a reader never sees
    /// half a file. A new file holding a secret is readable by its owner only.
    pub fn apply(&self) -> anyhow::Result<Option<PathBuf>> {
        if !self.changes() {
            return Ok(None);
        }
        let shown = self.path.display();
        let backup = match &self.before {
            Some(_) => Some(backup(&self.path)?),
            None => {
                if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                None
            }
        };
        let tmp = sibling(&self.path, ".quiver-tmp");
        std::fs::write(&tmp, &self.after).with_context(|| format!("writing {}", tmp.display()))?;
        let permissions = match std::fs::metadata(&self.path) {
            Ok(m) => Some(m.permissions()),
            Err(_) => owner_only(self.secret),
        };
        if let Some(p) = permissions {
            std::fs::set_permissions(&tmp, p)
                .with_context(|| format!("setting the permissions of {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &self.path).with_context(|| format!("replacing {shown}"))?;
        Ok(backup)
    }
}

/// `path` with `suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Copies `path` to `<name>.<unix seconds>.bak` beside it (`.1.bak`, ... if taken), its
/// permissions with it.
fn backup(path: &Path) -> anyhow::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut candidate = sibling(path, &format!(".{secs}.bak"));
    let mut n = 0;
    while candidate.exists() {
        n += 1;
        candidate = sibling(path, &format!(".{secs}.{n}.bak"));
    }
    std::fs::copy(path, &candidate).with_context(|| {
        format!(
            "backing {} up to {} (nothing was written)",
            path.display(),
            candidate.display()
        )
    })?;
    Ok(candidate)
}

#[cfg(unix)]
fn owner_only(secret: bool) -> Option<std::fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    secret.then(|| std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn owner_only(_secret: bool) -> Option<std::fs::Permissions> {
    None
}
