//! The MCP clients' own configuration files: where each client keeps its servers on Linux,
//! macOS and Windows, how it writes an entry, and reading a file whole or refusing it with
//! its path and line. `quiver client setup` writes Quiver into them (`setup.rs`); `quiver
//! client import` takes the servers they have (`import.rs`).

mod import;
mod jsonc;
mod setup;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use import::{ImportReport, ImportTarget, Imported, import_servers};
pub use setup::{Connection, Plan, Rewrite, check_http_url, plan_setup};

/// An MCP client whose configuration `quiver client` reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Client {
    /// Claude Desktop (`claude_desktop_config.json`).
    ClaudeDesktop,
    /// Claude Code, user scope (`~/.claude.json`).
    ClaudeCode,
    /// Cursor, global (`~/.cursor/mcp.json`).
    Cursor,
    /// VS Code, user profile (`mcp.json` beside `settings.json`).
    VsCode,
    /// Windsurf (`~/.codeium/windsurf/mcp_config.json`).
    Windsurf,
}

impl Client {
    /// Every client, in the order `all` takes them.
    pub const ALL: [Client; 5] = [
        Client::ClaudeDesktop,
        Client::ClaudeCode,
        Client::Cursor,
        Client::VsCode,
        Client::Windsurf,
    ];

    /// Its name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Client::ClaudeDesktop => "claude-desktop",
            Client::ClaudeCode => "claude-code",
            Client::Cursor => "cursor",
            Client::VsCode => "vscode",
            Client::Windsurf => "windsurf",
        }
    }

    /// The client of a command-line name.
    pub fn parse(name: &str) -> Option<Client> {
        Client::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The key its file keeps the servers under.
    pub(crate) const fn servers_key(self) -> &'static str {
        match self {
            Client::VsCode => "servers",
            _ => "mcpServers",
        }
    }

    /// Where it keeps its MCP servers on `os`, for a user whose directories `dirs` gives.
    pub fn config_path(self, os: Os, dirs: &UserDirs) -> PathBuf {
        let home = &dirs.home;
        // The per-user application-data directory: `%APPDATA%` on Windows, Application
        // Support on macOS, `$XDG_CONFIG_HOME` (default ~/.config) on Linux.
        let app_data = || match os {
            Os::Windows => dirs
                .app_data
                .clone()
                .unwrap_or_else(|| home.join("AppData").join("Roaming")),
            Os::MacOs => home.join("Library").join("Application Support"),
            Os::Linux => dirs
                .xdg_config_home
                .clone()
                .unwrap_or_else(|| home.join(".config")),
        };
        match self {
            Client::ClaudeDesktop => app_data().join("Claude").join("claude_desktop_config.json"),
            Client::ClaudeCode => home.join(".claude.json"),
            Client::Cursor => home.join(".cursor").join("mcp.json"),
            Client::VsCode => app_data().join("Code").join("User").join("mcp.json"),
            Client::Windsurf => home
                .join(".codeium")
                .join("windsurf")
                .join("mcp_config.json"),
        }
    }
}

