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

use crate::{Config, config::interpolate_str};

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
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// The keys of an entry Quiver reads.
const KEYS: [&str; 8] = [
    "type", "command", "args", "env", "cwd", "url", "headers", "disabled",
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
        Err(_) => {}
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
                                "{origin}: server {name:?}: \"{key}\": {}",
                                crate::config::shorten_float(&e.to_string())
                            );
                        }
                    }
                }
            }
        }
    }
    let file: File = serde_json::from_str(text)
        .with_context(|| format!("{origin}: not an mcpServers JSON file"))?;
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
            Some("sse") => bail!(
                "{origin}: server {name:?} uses the legacy SSE transport, which Quiver does not speak; use its streamable HTTP endpoint"
            ),
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
        out.push(server);
    }
    Ok(out)
}

/// Reads and parses an `mcpServers` file.
pub fn read_mcp_servers(path: &Path) -> anyhow::Result<Vec<ServerConfig>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_mcp_servers(&text, &path.display().to_string(), &|k| {
        std::env::var(k).ok()
    })
}

/// The text of an MCP configuration error, without the adapter's "MCP configuration:"
/// (the caller names the file instead).
fn config_message(e: McpError) -> String {
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
    validate_all(&all, env).map_err(|e| {
        anyhow::anyhow!(
            "{}: {}",
            origins.into_iter().collect::<Vec<_>>().join(", "),
            config_message(e)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "HOST" => Some("mcp.example.com".to_owned()),
            "BIN" => Some("/opt/bin".to_owned()),
            _ => None,
        }
    }

    /// A file of the wrong shape is said to be so in its own words, not serde's ("expected
    /// struct Entry").
    #[test]
    fn a_file_of_the_wrong_shape_names_the_shape() {
        for (text, says) in [
            (
                "[]",
                "c.json: the file is an array, not an object: expected {\"mcpServers\"",
            ),
            (
                r#"{"mcpServers": []}"#,
                "\"mcpServers\" is an array, not an object of servers by name",
            ),
            (
                r#"{"mcpServers": {"a": "x"}}"#,
                "server \"a\" is a string, not an object: give {\"command\": ..., \"args\": [...]}",
            ),
            (
                r#"{"servers": {"b": null}}"#,
                "server \"b\" is null, not an object",
            ),
        ] {
            let err = format!("{:#}", parse_mcp_servers(text, "c.json", &env).unwrap_err());
            assert!(err.contains(says), "{text}: {err}");
            assert!(!err.contains("struct"), "{text}: {err}");
        }
    }

    /// The servers come in the file's order, not by name: where two servers offer one tool
    /// name or resource URI, the first in the file has it.
    #[test]
    fn servers_keep_the_files_order() {
        let text = r#"{"mcpServers": {"zeta": {"command": "z"}, "alpha": {"command": "a"}, "mid": {"command": "m"}}}"#;
        let names: Vec<String> = parse_mcp_servers(text, "c.json", &env)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["zeta", "alpha", "mid"]);
    }

    #[test]
    fn reads_the_desktop_clients_format() {
        let text = r#"{"mcpServers": {
            "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"], "env": {"A": "1"}},
            "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Key": "k"}},
            "off": {"command": "x", "disabled": true}
        }}"#;
        let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[0].name, "everything");
        assert_eq!(servers[0].command.as_deref(), Some("npx"));
        assert_eq!(servers[0].env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            servers[1].url.as_deref(),
            Some("https://mcp.example.com/mcp")
        );
        assert_eq!(
            servers[1].headers.get("X-Key").map(String::as_str),
            Some("k")
        );
    }

    /// `${env:VAR}` works in every string field, as in `quiver.toml` (`env` and `headers`
    /// values are replaced when the servers are set up).
    #[test]
    fn env_references_work_in_every_field() {
        let text = r#"{"mcpServers": {
            "local": {"command": "${env:BIN}/server", "args": ["--root", "${env:BIN}/data"], "cwd": "${env:BIN}", "env": {"K": "${env:BIN}"}},
            "remote": {"url": "https://${env:HOST}/mcp", "headers": {"X-Key": "${env:BIN}"}}
        }}"#;
        let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
        assert_eq!(servers[0].command.as_deref(), Some("/opt/bin/server"));
        assert_eq!(servers[0].args, ["--root", "/opt/bin/data"]);
        assert_eq!(
            servers[0].cwd.as_deref(),
            Some(std::path::Path::new("/opt/bin"))
        );
        assert_eq!(
            servers[1].url.as_deref(),
            Some("https://mcp.example.com/mcp")
        );
        let resolved = quiver_mcp_adapter::validate_all(&servers, &env);
        assert!(resolved.is_ok(), "{:?}", resolved.err());
        let err = format!(
            "{:#}",
            parse_mcp_servers(
                r#"{"mcpServers": {"r": {"url": "https://${env:NOPE}/mcp"}}}"#,
                "c.json",
                &env
            )
            .unwrap_err()
        );
        assert!(
            err.contains("c.json: server \"r\": url: environment variable NOPE is not set"),
            "{err}"
        );
    }

    /// Fields of the other transport are ignored (with a warning, like an unknown key: the
    /// file is a desktop client's, leftovers included), never passed on; a `"type"` that
    /// contradicts `command` / `url` is an error naming the file and the server.
    #[test]
    fn fields_of_the_other_transport_are_ignored_and_a_contradicting_type_is_an_error() {
        let err = |t: &str| format!("{:#}", parse_mcp_servers(t, "c.json", &env).unwrap_err());
        let remote = parse_mcp_servers(
            r#"{"mcpServers": {"a": {"url": "https://h/mcp", "env": {"K": "v"}, "args": ["x"]}}}"#,
            "c.json",
            &env,
        )
        .unwrap();
        assert!(remote[0].env.is_empty() && remote[0].args.is_empty());
        let local = parse_mcp_servers(
            r#"{"mcpServers": {"a": {"command": "x", "headers": {"K": "v"}}}}"#,
            "c.json",
            &env,
        )
        .unwrap();
        assert!(local[0].headers.is_empty());
        let e = err(r#"{"mcpServers": {"a": {"type": "http", "command": "x"}}}"#);
        assert!(
            e.contains("c.json: server \"a\" has \"type\": \"http\" but a \"command\""),
            "{e}"
        );
        let e = err(r#"{"mcpServers": {"a": {"type": "stdio", "url": "https://h/mcp"}}}"#);
        assert!(
            e.contains("c.json: server \"a\" has \"type\": \"stdio\" but a \"url\""),
            "{e}"
        );
        let e = err(r#"{"mcpServers": {"a": {"type": "websocket", "url": "wss://h"}}}"#);
        assert!(
            e.contains("c.json: server \"a\": unknown \"type\" \"websocket\""),
            "{e}"
        );
        let ok = r#"{"mcpServers": {"a": {"type": "streamable-http", "url": "https://h/mcp"}, "b": {"type": "stdio", "command": "x"}}}"#;
        assert_eq!(parse_mcp_servers(ok, "c.json", &env).unwrap().len(), 2);
    }

    /// A server's configuration error names the file it is in, without a doubled prefix;
    /// a name configured twice names both files.
    #[test]
    fn server_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, json: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, json).unwrap();
            p
        };
        let toml = |t: &str| Config::parse(t, "q.toml", &env).unwrap();
        let err = |config: &Config, files: &[std::path::PathBuf]| {
            format!("{:#}", resolve_servers(config, files, &env).unwrap_err())
        };
        let a = file("a.json", r#"{"mcpServers": {"a": {"command": "x"}}}"#);
        let a2 = file("a2.json", r#"{"mcpServers": {"a": {"command": "y"}}}"#);
        let ftp = file(
            "ftp.json",
            r#"{"mcpServers": {"f": {"url": "ftp://h/mcp"}}}"#,
        );
        let stdio_a = "[[mcp.servers]]\nname = \"a\"\ntransport = \"stdio\"\ncommand = \"x\"\n";

        let e = err(&toml(stdio_a), std::slice::from_ref(&a));
        assert_eq!(
            e,
            format!(
                "MCP server \"a\" is configured in q.toml and in {}; remove one, or rename one (the name is part of every tool name, mcp__<name>__<tool>)",
                a.display()
            )
        );
        let e = err(&Config::default(), &[a.clone(), a2.clone()]);
        assert!(
            e.contains(&format!("in {} and in {}", a.display(), a2.display())),
            "{e}"
        );
        let e = err(&Config::default(), std::slice::from_ref(&ftp));
        assert_eq!(
            e,
            format!(
                "{}: MCP server \"f\": url scheme \"ftp\" is not http or https",
                ftp.display()
            )
        );
        let e = err(
            &toml(
                "[[mcp.servers]]\nname = \"t\"\ntransport = \"stdio\"\ncommand = \"x\"\nurl = \"http://h\"\n",
            ),
            &[],
        );
        assert!(e.starts_with("q.toml: MCP server \"t\": `url`"), "{e}");
        assert!(!e.contains("MCP configuration"), "{e}");
        let e = err(
            &toml("[mcp]\ninsecure_http = [\"nope\"]\n"),
            std::slice::from_ref(&a),
        );
        assert!(
            e.contains("q.toml: [mcp] insecure_http names \"nope\", which is not a configured MCP server (configured: a)"),
            "{e}"
        );
        assert_eq!(
            resolve_servers(&toml(""), &[a, ftp.with_file_name("none.json")], &env)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            format!("cannot read {}", ftp.with_file_name("none.json").display())
        );
    }

    #[test]
    fn other_clients_keys_are_ignored() {
        let text = r#"{"mcpServers": {
            "fs": {"command": "x", "alwaysAllow": ["read"], "autoApprove": [], "timeout": 60,
                   "envFile": "${workspaceFolder}/.env", "description": "files",
                   "comment": "mine", "enabled": true, "headersHelper": "h", "serverUrl": "u"}
        }}"#;
        let servers = parse_mcp_servers(text, "c.json", &env).unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].command.as_deref(), Some("x"));
    }

    #[test]
    fn bad_entries_are_clear_errors() {
        let err = |t: &str| format!("{:#}", parse_mcp_servers(t, "c.json", &env).unwrap_err());
        assert!(
            err(r#"{"mcpServers": {"server-git": {"command": "x"}}}"#)
                .contains("rename it in the file, e.g. to \"server_git\"")
        );
        assert!(err(r#"{"mcpServers": {"a": {}}}"#).contains("neither \"command\""));
        assert!(
            err(r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#).contains("both")
        );
        assert!(
            err(r#"{"mcpServers": {"a": {"url": "http://h", "type": "sse"}}}"#).contains("SSE")
        );
        assert!(
            err(r#"{"mcpServers": {"a": {"comand": "x"}}}"#).contains(
                "c.json: server \"a\": unknown key \"comand\"; did you mean \"command\"?"
            )
        );
        assert!(err(r#"{"other": 1}"#).contains("no \"mcpServers\""));
        // VS Code's files: JSONC comments, and both keys at once.
        assert!(
            err("// my servers\n{\"servers\": {}}").contains(
                "it has comments (`//` or `/* */`, as VS Code's JSONC allows), which JSON does not; remove them"
            )
        );
        assert!(
            err(r#"{"servers": {}, "mcpServers": {"a": {"command": "x"}}}"#)
                .contains("the file has both \"mcpServers\" (Claude Desktop, Cursor) and \"servers\" (VS Code)")
        );
        assert!(
            err(r#"{"servers": {"a": {"command": "x", "args": ["${workspaceFolder}/x"]}}}"#)
                .contains("c.json: server \"a\": args[0]: `${workspaceFolder}` is not something Quiver fills in")
        );
        // A value of the wrong type is named by its server and key, a huge float quoted
        // short.
        assert_eq!(
            err(r#"{"mcpServers": {"a": {"command": "x", "args": [1e300]}}}"#),
            "c.json: server \"a\": \"args\": invalid type: floating point `1e300`, expected a string"
        );
        assert_eq!(
            err(r#"{"mcpServers": {"a": {"command": "x", "disabled": 1}}}"#),
            "c.json: server \"a\": \"disabled\": invalid type: integer `1`, expected a boolean"
        );
        // `${` in an `env` or `headers` name is refused, as in a value.
        assert_eq!(
            err(r#"{"mcpServers": {"a": {"command": "x", "env": {"${X}": "1"}}}}"#),
            "c.json: server \"a\": env.${X}: a key cannot hold `${...}`: keys are taken as written, and `${env:NAME}` works in values only; write the name itself"
        );
        assert!(
            err(
                r#"{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"X-${env:A}": "1"}}}}"#
            )
            .contains("headers.X-${env:A}: a key cannot hold")
        );
        assert!(err("[1,").contains("not an mcpServers JSON file"));
        // A key given twice is refused with its path, not settled as last-wins.
        assert_eq!(
            err(r#"{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}"#),
            "c.json: \"mcpServers\".\"a\" is given twice (JSON keeps only the last); keep one at line 1 column 42"
        );
        let e = err(
            "{\"mcpServers\": {\"a\": {\"command\": \"x\",\n \"env\": {\"K\": \"1\", \"K\": \"2\"}}}}",
        );
        assert!(
            e.contains("\"mcpServers\".\"a\".\"env\".\"K\" is given twice") && e.contains("line 2"),
            "{e}"
        );
    }
}
