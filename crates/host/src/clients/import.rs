//! `quiver client import`: the servers the clients have, written into a `quiver.toml`
//! (`[[mcp.servers]]` appended, the rest of the file as it was) or an `mcpServers` JSON
//! file that `quiver serve --mcp-config` serves, so Quiver becomes the clients' one
//! gateway. A server that cannot be carried over as it is (disabled, an SSE server, a VS
//! Code `${input:...}`) is skipped and said why.

use std::path::{Path, PathBuf};

use quiver_mcp_adapter::{ServerConfig, validate_all};
use serde_json::{Map, Value, json};

use super::{Client, ClientFile, setup::Rewrite};
use crate::mcp_json::config_message;

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
    /// The servers taken, in the order they are written.
    pub imported: Vec<Imported>,
    /// The servers left out, each with the client and why.
    pub skipped: Vec<String>,
    /// The target's change (write it with [`Rewrite::apply`]).
    pub rewrite: Rewrite,
}

/// One server taken into the target.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Imported {
    /// Its name in the target.
    pub name: String,
    /// The client it came from.
    pub client: Client,
    /// Its name in the client and why Quiver takes it under another, when it does.
    pub renamed: Option<(String, String)>,
    /// The `env` and `headers` keys whose value is written as the client had it although
    /// the key names a secret (`API_KEY`, `TOKEN`, `Authorization`, ...), each as it is
    /// shown (`env.BRAVE_API_KEY`) with the `${env:NAME}` reference to write instead.
    pub secrets: Vec<(String, String)>,
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
            Some(_) => Err(format!("its `{what}` is not an array of strings")),
        }
    }

    fn string_map(self, v: Option<&Value>, what: &str) -> Result<Map<String, Value>, String> {
        match v {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| Ok((k.clone(), Value::String(self.string(v, what)?))))
                .collect(),
            Some(_) => Err(format!("its `{what}` is not an object of strings")),
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

/// Whether Quiver's loader takes `name` as a server's name (its characters, no `__`, not a
/// reserved name): `validate_all`'s own check, of a server that has nothing else to check.
fn loads_as_name(name: &str) -> Result<(), String> {
    let probe = ServerConfig::stdio(name, "probe", Vec::new());
    validate_all(std::slice::from_ref(&probe), &|_| None)
        .map(drop)
        .map_err(config_message)
}

/// Why the loader refuses `name` (which [`loads_as_name`] refused), said short.
fn refused_because(name: &str) -> String {
    match quiver_contract::validate_server_name(name) {
        Err(_) if name.contains("__") => {
            "Quiver's server names are [A-Za-z0-9_] without `__`".to_owned()
        }
        Err(_) => "Quiver's server names are [A-Za-z0-9_]".to_owned(),
        // A reserved name: the loader's sentence up to its explanation.
        Ok(()) => {
            let why = loads_as_name(name).err().unwrap_or_default();
            why.split(" (").next().unwrap_or_default().to_owned()
        }
    }
}

/// A server with its name left out, to tell two clients' entries for one server apart
/// from two servers.
fn definition(s: &Server) -> Server {
    Server {
        name: String::new(),
        ..s.clone()
    }
}

/// Whether an `env` or `headers` key names a secret: one of its words (split at `_`, `-`,
/// `.`) is KEY, TOKEN, SECRET, PASSWORD, ... (`BRAVE_API_KEY`, `X-Auth-Token`,
/// `Authorization`).
fn names_a_secret(key: &str) -> bool {
    const WORDS: [&str; 13] = [
        "KEY",
        "APIKEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "PWD",
        "CREDENTIAL",
        "CREDENTIALS",
        "AUTH",
        "AUTHORIZATION",
        "COOKIE",
    ];
    key.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| WORDS.contains(&w.to_ascii_uppercase().as_str()))
        // `PWD` is also the shell's working directory.
        && key != "PWD"
}

