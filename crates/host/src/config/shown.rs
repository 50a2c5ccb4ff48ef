//! The configuration shown back to an operator (the admin page's "Effective configuration"):
//! quiver.toml's own tables and keys, serialised from the same structs the file is read into
//! (so a new key shows without a change here), every secret masked, and the keys that do
//! not apply left out.

use toml::{Table, Value};

use super::Config;

/// What stands for a secret's value.
pub(crate) const MASK: &str = "<masked>";

impl Config {
    /// The configuration as quiver.toml writes it: `[store]`, `durability = "strict"`, ...
    /// Secrets are masked (the admin and inbound tokens, OIDC client secrets, upstream
    /// servers' `env` and `headers` values, `[telemetry] headers` values, a password or
    /// query in any URL); unset keys, empty lists and tables, and `[store] path` beside
    /// `[store] url` are left out.
    pub fn as_toml(&self) -> String {
        let mut table = match Table::try_from(self) {
            Ok(table) => table,
            Err(e) => return format!("# the configuration cannot be shown: {e}\n"),
        };
        mask(&mut table);
        prune(&mut table);
        toml::to_string(&table)
            .unwrap_or_else(|e| format!("# the configuration cannot be shown: {e}\n"))
    }
}

/// The table at `path` (`["auth", "oidc"]`), if there is one.
fn table_at<'a>(table: &'a mut Table, path: &[&str]) -> Option<&'a mut Table> {
    path.iter()
        .try_fold(table, |t, key| t.get_mut(*key)?.as_table_mut())
}

/// Each table of the array of tables at `path` (`["mcp", "servers"]`).
fn tables_at<'a>(table: &'a mut Table, path: &[&str]) -> Vec<&'a mut Table> {
    let (last, parent) = path.split_last().expect("a path");
    table_at(table, parent)
        .and_then(|t| t.get_mut(*last))
        .and_then(Value::as_array_mut)
        .map(|items| items.iter_mut().filter_map(Value::as_table_mut).collect())
        .unwrap_or_default()
}

fn mask_keys(table: &mut Table, keys: &[&str]) {
    for key in keys {
        if let Some(value) = table.get_mut(*key) {
            *value = Value::String(MASK.to_owned());
        }
    }
}

/// Masks every value of the table `key` (a server's `env`, a set of headers).
fn mask_values(table: &mut Table, key: &str) {
    if let Some(map) = table.get_mut(key).and_then(Value::as_table_mut) {
        for value in map.iter_mut().map(|(_, v)| v) {
            *value = Value::String(MASK.to_owned());
        }
    }
}

fn mask(config: &mut Table) {
    if let Some(admin) = table_at(config, &["admin"]) {
        mask_keys(admin, &["token"]);
    }
    for token in tables_at(config, &["auth", "tokens"]) {
        mask_keys(token, &["token"]);
    }
    if let Some(oidc) = table_at(config, &["auth", "oidc"]) {
        mask_keys(oidc, &["client_secret", "introspection_client_secret"]);
    }
    for server in tables_at(config, &["mcp", "servers"]) {
        mask_values(server, "env");
        mask_values(server, "headers");
    }
    if let Some(telemetry) = table_at(config, &["telemetry"]) {
        mask_values(telemetry, "headers");
    }
    mask_urls(config);
}