impl Client {
    /// Whether this user seems to have the client: its file, or the directory it keeps it
    /// in (for Claude Code, whose file is in the home directory, `~/.claude`).
    pub fn seems_installed(self, os: Os, dirs: &UserDirs) -> bool {
        let path = self.config_path(os, dirs);
        path.exists()
            || match self {
                Client::ClaudeCode => dirs.home.join(".claude").is_dir(),
                _ => path.parent().is_some_and(Path::is_dir),
            }
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An operating system whose client paths differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Os {
    /// Linux and the other Unixes that follow XDG.
    Linux,
    /// macOS.
    MacOs,
    /// Windows.
    Windows,
}

impl Os {
    /// The system this binary was built for.
    pub const fn current() -> Os {
        if cfg!(target_os = "macos") {
            Os::MacOs
        } else if cfg!(windows) {
            Os::Windows
        } else {
            Os::Linux
        }
    }
}

/// The user's directories the client paths start from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UserDirs {
    /// The home directory (`$HOME`; `%USERPROFILE%` on Windows).
    pub home: PathBuf,
    /// `%APPDATA%` (Windows).
    pub app_data: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME` (Linux).
    pub xdg_config_home: Option<PathBuf>,
}

impl UserDirs {
    /// The directories from `home` alone (the others at their defaults).
    pub fn at_home(home: impl Into<PathBuf>) -> UserDirs {
        UserDirs {
            home: home.into(),
            app_data: None,
            xdg_config_home: None,
        }
    }

    /// This process's user's directories, from its environment.
    pub fn from_env() -> anyhow::Result<UserDirs> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let home = var("HOME").or_else(|| var("USERPROFILE")).ok_or_else(|| {
            anyhow::anyhow!("neither HOME nor USERPROFILE is set: the clients' files are found from the home directory")
        })?;
        Ok(UserDirs {
            home,
            app_data: var("APPDATA"),
            xdg_config_home: var("XDG_CONFIG_HOME"),
        })
    }
}

/// A client's file as read: its whole JSON object, and whether the text had comments or
/// trailing commas (JSONC, which VS Code allows) that a rewrite does not keep.
#[derive(Debug, Clone)]
pub(crate) struct ClientFile {
    pub(crate) path: PathBuf,
    /// The text as it is on disk (`None`: no such file yet).
    pub(crate) text: Option<String>,
    pub(crate) root: Map<String, Value>,
    pub(crate) had_comments: bool,
}

impl ClientFile {
    /// Reads `path` (a missing file is an empty object); a file that is not a JSON object
    /// is refused with its path and the line and column of the fault.
    pub(crate) fn read(path: &Path) -> anyhow::Result<ClientFile> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(ClientFile {
                    path: path.to_owned(),
                    text: None,
                    root: Map::new(),
                    had_comments: false,
                });
            }
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        };
        let plain = jsonc::to_json(&text);
        let had_comments = plain != text;
        let root = if plain.trim().is_empty() {
            Map::new()
        } else {
            match serde_json::from_str::<Value>(&plain) {
                Ok(Value::Object(root)) => root,
                Ok(_) => anyhow::bail!(
                    "{}:1: not a JSON object; the file is left as it is (fix or move it, then run this again)",
                    path.display()
                ),
                Err(e) => anyhow::bail!(
                    "{}:{}:{}: not valid JSON ({e}); the file is left as it is (fix it, then run this again)",
                    path.display(),
                    e.line(),
                    e.column()
                ),
            }
        };
        Ok(ClientFile {
            path: path.to_owned(),
            text: Some(text),
            root,
            had_comments,
        })
    }

    /// The servers object under `key`, if the file has one; anything else there is refused
    /// with the path and the line the key is on.
    pub(crate) fn servers(&self, key: &str) -> anyhow::Result<Option<&Map<String, Value>>> {
        match self.root.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(servers)) => Ok(Some(servers)),
            Some(_) => anyhow::bail!(
                "{}:{}: `{key}` is not an object of servers; the file is left as it is",
                self.path.display(),
                self.line_of(key)
            ),
        }
    }

    /// The line of the first `"key"` in the text (1 when it is not found).
    pub(crate) fn line_of(&self, key: &str) -> usize {
        let quoted = format!("\"{key}\"");
        self.text
            .as_deref()
            .and_then(|t| t.find(&quoted).map(|at| t[..at].lines().count().max(1)))
            .unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each client's file on each system, for a user whose home is /h (and, on Windows,
    /// whose %APPDATA% is /h/AppData/Roaming).
    #[test]
    fn every_client_has_its_file_on_every_system() {
        let dirs = UserDirs::at_home("/h");
        let cases = [
            (
                Client::ClaudeDesktop,
                Os::Linux,
                "/h/.config/Claude/claude_desktop_config.json",
            ),
            (
                Client::ClaudeDesktop,
                Os::MacOs,
                "/h/Library/Application Support/Claude/claude_desktop_config.json",
            ),
            (
                Client::ClaudeDesktop,
                Os::Windows,
                "/h/AppData/Roaming/Claude/claude_desktop_config.json",
            ),
            (Client::ClaudeCode, Os::Linux, "/h/.claude.json"),
            (Client::ClaudeCode, Os::Windows, "/h/.claude.json"),
            (Client::Cursor, Os::MacOs, "/h/.cursor/mcp.json"),
            (Client::VsCode, Os::Linux, "/h/.config/Code/User/mcp.json"),
            (
                Client::VsCode,
                Os::MacOs,
                "/h/Library/Application Support/Code/User/mcp.json",
            ),
            (
                Client::VsCode,
                Os::Windows,
                "/h/AppData/Roaming/Code/User/mcp.json",
            ),
            (
                Client::Windsurf,
                Os::Linux,
                "/h/.codeium/windsurf/mcp_config.json",
            ),
        ];
        for (client, os, want) in cases {
            assert_eq!(
                client.config_path(os, &dirs),
                PathBuf::from(want),
                "{client} {os:?}"
            );
        }
        let xdg = UserDirs {
            xdg_config_home: Some("/x".into()),
            app_data: Some("/appdata".into()),
            ..UserDirs::at_home("/h")
        };
        assert_eq!(
            Client::VsCode.config_path(Os::Linux, &xdg),
            PathBuf::from("/x/Code/User/mcp.json")
        );
        assert_eq!(
            Client::ClaudeDesktop.config_path(Os::Windows, &xdg),
            PathBuf::from("/appdata/Claude/claude_desktop_config.json")
        );
    }
}
