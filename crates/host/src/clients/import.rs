//! `quiver client import`: the servers the clients have, written into a `quiver.toml`
//! (`[[mcp.servers]]` appended, the rest of the file as it was) or an `mcpServers` JSON
//! file that `quiver serve --mcp-config` serves, so Quiver becomes the clients' one
//! gateway. A server that cannot be carried over as it is (disabled, an SSE server, a VS
//! Code `${input:...}`) is skipped and said why.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::{Client, ClientFile, setup::Rewrite};

/// Where the imported servers go.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportTarget {
    /// A `quiver.toml`: `[[mcp.servers]]` tables appended.
    QuiverToml(PathBuf),
    /// An `mcpServers` JSON file (`quiver serve --mcp-config FILE`).
    McpJson(PathBuf),
}

impl ImportTarget {
    /// The target a path names: a `.toml` file is a `quiver.toml`, anything else an
    /// `mcpServers` JSON file.
    pub fn of_path(path: PathBuf) -> ImportTarget {
        if path.extension().is_some_and(|e| e == "toml") {
            ImportTarget::QuiverToml(path)
        } else {
            ImportTarget::McpJson(path)
        }
    }

    fn path(&self) -> &Path {
        match self {
            ImportTarget::QuiverToml(p) | ImportTarget::McpJson(p) => p,
        }
    }
}

/// What an import would do.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ImportReport {
    /// The servers taken: name and the client they came from.
    pub imported: Vec<(String, Client)>,
    /// The servers left out, each with the client and why.
    pub skipped: Vec<String>,
    /// The target's change (write it with [`Rewrite::apply`]).
    pub rewrite: Rewrite,
}

/// One server as Quiver configures it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct Server {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    args: Vec<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    env: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    headers: Map<String, Value>,
}

/// A string of a client's entry in Quiver's variable syntax: `${env:NAME}` stays, and so
/// does Claude Code's `${NAME}` (`bare_is_env`), written `${env:NAME}`; anything else
/// (VS Code's `${input:...}` and `${workspaceFolder}`) only the client can fill.
fn variables(s: &str, bare_is_env: bool) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            return Err(format!("`{s}` has a `${{` with no `}}`"));
        };
        let inner = &rest[at + 2..at + end];
        let name = match inner.strip_prefix("env:") {
            Some(name) => name,
            None if bare_is_env => inner,
            None => "",
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "`${{{inner}}}` is filled in by the client itself, which Quiver cannot do"
            ));
        }
        out.push_str(&format!("${{env:{name}}}"));
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Reads one client's entries: whether a bare `${NAME}` is an environment variable there.
#[derive(Clone, Copy)]
struct Reader {
    bare_is_env: bool,
}

impl Reader {
    fn string(self, v: &Value, what: &str) -> Result<String, String> {
        v.as_str()
            .ok_or_else(|| format!("its `{what}` is not a string"))
            .and_then(|s| variables(s, self.bare_is_env))
    }

    fn strings(self, v: Option<&Value>, what: &str) -> Result<Vec<String>, String> {
        match v {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|i| self.string(i, what)).collect(),
            Some(_) => Err(format!("its `{what}` is not a list")),
        }
    }

    fn string_map(self, v: Option<&Value>, what: &str) -> Result<Map<String, Value>, String> {
        match v {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| Ok((k.clone(), Value::String(self.string(v, what)?))))
                .collect(),
            Some(_) => Err(format!("its `{what}` is not an object")),
        }
    }
}

/// Whether a server entry starts Quiver itself (a `quiver` program).
fn is_quiver(command: &str) -> bool {
    Path::new(command)
        .file_stem()
        .is_some_and(|s| s == "quiver")
}

/// One client entry as Quiver configures it, or why it is left out.
fn normalize(client: Client, name: &str, entry: &Value) -> Result<Server, String> {
    let r = Reader {
        bare_is_env: client == Client::ClaudeCode,
    };
    let Value::Object(e) = entry else {
        return Err("it is not an object".into());
    };
    if e.get("disabled").and_then(Value::as_bool) == Some(true) {
        return Err("it is disabled there".into());
    }
    let kind = e.get("type").and_then(Value::as_str);
    if kind == Some("sse") {
        return Err(
            "it is an SSE server (the deprecated HTTP+SSE transport), which Quiver does not connect to"
                .into(),
        );
    }
    let url = e.get("url").or_else(|| e.get("serverUrl"));
    let server = Server {
        name: name.to_owned(),
        command: e
            .get("command")
            .map(|c| r.string(c, "command"))
            .transpose()?,
        args: r.strings(e.get("args"), "args")?,
        env: r.string_map(e.get("env"), "env")?,
        cwd: e.get("cwd").map(|c| r.string(c, "cwd")).transpose()?,
        url: url.map(|u| r.string(u, "url")).transpose()?,
        headers: r.string_map(e.get("headers"), "headers")?,
    };
    match (&server.command, &server.url) {
        (Some(c), _) if is_quiver(c) => Err("it is Quiver itself".into()),
        (Some(_), None) | (None, Some(_)) => Ok(server),
        (Some(_), Some(_)) => Err("it has both a `command` and a `url`".into()),
        (None, None) => Err("it has neither a `command` nor a `url`".into()),
    }
}