/// Every string that holds a URL, without its password (and, for http(s), its user, query
/// and fragment): `[store] url`, a server's `url`, the OIDC endpoints.
fn mask_urls(table: &mut Table) {
    fn walk(value: &mut Value) {
        match value {
            Value::String(s) if s.contains("://") || s.contains('@') => {
                *s = quiver_store_postgres::redact(&quiver_mcp_adapter::redact_urls(s));
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            Value::Table(t) => t.iter_mut().for_each(|(_, v)| walk(v)),
            _ => {}
        }
    }
    table.iter_mut().for_each(|(_, v)| walk(v));
}

/// Leaves out what does not apply: `[store] path` when `url` names PostgreSQL, then every
/// empty list and table (a list of none reads as the default it is).
fn prune(config: &mut Table) {
    if let Some(store) = table_at(config, &["store"])
        && store.contains_key("url")
    {
        store.remove("path");
    }
    fn empty(value: &mut Value) -> bool {
        match value {
            Value::Array(items) => {
                items.iter_mut().for_each(|v| {
                    empty(v);
                });
                items.is_empty()
            }
            Value::Table(t) => {
                t.retain(|_, v| !empty(v));
                t.is_empty()
            }
            _ => false,
        }
    }
    config.retain(|_, v| !empty(v));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        let env = |k: &str| (k == "DB_PASSWORD").then(|| "s3cret-pw".to_owned());
        let mut config = Config::parse(text, "quiver.toml", &env).expect("a valid config");
        config.skills.trust_by_flag();
        config.as_toml()
    }

    #[test]
    fn the_configuration_reads_as_quiver_toml_with_its_secrets_masked() {
        let text = shown(
            r#"
[store]
url = "postgres://quiver:${env:DB_PASSWORD}@db.internal:5432/quiver"
durability = "strict"

[admin]
token = "admin-token-0123456789"

[[auth.tokens]]
name = "ci"
token = "ci-secret-token-0123456789"
allowed_tools = ["mcp__time__*"]
mode = "plan"

[auth.oidc]
issuer = "https://id.example.com"
resource = "https://quiver.example.com/mcp"
client_id = "quiver"
client_secret = "oidc-client-secret"

[[mcp.servers]]
name = "web"
url = "https://user:url-password@api.example.com/mcp?key=query-secret"
headers = { Authorization = "Bearer header-secret" }
call_timeout = 2.5
liveness = "off"

[[mcp.servers]]
name = "time"
command = "uvx"
args = ["mcp-server-time"]
env = { TZ_KEY = "env-secret" }
connect_timeout = "500ms"

[telemetry]
otlp_endpoint = "http://collector:4318"
headers = { x-api-key = "collector-secret" }
"#,
        );
        insta::assert_snapshot!(text);
        for secret in [
            "s3cret-pw",
            "admin-token-0123456789",
            "ci-secret-token",
            "oidc-client-secret",
            "url-password",
            "query-secret",
            "header-secret",
            "env-secret",
            "collector-secret",
        ] {
            assert!(!text.contains(secret), "{secret} in\n{text}");
        }
        for rust in ["Some(", "None", "Config", "trusted_by_flag", "denied_tools"] {
            assert!(!text.contains(rust), "{rust} in\n{text}");
        }
        assert!(
            !text.contains("path = "),
            "no SQLite path beside the url:\n{text}"
        );
    }

    #[test]
    fn what_is_shown_reads_back_as_the_same_configuration() {
        // Every key shown is one quiver.toml takes (the file is read with unknown keys
        // refused), with the value it had: secrets aside, the text is a quiver.toml.
        let text = shown(
            r#"
[store]
path = "/var/lib/quiver/quiver.db"
retention_days = 30
[limits]
timeout_secs = 12.5
[limits.tool_timeouts]
slow = 60
[surface]
anchors = ["tool_search"]
[surface.working_set]
max_tools = 10
[[policy.rules]]
id = "no-rm"
tool = "mcp__fs__rm"
action = "deny"
message = "do not delete files"
[[mcp.servers]]
name = "time"
command = "uvx"
liveness = "90s"
http_timeout = "1.5s"
scope = "session"
[sandbox]
heap_mib = 64
[search]
model_dir = "/models/minilm"
"#,
        );
        let again = Config::parse(&text, "shown.toml", &|_| None).expect(&text);
        assert_eq!(again.as_toml(), text);
        assert!(
            text.contains("[store]\npath = \"/var/lib/quiver/quiver.db\""),
            "{text}"
        );
        assert!(text.contains("liveness = \"90s\""), "{text}");
        assert!(text.contains("http_timeout = \"1.5s\""), "{text}");
        assert!(text.contains("action = \"deny\""), "{text}");
    }
}
