//! The `mcpServers` JSON that Claude Desktop, Cursor and VS Code use, read as Quiver MCP
//! server configuration.

use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
};

use anyhow::{Context, bail};
use quiver_mcp_adapter::{McpError, ResolvedServer, ServerConfig, validate_all};
use serde::{
    Deserialize, Deserializer,
    de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor},
};

use crate::{
    Config,
    config::{interpolate_str, json_terms, shorten_float},
};

#[derive(Debug, Deserialize)]
struct File {
    #[serde(rename = "mcpServers", alias = "servers")]
    servers: Option<BTreeMap<String, Entry>>,
}

/// One server. Keys other clients add for themselves (`alwaysAllow`, `autoApprove`,
/// `timeout`, `description`, ...) are ignored with a warning, so a user can point Quiver at
/// the file they already have.
#[derive(Debug, Deserialize)]
struct Entry {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Claude Desktop and Cursor accept it; Quiver honours it by not starting the server.
    #[serde(default)]
    disabled: bool,
    /// Quiver's own: `"session"` runs one process per MCP session, as `scope` of a
    /// `[[mcp.servers]]` entry; `"shared"` (the default) one for all.
    #[serde(default)]
    scope: Option<quiver_mcp_adapter::ServerScope>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// The keys of an entry Quiver reads.
const KEYS: [&str; 9] = [
    "type", "command", "args", "env", "cwd", "url", "headers", "disabled", "scope",
];

/// Keys other clients put in their entries (VS Code, Cursor, Cline, Roo, Claude, Gemini
/// CLI), ignored even when they look like one of [`KEYS`].
const FOREIGN: [&str; 12] = [
    "envFile",
    "alwaysAllow",
    "autoApprove",
    "timeout",
    "description",
    "transportType",
    "disabledTools",
    "trust",
    "includeTools",
    "excludeTools",
    "oauth",
    "dev",
];

/// The transports a `"type"` field may name.
const TYPES: &str = "\"stdio\" (with \"command\") or \"http\" (with \"url\"; also \"streamable-http\", \"streamableHttp\")";

/// Walks a JSON text and fails on the first object that gives a key twice, naming its path.
struct NoDuplicates<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for NoDuplicates<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NoDuplicates<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(NoDuplicates(&format!("{}[{i}]", self.0)))?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.0.is_empty() {
                format!("{key:?}")
            } else {
                format!("{}.{key:?}", self.0)
            };
            if !seen.insert(key) {
                return Err(de::Error::custom(format!(
                    "{path} is given twice (JSON keeps only the last); keep one"
                )));
            }
            map.next_value_seed(NoDuplicates(&path))?;
        }
        Ok(())
    }
}

/// Whether a line of `text` begins (after blanks) with `//` or `/*`.
fn has_comment(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with("//") || l.starts_with("/*")
    })
}

/// Parses an `mcpServers` file's text; `origin` names it in errors. `${env:VAR}` is
/// replaced in `command`, `args`, `cwd` and `url` here, and in `env` and `headers` values
/// when the servers are set up, as in `quiver.toml`.
/// What a JSON value is, for an error: "an array", "a string".
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// What a server's `"key"` takes, written as JSON with an example, and what `v` has instead
/// (`"args" must be an array of strings, e.g. ["-y", "pkg"]; it is a string`); serde's
/// `message`, in JSON's terms, when `v` has the right type but a value the key does not
/// take (an unknown `"scope"`).
fn wrong_value(key: &str, v: &serde_json::Value, message: &str) -> String {
    use serde_json::Value;
    let takes = match key {
        "type" => format!("a string: {TYPES}"),
        "command" => "a string, the program to run, e.g. \"npx\"".to_owned(),
        "args" => "an array of strings, e.g. [\"-y\", \"pkg\"]".to_owned(),
        "env" => "an object of variable name to string, e.g. {\"API_KEY\": \"${env:API_KEY}\"}"
            .to_owned(),
        "cwd" => "a string, the directory the server starts in".to_owned(),
        "url" => "a string, e.g. \"https://mcp.example.com/mcp\"".to_owned(),
        "headers" => {
            "an object of header name to string, e.g. {\"Authorization\": \"Bearer ${env:TOKEN}\"}"
                .to_owned()
        }
        "disabled" => "true or false".to_owned(),
        "scope" => "\"shared\" or \"session\"".to_owned(),
        _ => return format!("\"{key}\": {}", json_terms(&shorten_float(message))),
    };
    let right_kind = match key {
        "args" => v.is_array(),
        "env" | "headers" => v.is_object(),
        "disabled" => v.is_boolean(),
        _ => v.is_string(),
    };
    // In an array or object of strings, the first item that is not one.
    let item = match v {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_string())
            .map(|(i, x)| format!("\"{key}\"[{i}] is {}", json_kind(x))),
        Value::Object(m) => m
            .iter()
            .find(|(_, x)| !x.is_string())
            .map(|(k, x)| format!("\"{key}\".{k:?} is {}", json_kind(x))),
        _ => None,
    };
    match (right_kind, item) {
        (false, _) => format!("\"{key}\" must be {takes}; it is {}", json_kind(v)),
        (true, Some(item)) => format!("\"{key}\" must be {takes}; {item}"),
        (true, None) => format!("\"{key}\": {}", json_terms(&shorten_float(message))),
    }
}