/// The `mcpServers` entry of a server.
fn json_entry(s: &Server) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.remove("name");
        if s.url.is_some() {
            m.insert("type".into(), json!("http"));
        }
    }
    v
}

/// Reads the servers of each `(client, file)` (a file that does not exist has none; a
/// malformed one stops the import, naming its path and line), leaves out the entry named
/// `own_name` and any that starts Quiver, and plans adding the rest to `target` (a name the
/// target has, or that an earlier client gave, is not taken twice).
pub fn import_servers(
    sources: &[(Client, PathBuf)],
    target: &ImportTarget,
    own_name: &str,
) -> anyhow::Result<ImportReport> {
    let mut taken: Vec<(Server, Client)> = Vec::new();
    let mut skipped = Vec::new();
    for (client, path) in sources {
        let file = ClientFile::read(path)?;
        let Some(servers) = file.servers(client.servers_key())? else {
            continue;
        };
        for (name, entry) in servers {
            if name == own_name {
                continue;
            }
            match normalize(*client, name, entry) {
                Ok(s) => match taken.iter().find(|(t, _)| t.name == *name) {
                    Some((t, _)) if *t == s => {}
                    Some((_, first)) => skipped.push(format!(
                        "{name} ({client}): {first} has another server of that name, taken first"
                    )),
                    None => taken.push((s, *client)),
                },
                Err(why) if why == "it is Quiver itself" => {}
                Err(why) => skipped.push(format!("{name} ({client}): {why}")),
            }
        }
    }
    let path = target.path().to_owned();
    let (rewrite, existing) = match target {
        ImportTarget::McpJson(_) => json_target(&path, &taken)?,
        ImportTarget::QuiverToml(_) => toml_target(&path, &taken)?,
    };
    let mut imported = Vec::new();
    for (s, client) in taken {
        if existing.contains(&s.name) {
            skipped.push(format!(
                "{} ({client}): {} already has a server of that name",
                s.name,
                path.display()
            ));
        } else {
            imported.push((s.name, client));
        }
    }
    Ok(ImportReport {
        imported,
        skipped,
        rewrite,
    })
}

/// Any `${env:NAME}` as set, for checking a file's shape without its values.
fn any_env(_: &str) -> Option<String> {
    Some("set".into())
}

fn json_target(path: &Path, taken: &[(Server, Client)]) -> anyhow::Result<(Rewrite, Vec<String>)> {
    let file = ClientFile::read(path)?;
    let key = if file.root.contains_key("servers") && !file.root.contains_key("mcpServers") {
        "servers"
    } else {
        "mcpServers"
    };
    let mut servers = file.servers(key)?.cloned().unwrap_or_default();
    let existing: Vec<String> = servers.keys().cloned().collect();
    for (s, _) in taken {
        if !existing.contains(&s.name) {
            servers.insert(s.name.clone(), json_entry(s));
        }
    }
    let mut root = file.root.clone();
    root.insert(key.into(), Value::Object(servers));
    let mut after = serde_json::to_string_pretty(&Value::Object(root))?;
    after.push('\n');
    crate::parse_mcp_servers(&after, &path.display().to_string(), &any_env)?;
    Ok((
        Rewrite::new(path, file.text, after, file.had_comments, false),
        existing,
    ))
}

fn toml_target(path: &Path, taken: &[(Server, Client)]) -> anyhow::Result<(Rewrite, Vec<String>)> {
    let before = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let origin = path.display().to_string();
    let text = before.clone().unwrap_or_default();
    let config = crate::Config::parse(&text, &origin, &any_env)?;
    let existing: Vec<String> = config.mcp.servers.iter().map(|s| s.name.clone()).collect();
    let mut after = text;
    for (s, client) in taken.iter().filter(|(s, _)| !existing.contains(&s.name)) {
        #[derive(serde::Serialize)]
        struct Servers<'a> {
            servers: [&'a Server; 1],
        }
        #[derive(serde::Serialize)]
        struct Mcp<'a> {
            mcp: Servers<'a>,
        }
        if !after.is_empty() && !after.ends_with("\n\n") {
            after.push_str(if after.ends_with('\n') { "\n" } else { "\n\n" });
        }
        after.push_str(&format!("# imported from {client}\n"));
        after.push_str(&toml::to_string(&Mcp {
            mcp: Servers { servers: [s] },
        })?);
    }
    // The whole file must still read as a configuration.
    crate::Config::parse(&after, &origin, &any_env)?;
    Ok((Rewrite::new(path, before, after, false, false), existing))
}

#[cfg(test)]
mod tests {
    use super::variables;

    #[test]
    fn client_variables_become_quivers_or_are_refused() {
        assert_eq!(variables("a ${TOKEN} b", true).unwrap(), "a ${env:TOKEN} b");
        assert!(variables("a ${TOKEN} b", false).is_err());
        assert_eq!(variables("${env:HOME}/x", false).unwrap(), "${env:HOME}/x");
        assert_eq!(variables("plain", false).unwrap(), "plain");
        assert!(variables("${input:token}", true).is_err());
        assert!(variables("${workspaceFolder}/x", false).is_err());
    }
}
