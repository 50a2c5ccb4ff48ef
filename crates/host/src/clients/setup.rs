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

/// Checks the URL a client is to connect to (`--http`): `http://` or `https://` with a
/// host, or refused with what to give (a client would only fail later, in its own words).
pub fn check_http_url(url: &str) -> anyhow::Result<()> {
    const GIVE: &str = "give the URL of Quiver's MCP endpoint, e.g. http://127.0.0.1:7345/mcp (`quiver serve` prints it when it starts)";
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        anyhow::bail!("--http {url:?} is not an http:// or https:// URL; {GIVE}");
    }
    match url::Url::parse(url) {
        Err(e) => anyhow::bail!("--http {url:?} is not a valid URL ({e}); {GIVE}"),
        Ok(u) if u.host_str().is_none_or(str::is_empty) => {
            anyhow::bail!("--http {url:?} names no host; {GIVE}")
        }
        Ok(_) => Ok(()),
    }
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
    /// Whether a new file is its owner's alone: its text holds a secret, or may (a bearer
    /// token; servers imported with their keys).
    private: bool,
}

impl Rewrite {
    pub(crate) fn new(
        path: &Path,
        before: Option<String>,
        after: String,
        drops_comments: bool,
        private: bool,
    ) -> Self {
        Rewrite {
            path: path.to_owned(),
            before,
            after,
            drops_comments,
            private,
        }
    }

    /// Whether the file would change.
    pub fn changes(&self) -> bool {
        self.before.as_deref() != Some(self.after.as_str())
    }

    /// The change as a unified diff (`--- a/PATH`, `+++ b/PATH`; an absolute path without
    /// its leading `/`, as `git diff` shows one).
    pub fn diff(&self) -> String {
        let before = self.before.as_deref().unwrap_or("");
        let path = self.path.display().to_string();
        let shown = path.trim_start_matches('/');
        similar::TextDiff::from_lines(before, &self.after)
            .unified_diff()
            .context_radius(3)
            .header(&format!("a/{shown}"), &format!("b/{shown}"))
            .to_string()
    }

    /// Writes the new text: the old file copied to a backup beside it first (returned), then
    /// the new one written to a temporary file and renamed over it, so a reader never sees
    /// half a file. A new private file is readable by its owner only; an existing one keeps
    /// its mode.
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
        write_new(&tmp, &self.after, self.private)
            .with_context(|| format!("writing {}", tmp.display()))?;
        let permissions = match std::fs::metadata(&self.path) {
            Ok(m) => Some(m.permissions()),
            Err(_) => owner_only(self.private),
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

/// Writes `text` to `path`, created readable by its owner only when `private` (never for a
/// moment by anyone else).
fn write_new(path: &Path, text: &str, private: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)?.write_all(text.as_bytes())
}

#[cfg(unix)]
fn owner_only(private: bool) -> Option<std::fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    private.then(|| std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn owner_only(_private: bool) -> Option<std::fs::Permissions> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--http` takes an http or https URL with a host, any case of scheme; anything else
    /// is refused with what to give.
    #[test]
    fn http_urls_are_checked() {
        for ok in [
            "http://127.0.0.1:7345/mcp",
            "https://quiver.example/mcp",
            "HTTP://localhost/mcp",
        ] {
            assert!(check_http_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "notaurl",
            "ftp://h/mcp",
            "http://",
            "localhost:7345/mcp",
            "",
        ] {
            let e = check_http_url(bad).unwrap_err().to_string();
            assert!(e.contains("e.g. http://127.0.0.1:7345/mcp"), "{bad}: {e}");
        }
    }
}