/// The `env` and `headers` values of `s` written as the client had them although their key
/// names a secret, each as `env.NAME` or `headers.NAME` with the `${env:...}` to write
/// instead.
fn literal_secrets(s: &Server) -> Vec<(String, String)> {
    let literal = |v: &Value| v.as_str().is_some_and(|v| !v.contains("${env:"));
    let mut out = Vec::new();
    for (k, v) in &s.env {
        if names_a_secret(k) && literal(v) {
            out.push((format!("env.{k}"), format!("${{env:{k}}}")));
        }
    }
    for (k, v) in &s.headers {
        if names_a_secret(k) && literal(v) {
            let var = format!("{}_{}", s.name, k)
                .to_ascii_uppercase()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
            let bearer = v.as_str().is_some_and(|v| v.starts_with("Bearer "));
            out.push((
                format!("headers.{k}"),
                format!("{}${{env:{var}}}", if bearer { "Bearer " } else { "" }),
            ));
        }
    }
    out
}

/// `s` as the loader configures it, for checking it as the loader does.
fn server_config(s: &Server) -> ServerConfig {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut c = match (&s.command, &s.url) {
        (Some(command), _) => ServerConfig::stdio(s.name.clone(), command.clone(), s.args.clone()),
        (None, url) => ServerConfig::http(s.name.clone(), url.clone().unwrap_or_default()),
    };
    for (k, v) in &s.env {
        c = c.with_env(k.clone(), text(v));
    }
    for (k, v) in &s.headers {
        c = c.with_header(k.clone(), text(v));
    }
    if let Some(cwd) = &s.cwd {
        c = c.with_cwd(cwd.clone());
    }
    c
}

/// Every `${env:NAME}` as set, but the servers' own token variables (`MCP_<NAME>_TOKEN`),
/// which only the environment Quiver runs in gives: the loader's check of a file's shape
/// without its values.
fn shape_env(servers: &[ServerConfig]) -> impl Fn(&str) -> Option<String> + use<> {
    let tokens: Vec<String> = servers.iter().map(ServerConfig::token_var).collect();
    move |k: &str| (!tokens.iter().any(|t| t == k)).then(|| "set".to_owned())
}

/// Whether `names` has `name`, ignoring case (as the loader compares them).
fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// A server taken: where it was found (for the file's order), under which name, and why.
struct Taken {
    at: usize,
    server: Server,
    client: Client,
    renamed: Option<(String, String)>,
}