/// The servers of an `mcpServers` (or VS Code `servers`) JSON text read from `origin` (named
/// in errors), with `${env:NAME}` in its strings resolved through `env`.
pub fn parse_mcp_servers(
    text: &str,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<ServerConfig>> {
    // serde keeps the last of two equal keys; a server or an `env` entry given twice is a
    // mistake to show, not to settle silently.
    if let Err(e) = NoDuplicates("").deserialize(&mut serde_json::Deserializer::from_str(text))
        && e.is_data()
    {
        bail!("{origin}: {e}");
    }
    // The servers in the file's order (serde_json keeps it): where two servers offer one
    // thing, the first configured has it.
    let mut order: Vec<String> = Vec::new();
    // The file's shape first, in its own words (serde says "expected struct Entry").
    match serde_json::from_str::<serde_json::Value>(text) {
        // VS Code's mcp.json is JSONC: serde's "expected value" would not say why.
        Err(e) if has_comment(text) => {
            bail!(
                "{origin}: not an mcpServers JSON file ({e}): it has comments (`//` or `/* */`, as VS Code's JSONC allows), which JSON does not; remove them"
            )
        }
        // Not JSON at all: its syntax error, before serde's typed reading stops at a type
        // on the way ("invalid type: sequence, expected a map").
        Err(e) => bail!("{origin}: not an mcpServers JSON file: {e}"),
        Ok(value) => {
            const SHAPE: &str = r#"{"mcpServers": {"name": {"command": ...} or {"url": ...}}}"#;
            let Some(top) = value.as_object() else {
                bail!(
                    "{origin}: the file is {}, not an object: expected {SHAPE}",
                    json_kind(&value)
                );
            };
            // Both keys: serde called it a duplicate `mcpServers` (`servers` is its alias).
            if top.contains_key("mcpServers") && top.contains_key("servers") {
                bail!(
                    "{origin}: the file has both \"mcpServers\" (Claude Desktop, Cursor) and \"servers\" (VS Code); Quiver reads one list of servers: keep one of them"
                );
            }
            if let Some(servers) = top.get("mcpServers").or_else(|| top.get("servers")) {
                let Some(servers) = servers.as_object() else {
                    bail!(
                        "{origin}: \"mcpServers\" is {}, not an object of servers by name: expected {SHAPE}",
                        json_kind(servers)
                    );
                };
                order = servers.keys().cloned().collect();
                for (name, entry) in servers {
                    let Some(fields) = entry.as_object() else {
                        bail!(
                            "{origin}: server {name:?} is {}, not an object: give {{\"command\": ..., \"args\": [...]}} for a stdio server or {{\"url\": ...}} for a streamable-HTTP one",
                            json_kind(entry)
                        );
                    };
                    // A value of the wrong type, named by its server and key (serde named
                    // neither, and its "not an mcpServers JSON file" blamed the whole file).
                    for (key, v) in fields {
                        if KEYS.contains(&key.as_str())
                            && let Err(e) =
                                serde_json::from_value::<Entry>(serde_json::json!({ key: v }))
                        {
                            bail!(
                                "{origin}: server {name:?}: {}",
                                wrong_value(key, v, &e.to_string())
                            );
                        }
                    }
                }
            }
        }
    }
    let file: File = serde_json::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "{origin}: not an mcpServers JSON file: {}",
            json_terms(&e.to_string())
        )
    })?;
    let Some(servers) = file.servers else {
        bail!(
            "{origin}: no \"mcpServers\" object (expected {{\"mcpServers\": {{\"name\": {{\"command\": ...}}}}}})"
        );
    };
    let mut servers: Vec<(String, Entry)> = servers.into_iter().collect();
    servers.sort_by_key(|(name, _)| order.iter().position(|o| o == name));
    let mut out = Vec::new();
    for (name, e) in servers {
        if e.disabled {
            // Skipped, and said so, as every skipped name is.
            tracing::warn!(
                "{origin}: server {name:?} is disabled (\"disabled\": true): not started, none of its tools registered"
            );
            continue;
        }
        for key in e.other.keys() {
            // A near miss of a key Quiver reads is a typo, unless another client uses it.
            if !FOREIGN.contains(&key.as_str())
                && let Some(known) = KEYS
                    .iter()
                    .find(|k| key.len() >= 3 && strsim::damerau_levenshtein(key, k) <= 1)
            {
                bail!("{origin}: server {name:?}: unknown key {key:?}; did you mean {known:?}?");
            }
            let why = if key == "envFile" {
                "Quiver does not read env files; put the variables under \"env\""
            } else {
                "Quiver does not use it"
            };
            tracing::warn!("{origin}: server {name:?}: ignoring \"{key}\" ({why})");
        }
        if let Err(err) = quiver_contract::validate_server_name(&name) {
            let suggestion = quiver_contract::server_name_suggestion(&name)
                .map(|s| format!(", e.g. to {s:?}"))
                .unwrap_or_default();
            bail!(
                "{origin}: server {name:?}: {err}. Quiver never renames a server (its name is part of every tool name, mcp__<server>__<tool>); rename it in the file{suggestion}"
            );
        }
        let at = |key: &str| format!("{origin}: server {name:?}: {key}");
        let stdio = match e.kind.as_deref() {
            None => None,
            Some("stdio") => Some(true),
            Some("http" | "streamable-http" | "streamableHttp" | "streamable_http") => Some(false),
            // Skipped and said, as a disabled one is: the file is the user's desktop
            // client's, whose other servers Quiver serves all the same.
            Some("sse") => {
                tracing::warn!(
                    "{origin}: server {name:?} uses the legacy SSE transport, which Quiver does not speak: not started, none of its tools registered (give its streamable HTTP endpoint as \"url\" if it has one, or set \"disabled\": true to say nothing)"
                );
                continue;
            }
            Some(other) => bail!(
                "{origin}: server {name:?}: unknown \"type\" {other:?}; use {TYPES}, or leave it out"
            ),
        };
        let server = match (e.command, e.url) {
            (Some(command), None) => {
                if stdio == Some(false) {
                    bail!(
                        "{origin}: server {name:?} has \"type\": {:?} but a \"command\" (a stdio server); give it a \"url\", or make the type \"stdio\"",
                        e.kind.as_deref().unwrap_or_default()
                    );
                }
                // Ignored and said, like an unknown key: the file is the user's desktop
                // client's, which may carry such leftovers.
                if !e.headers.is_empty() {
                    tracing::warn!(
                        "{origin}: server {name:?}: ignoring \"headers\": they apply to http servers (\"url\") only, and this one runs \"command\" (pass values through \"env\")"
                    );
                }
                let args = e
                    .args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| interpolate_str(a, &at(&format!("args[{i}]")), env))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let mut s = ServerConfig::stdio(
                    name.clone(),
                    interpolate_str(&command, &at("command"), env)?,
                    args,
                );
                for (k, v) in e.env {
                    crate::config::key_without_reference(&k, &at(&format!("env.{k}")))?;
                    s = s.with_env(k, v);
                }
                if let Some(cwd) = e.cwd {
                    s = s.with_cwd(interpolate_str(&cwd, &at("cwd"), env)?);
                }
                s
            }
            (None, Some(url)) => {
                if stdio == Some(true) {
                    bail!(
                        "{origin}: server {name:?} has \"type\": \"stdio\" but a \"url\" (an http server); give it a \"command\", or make the type \"http\""
                    );
                }
                let stray: Vec<&str> = [
                    ("args", !e.args.is_empty()),
                    ("env", !e.env.is_empty()),
                    ("cwd", e.cwd.is_some()),
                ]
                .into_iter()
                .filter_map(|(k, set)| set.then_some(k))
                .collect();
                if !stray.is_empty() {
                    tracing::warn!(
                        "{origin}: server {name:?}: ignoring \"{}\": they apply to stdio servers (\"command\") only, and this one has a \"url\" (an http server takes \"headers\")",
                        stray.join("\", \"")
                    );
                }
                let mut s =
                    ServerConfig::http(name.clone(), interpolate_str(&url, &at("url"), env)?);
                for (k, v) in e.headers {
                    crate::config::key_without_reference(&k, &at(&format!("headers.{k}")))?;
                    s = s.with_header(k, v);
                }
                s
            }
            (Some(_), Some(_)) => {
                bail!("{origin}: server {name:?} has both \"command\" and \"url\"; give one")
            }
            (None, None) => bail!(
                "{origin}: server {name:?} has neither \"command\" (stdio) nor \"url\" (http)"
            ),
        };
        let server = match e.scope {
            Some(quiver_mcp_adapter::ServerScope::Session) => server.per_session(),
            _ => server,
        };
        out.push(server);
    }
    Ok(out)
}