/// Reads the servers of each `(client, file)` (a file that does not exist has none; a
/// malformed one stops the import, naming its path and line), leaves out the entry named
/// `own_name` and any that starts Quiver, and plans adding the rest to `target` (a name the
/// target has, or that an earlier client gave, is not taken twice). A name Quiver's loader
/// refuses (`brave-search`) is taken under the one its error suggests (`brave_search`,
/// `brave_search_2` when another server has that), and a server the loader would refuse
/// otherwise is skipped with the loader's reason: the target always loads.
pub fn import_servers(
    sources: &[(Client, PathBuf)],
    target: &ImportTarget,
    own_name: &str,
) -> anyhow::Result<ImportReport> {
    let mut found: Vec<(Client, String, Server)> = Vec::new();
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
                Ok(s) => found.push((*client, name.clone(), s)),
                Err(why) if why == "it is Quiver itself" => {}
                Err(why) => skipped.push(format!("{name} ({client}): {why}")),
            }
        }
    }
    // The names the loader takes as they are first, so that a renamed server never takes
    // a name a client gave; then the others, under the loader's suggestion.
    let mut taken: Vec<Taken> = Vec::new();
    for as_is in [true, false] {
        for (at, (client, own, server)) in found.iter().enumerate() {
            if loads_as_name(own).is_ok() != as_is {
                continue;
            }
            let same = |t: &Taken| definition(&t.server) == definition(server);
            if as_is {
                match taken
                    .iter()
                    .find(|t| t.server.name.eq_ignore_ascii_case(own))
                {
                    Some(t) if same(t) => {}
                    Some(t) => skipped.push(format!(
                        "{own} ({client}): {} has another server of that name, taken first",
                        t.client
                    )),
                    None => taken.push(Taken {
                        at,
                        server: server.clone(),
                        client: *client,
                        renamed: None,
                    }),
                }
                continue;
            }
            let base = quiver_contract::server_name_suggestion(own).unwrap_or_else(|| own.clone());
            let mut placed = false;
            for n in 1..=99 {
                let name = if n == 1 {
                    base.clone()
                } else {
                    format!("{base}_{n}")
                };
                if loads_as_name(&name).is_err() {
                    continue;
                }
                match taken
                    .iter()
                    .find(|t| t.server.name.eq_ignore_ascii_case(&name))
                {
                    // Another client's entry for the same server, taken already.
                    Some(t) if same(t) => {}
                    Some(_) => continue,
                    None => {
                        let mut why = refused_because(own);
                        if name != base && loads_as_name(&base).is_ok() {
                            why.push_str(&format!("; {base} is another server's name"));
                        }
                        taken.push(Taken {
                            at,
                            server: Server {
                                name: name.clone(),
                                ..server.clone()
                            },
                            client: *client,
                            renamed: Some((own.clone(), why)),
                        });
                    }
                }
                placed = true;
                break;
            }
            if !placed {
                skipped.push(format!(
                    "{own:?} ({client}): no Quiver server name can be made of it ({}); rename it in {client}'s configuration",
                    refused_because(own)
                ));
            }
        }
    }
    taken.sort_by_key(|t| t.at);
    // Anything else the loader would refuse in one server (a credential header over plain
    // http, a malformed URL, ...), said in its words.
    taken.retain(|t| {
        let config = server_config(&t.server);
        let env = shape_env(std::slice::from_ref(&config));
        match validate_all(std::slice::from_ref(&config), &env) {
            Ok(_) => true,
            Err(e) => {
                let own = t.renamed.as_ref().map_or(&t.server.name, |(own, _)| own);
                skipped.push(format!("{own} ({}): {}", t.client, config_message(e)));
                false
            }
        }
    });
    let path = target.path().to_owned();
    let servers: Vec<(Server, Client)> =
        taken.iter().map(|t| (t.server.clone(), t.client)).collect();
    let (rewrite, existing) = match target {
        ImportTarget::McpJson(_) => json_target(&path, &servers)?,
        ImportTarget::QuiverToml(_) => toml_target(&path, &servers)?,
    };
    let mut imported = Vec::new();
    for t in taken {
        let name = t.server.name.clone();
        if has(&existing, &name) {
            skipped.push(match &t.renamed {
                Some((own, _)) => format!(
                    "{own} ({}): {} already has a server named {name}",
                    t.client,
                    path.display()
                ),
                None => format!(
                    "{name} ({}): {} already has a server of that name",
                    t.client,
                    path.display()
                ),
            });
        } else {
            imported.push(Imported {
                secrets: literal_secrets(&t.server),
                name,
                client: t.client,
                renamed: t.renamed,
            });
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
        if !has(&existing, &s.name) {
            servers.insert(s.name.clone(), json_entry(s));
        }
    }
    let mut root = file.root.clone();
    root.insert(key.into(), Value::Object(servers));
    let mut after = serde_json::to_string_pretty(&Value::Object(root))?;
    after.push('\n');
    // The whole file must load as `quiver serve --mcp-config` loads it.
    let origin = path.display().to_string();
    let parsed = crate::parse_mcp_servers(&after, &origin, &any_env)?;
    validate_all(&parsed, &shape_env(&parsed))
        .map_err(|e| anyhow::anyhow!("{origin}: {}", config_message(e)))?;
    Ok((
        Rewrite::new(path, file.text, after, file.had_comments, true),
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
    for (s, client) in taken.iter().filter(|(s, _)| !has(&existing, &s.name)) {
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
    // The whole file must load as a configuration, its servers as `quiver serve` takes them.
    let config = crate::Config::parse(&after, &origin, &any_env)?;
    crate::mcp_json::resolve_servers(&config, &[], &shape_env(&config.mcp.servers))?;
    Ok((Rewrite::new(path, before, after, false, true), existing))
}

#[cfg(test)]
mod tests {
    use super::{names_a_secret, variables};

    /// A key names a secret by one of its words, whatever the case and separator; a word
    /// that merely contains one (`MONKEY`) does not, nor the shell's `PWD`.
    #[test]
    fn keys_that_name_secrets() {
        for key in [
            "BRAVE_API_KEY",
            "GITHUB_PERSONAL_ACCESS_TOKEN",
            "DB_PASSWORD",
            "client-secret",
            "X-Auth-Token",
            "Authorization",
            "apiKey",
            "X-API-Key",
        ] {
            assert!(names_a_secret(key), "{key}");
        }
        for key in [
            "LOG_LEVEL",
            "MONKEY_MODE",
            "PWD",
            "TOKENIZER_PATH",
            "Accept",
        ] {
            assert!(!names_a_secret(key), "{key}");
        }
    }

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