/// Reads and parses an `mcpServers` file.
pub fn read_mcp_servers(path: &Path) -> anyhow::Result<Vec<ServerConfig>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut servers = parse_mcp_servers(&text, &path.display().to_string(), &|k| {
        std::env::var(k).ok()
    })?;
    let dir = path.parent().unwrap_or(Path::new(""));
    for s in &mut servers {
        crate::config::rebase_server(s, dir);
    }
    Ok(servers)
}

/// The text of an MCP configuration error, without the adapter's "MCP configuration:"
/// (the caller names the file instead).
pub(crate) fn config_message(e: McpError) -> String {
    match e {
        McpError::Config(message) => message,
        other => other.to_string(),
    }
}

/// The MCP servers of `config` and of the `--mcp-config` `files`, checked and resolved
/// (`${env:VAR}`, tokens, the https rule). An error names the file the server is in: a
/// name configured twice names both.
pub(crate) fn resolve_servers(
    config: &Config,
    files: &[std::path::PathBuf],
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<ResolvedServer>> {
    let config_origin = config.origin.as_deref().unwrap_or("the configuration");
    let mut servers: Vec<(ServerConfig, String)> = config
        .mcp
        .servers
        .iter()
        .map(|s| (s.clone(), config_origin.to_owned()))
        .collect();
    for file in files {
        let origin = file.display().to_string();
        servers.extend(
            read_mcp_servers(file)?
                .into_iter()
                .map(|s| (s, origin.clone())),
        );
    }
    for (i, (s, origin)) in servers.iter().enumerate() {
        let Some((first, first_origin)) = servers[..i]
            .iter()
            .find(|(f, _)| f.name.eq_ignore_ascii_case(&s.name))
        else {
            continue;
        };
        let place = |o: &str| {
            if o == first_origin {
                "twice in".to_owned()
            } else {
                format!("in {first_origin} and in")
            }
        };
        if first.name == s.name {
            bail!(
                "MCP server \"{}\" is configured {} {origin}; remove one, or rename one (the name is part of every tool name, mcp__<name>__<tool>)",
                s.name,
                place(origin)
            );
        }
        bail!(
            "MCP servers \"{}\" ({first_origin}) and \"{}\" ({origin}) differ only in case; server names must be unique ignoring case: rename one",
            first.name,
            s.name
        );
    }
    for name in &config.mcp.insecure_http {
        let Some((s, _)) = servers.iter_mut().find(|(s, _)| &s.name == name) else {
            let known: Vec<&str> = servers.iter().map(|(s, _)| s.name.as_str()).collect();
            bail!(
                "{config_origin}: [mcp] insecure_http names {name:?}, which is not a configured MCP server (configured: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            );
        };
        s.insecure_http = true;
    }
    for (s, origin) in &servers {
        validate_all(std::slice::from_ref(s), env)
            .map_err(|e| anyhow::anyhow!("{origin}: {}", config_message(e)))?;
    }
    // What only shows with every server together (two servers with one tool prefix).
    let (all, origins): (Vec<ServerConfig>, std::collections::BTreeSet<String>) =
        servers.into_iter().unzip();
    let origins = origins.into_iter().collect::<Vec<_>>().join(", ");
    let resolved =
        validate_all(&all, env).map_err(|e| anyhow::anyhow!("{origins}: {}", config_message(e)))?;
    // No user's token goes where it does not belong: checked against `[auth.oidc]`.
    let oidc = config.auth.oidc.as_ref();
    quiver_mcp_adapter::check_delegation(
        &resolved,
        oidc.map(|o| o.resource.as_str()),
        oidc.is_some_and(|o| o.client_id.is_some() && o.client_secret.is_some()),
    )
    .map_err(|e| anyhow::anyhow!("{origins}: [[mcp.servers]] {}", config_message(e)))?;
    Ok(resolved)
}

#[cfg(test)]
mod tests;
