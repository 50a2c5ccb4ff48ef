//! The page's HTML: pure functions from view rows to markup (maud escapes every value), so
//! that what an operator sees is snapshot-tested without a server.
//!
//! Over 800 lines: the markup of every view is here, so that the page's look is read and
//! snapshot-tested in one place.

use std::time::{Duration, SystemTime};

use maud::{DOCTYPE, Markup, html};

use crate::{Replica, UpstreamRow, time};

/// The sections, in the navigation's order: path and label.
const NAV: [(&str, &str); 6] = [
    ("/admin/catalog", "Catalog"),
    ("/admin/upstreams", "Upstreams"),
    ("/admin/sessions", "Sessions"),
    ("/admin/log", "Call log"),
    ("/admin/custom", "Custom tools"),
    ("/admin/config", "Config"),
];

/// One tool in the catalog view.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolRow {
    pub(crate) name: String,
    pub(crate) family: String,
    /// The upstream server of an MCP tool.
    pub(crate) server: Option<String>,
    /// The review status (`approved`, `draft`, ...).
    pub(crate) status: String,
    pub(crate) enabled: bool,
    /// The modes it is listed in (`all`, or `plan` for a plan-only tool).
    pub(crate) modes: String,
    pub(crate) calls_30d: u64,
    pub(crate) calls_total: u64,
    /// The newest error among the recent failed calls, if any.
    pub(crate) last_error: Option<String>,
    /// The search score, on a search.
    pub(crate) score: Option<f64>,
}

/// One call in the log view.
#[derive(Debug, Clone)]
pub(crate) struct CallRow {
    pub(crate) call_id: String,
    pub(crate) at: SystemTime,
    pub(crate) tool: String,
    pub(crate) principal: Option<String>,
    pub(crate) session: Option<String>,
    /// `ok`, `hint` or `err`.
    pub(crate) outcome: String,
    pub(crate) error: Option<String>,
    pub(crate) queued: Duration,
    pub(crate) took: Duration,
    /// The log's row number: with `at`, the row's page cursor.
    pub(crate) row: u64,
}

/// The log view's filters, as the query string gives them.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub(crate) struct LogQuery {
    #[serde(default)]
    pub(crate) tool: String,
    #[serde(default)]
    pub(crate) session: String,
    #[serde(default)]
    pub(crate) principal: String,
    #[serde(default)]
    pub(crate) outcome: String,
    /// `15m`, `1h`, `24h`, `7d`, or empty for any time.
    #[serde(default)]
    pub(crate) within: String,
    /// The page cursor: rows older than this one (`MICROS.ROW`, see `time::row_cursor`).
    #[serde(default)]
    pub(crate) before: Option<String>,
}

/// The time windows of the log's filter: value, label, length.
pub(crate) const WINDOWS: [(&str, &str, Duration); 4] = [
    ("15m", "last 15 minutes", Duration::from_secs(15 * 60)),
    ("1h", "last hour", Duration::from_secs(3600)),
    ("24h", "last 24 hours", Duration::from_secs(86_400)),
    ("7d", "last 7 days", Duration::from_secs(7 * 86_400)),
];

impl LogQuery {
    /// The query string of these filters (the cursor left out).
    pub(crate) fn query_string(&self) -> String {
        let mut parts = Vec::new();
        for (key, value) in [
            ("tool", &self.tool),
            ("session", &self.session),
            ("principal", &self.principal),
            ("outcome", &self.outcome),
            ("within", &self.within),
        ] {
            if !value.is_empty() {
                parts.push(format!("{key}={}", encode(value)));
            }
        }
        parts.join("&")
    }
}

/// Percent-encodes a query-string value.
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What every page of a login shows around its view: the session's CSRF token (its forms
/// carry it) and the replica serving it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    pub(crate) csrf: &'a str,
    pub(crate) replica: Option<&'a Replica>,
}

/// A whole page: the navigation (with the replica serving it and the logout form, from
/// `frame`), `title`, `body`. `frame` is `None` on the login page.
pub(crate) fn page(title: &str, active: &str, frame: Option<&Frame<'_>>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Quiver admin" }
                link rel="stylesheet" href="/admin/assets/admin.css";
                script src="/admin/assets/live.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    span.brand { "Quiver admin" }
                    @if let Some(frame) = frame {
                        @if let Some(replica) = frame.replica {
                            span.replica #replica title="The replica serving this page: upstream actions act on it alone" {
                                "replica " (replica.host) ", pid " (replica.pid) ", listening on " (replica.listen)
                            }
                        }
                        nav aria-label="Sections" {
                            ul {
                                @for (path, label) in NAV {
                                    li {
                                        @if path == active {
                                            a href=(path) aria-current="page" { (label) }
                                        } @else {
                                            a href=(path) { (label) }
                                        }
                                    }
                                }
                            }
                        }
                        form.logout method="post" action="/admin/logout" {
                            input type="hidden" name="csrf" value=(frame.csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main id="main" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The login form, with `error` above it when a login failed.
pub(crate) fn login(error: Option<&str>) -> Markup {
    page(
        "Log in",
        "",
        None,
        html! {
            @if let Some(error) = error {
                p.error role="alert" { (error) }
            }
            form method="post" action="/admin/login" {
                label for="token" { "Admin token (" code { "[admin] token" } ")" }
                input id="token" name="token" type="password" autocomplete="current-password" required autofocus;
                button type="submit" { "Log in" }
            }
        },
    )
}

/// A message page (a refused action, a missing tool): `status` as the title.
pub(crate) fn message(title: &str, text: &str, frame: Option<&Frame<'_>>) -> Markup {
    page(title, "", frame, html! { p role="alert" { (text) } })
}

/// The catalog: a search form, then every tool (or the search's hits, best first), with
/// the usage counted at `counted` (`None`: not counted yet).
pub(crate) fn catalog(
    rows: &[ToolRow],
    query: &str,
    counted: Option<SystemTime>,
    frame: &Frame<'_>,
) -> Markup {
    page(
        "Catalog",
        "/admin/catalog",
        Some(frame),
        html! {
            form.filters method="get" action="/admin/catalog" role="search" {
                label for="q" { "Search tools (the " code { "tool_search" } " engine)" }
                input id="q" name="q" type="search" value=(query);
                button type="submit" { "Search" }
                @if !query.is_empty() { a href="/admin/catalog" { "Show all" } }
            }
            p.count {
                (rows.len()) " tools" @if !query.is_empty() { " matching " q { (query) } } ". "
                @match counted {
                    Some(at) => { "Calls counted at " (time::utc(at)) " UTC (again at most once a minute)." },
                    None => { "Calls are being counted over the call log: reload in a moment." },
                }
            }
            table #catalog {
                caption.visually-hidden { "Tools in the catalog" }
                thead { tr {
                    th scope="col" { "Tool" }
                    th scope="col" { "Family" }
                    th scope="col" { "Server" }
                    th scope="col" { "Status" }
                    th scope="col" { "Enabled" }
                    th scope="col" { "Modes" }
                    th scope="col" { "Calls (30 d)" }
                    th scope="col" { "Calls (all)" }
                    th scope="col" { "Last error" }
                    @if !query.is_empty() { th scope="col" { "Score" } }
                } }
                tbody {
                    @for row in rows {
                        tr {
                            td { a href={ "/admin/tools/" (encode(&row.name)) } { code { (row.name) } } }
                            td { (row.family) }
                            td { (row.server.as_deref().unwrap_or("")) }
                            td { (row.status) }
                            td { @if row.enabled { "yes" } @else { "no" } }
                            td { (row.modes) }
                            td.num { (row.calls_30d) }
                            td.num { (row.calls_total) }
                            td.error { (row.last_error.as_deref().unwrap_or("")) }
                            @if let Some(score) = row.score { td.num { (format!("{score:.3}")) } }
                        }
                    }
                }
            }
        },
    )
}

/// One tool: its row, its full definition and its lint findings (rule, path, message).
pub(crate) fn tool(
    row: &ToolRow,
    definition: &str,
    findings: &[(String, String, String)],
    frame: &Frame<'_>,
) -> Markup {
    page(
        &row.name,
        "/admin/catalog",
        Some(frame),
        html! {
            dl.facts {
                dt { "Family" } dd { (row.family) }
                dt { "Server" } dd { (row.server.as_deref().unwrap_or("—")) }
                dt { "Status" } dd { (row.status) }
                dt { "Enabled" } dd { @if row.enabled { "yes" } @else { "no" } }
                dt { "Modes" } dd { (row.modes) }
                dt { "Calls" } dd { (row.calls_30d) " in 30 days, " (row.calls_total) " in all" }
                dt { "Last error" } dd { (row.last_error.as_deref().unwrap_or("—")) }
            }
            p { a href={ "/admin/log?tool=" (encode(&row.name)) } { "This tool's calls" } }
            h2 { "Lint findings" }
            @if findings.is_empty() {
                p { "None: the definition follows the tool-writing guide." }
            } @else {
                ul.findings {
                    @for (rule, path, message) in findings {
                        li { code { (rule) } @if !path.is_empty() { " at " code { (path) } } ": " (message) }
                    }
                }
            }
            h2 { "Definition" }
            pre.json { (definition) }
        },
    )
}

/// An upstream's call latency, from the newest calls in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Latency {
    /// The newest call's.
    pub(crate) last: Duration,
    /// The median of those read.
    pub(crate) median: Duration,
    /// How many calls were read.
    pub(crate) calls: usize,
}

/// The upstreams' table: what the live region of the upstreams view holds. Each server
/// has a reconnect button and a disable (or enable) switch.
pub(crate) fn upstreams_table(
    rows: &[UpstreamRow],
    latency: &std::collections::HashMap<String, Latency>,
    frame: &Frame<'_>,
) -> Markup {
    html! {
        table #upstreams {
            caption.visually-hidden { "Upstream MCP servers" }
            thead { tr {
                th scope="col" { "Server" }
                th scope="col" { "State" }
                th scope="col" { "Tools" }
                th scope="col" { "Connects" }
                th scope="col" { "Drops" }
                th scope="col" { "Calls" }
                th scope="col" { "Last connected (UTC)" }
                th scope="col" { "Latency (last, median)" }
                th scope="col" { "Why" }
                th scope="col" { "Actions" }
            } }
            tbody {
                @for row in rows {
                    tr data-server=(row.name) {
                        td { code { (row.name) } }
                        td { span class={ "state " (row.state) } { (row.state) } }
                        td.num { (row.tools) }
                        td.num { (row.connects) }
                        td.num { (row.drops) }
                        td.num { (row.calls) }
                        td { @if let Some(at) = row.last_connect { time { (time::utc(at)) } } @else { "—" } }
                        td.num {
                            @if let Some(l) = latency.get(&row.name) {
                                (time::took(l.last)) ", " (time::took(l.median))
                                span.muted { " (" (l.calls) " calls)" }
                            } @else { "—" }
                        }
                        td.error { (row.why.as_deref().unwrap_or("")) }
                        td {
                            @if row.enabled {
                                form.inline method="post" action={ "/admin/upstreams/" (encode(&row.name)) "/reconnect" } {
                                    input type="hidden" name="csrf" value=(frame.csrf);
                                    button type="submit" aria-label={ "Reconnect " (row.name) } { "Reconnect" }
                                }
                                form.inline method="post" action={ "/admin/upstreams/" (encode(&row.name)) "/disable" } {
                                    input type="hidden" name="csrf" value=(frame.csrf);
                                    button type="submit" aria-label={ "Disable " (row.name) } { "Disable" }
                                }
                            } @else {
                                form.inline method="post" action={ "/admin/upstreams/" (encode(&row.name)) "/enable" } {
                                    input type="hidden" name="csrf" value=(frame.csrf);
                                    button type="submit" aria-label={ "Enable " (row.name) } { "Enable" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The upstream servers, updated live.
pub(crate) fn upstreams(
    rows: &[UpstreamRow],
    latency: &std::collections::HashMap<String, Latency>,
    notice: Option<&str>,
    frame: &Frame<'_>,
) -> Markup {
    page(
        "Upstreams",
        "/admin/upstreams",
        Some(frame),
        html! {
            @if let Some(notice) = notice { p.notice role="status" { (notice) } }
            @if rows.is_empty() {
                p { "No upstream MCP servers are configured." }
            } @else {
                p #replica-scope {
                    "Reconnect, Disable and Enable act on this replica only"
                    @if let Some(replica) = frame.replica {
                        " (" (replica.host) ", pid " (replica.pid) ")"
                    }
                    ": each replica has its own connections to the upstream servers, so other replicas keep theirs. Do the same on each replica (reach each one directly) to change them all."
                }
                p.live { "Latency is the time from dispatch to result of the server's newest calls in the log. The table follows the servers as they change." }
                div.live-region #upstreams-live data-refresh="/admin/upstreams?part=table" {
                    (upstreams_table(rows, latency, frame))
                }
            }
        },
    )
}

/// One session as the sessions view shows it.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionRow {
    /// The working-set key.
    pub(crate) key: String,
    pub(crate) principal: Option<String>,
    /// The protocol version and era of its last `tools/list`.
    pub(crate) protocol: Option<String>,
    pub(crate) mode: String,
    pub(crate) round: u64,
    /// The working set, most recent first: name, bytes, idle rounds.
    pub(crate) set: Vec<(String, usize, u64)>,
    pub(crate) set_bytes: usize,
    /// The tools its model is listed: name, why it is there, advertised bytes.
    pub(crate) listed: Vec<(String, String, usize)>,
    pub(crate) listed_bytes: usize,
    /// The candidates left off: name, where it came from, why it was left off.
    pub(crate) dropped: Vec<(String, String, String)>,
    /// Why its list cannot be composed, when it cannot.
    pub(crate) error: Option<String>,
}

/// The surface's budgets, as configured now.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Budgets {
    pub(crate) round_tools: usize,
    pub(crate) round_bytes: usize,
    pub(crate) set_tools: usize,
    pub(crate) set_bytes: usize,
    pub(crate) idle_rounds: u64,
    pub(crate) max_surface: usize,
}

/// The budgets every session's rounds are cut to.
fn budgets(b: &Budgets) -> Markup {
    html! {
        dl.facts #budgets {
            dt { "Round" } dd { "at most " (b.round_tools) " tools and " (b.round_bytes) " bytes of definitions listed (" code { "tool_search" } " always); never more than " (b.max_surface) " tools" }
            dt { "Working set" } dd { "at most " (b.set_tools) " tools and " (b.set_bytes) " bytes; a tool idle for more than " (b.idle_rounds) " rounds leaves" }
            dt { "Calls" } dd { "no per-session call budget: a custom tool's run is bounded by the sandbox's " code { "max_calls" } }
        }
    }
}

/// The sessions' table: what the live region of the sessions view holds.
pub(crate) fn sessions_table(rows: &[SessionRow], b: &Budgets) -> Markup {
    html! {
        @if rows.is_empty() {
            p #no-sessions { "No sessions." }
        } @else {
            table #sessions {
                caption.visually-hidden { "Sessions, by key" }
                thead { tr {
                    th scope="col" { "Session (working-set key)" }
                    th scope="col" { "Principal" }
                    th scope="col" { "Mode" }
                    th scope="col" { "Protocol" }
                    th scope="col" { "Round" }
                    th scope="col" { "Listed tools" }
                    th scope="col" { "Working set" }
                    th scope="col" { "Calls" }
                } }
                tbody {
                    @for row in rows {
                        tr data-session=(row.key) {
                            td { a href={ "/admin/sessions/" (encode(&row.key)) } { code { (row.key) } } }
                            td { (row.principal.as_deref().unwrap_or("—")) }
                            td { (row.mode) }
                            td { (row.protocol.as_deref().unwrap_or("—")) }
                            td.num { (row.round) }
                            td.num {
                                @if let Some(e) = &row.error { span.error { (e) } } @else {
                                    (row.listed.len()) " / " (b.round_tools) " tools, " (row.listed_bytes) " / " (b.round_bytes) " B"
                                }
                            }
                            td.num { (row.set.len()) " / " (b.set_tools) " tools, " (row.set_bytes) " / " (b.set_bytes) " B" }
                            td { a href={ "/admin/log?session=" (encode(&row.key)) } aria-label={ "Calls of " (row.key) } { "calls" } }
                        }
                    }
                }
            }
        }
    }
}

/// The sessions the surface holds, each with what its model is listed, updated live.
pub(crate) fn sessions(
    rows: &[SessionRow],
    floor: &[String],
    b: &Budgets,
    frame: &Frame<'_>,
) -> Markup {
    page(
        "Sessions",
        "/admin/sessions",
        Some(frame),
        html! {
            p { "Every session is shown the resident floor (" (floor.len()) " tools) plus its working set, within these budgets:" }
            (budgets(b))
            details { summary { "Resident floor" } ul #floor { @for t in floor { li { code { (t) } } } } }
            p.live role="status" { "The table follows the sessions as they change." }
            div.live-region #sessions-live data-refresh="/admin/sessions?part=table" {
                (sessions_table(rows, b))
            }
        },
    )
}

/// One session's surface as its model sees it: the listed tools, those left off, the
/// working set (the live region of the session's view).
pub(crate) fn session_detail(row: &SessionRow, b: &Budgets) -> Markup {
    html! {
        dl.facts {
            dt { "Principal" } dd { (row.principal.as_deref().unwrap_or("— (no token)")) }
            dt { "Mode" } dd #session-mode { (row.mode) }
            dt { "Protocol" } dd { (row.protocol.as_deref().unwrap_or("— (no tools/list over MCP yet)")) }
            dt { "Round" } dd { (row.round) }
        }
        h2 { "Listed to the model" }
        @if let Some(e) = &row.error {
            p.error role="alert" { (e) }
        } @else {
            p { (row.listed.len()) " of at most " (b.round_tools) " tools, " (row.listed_bytes) " of " (b.round_bytes) " bytes." }
            table #listed {
                caption.visually-hidden { "Tools listed to the model, in rank order" }
                thead { tr { th scope="col" { "Tool" } th scope="col" { "Why listed" } th scope="col" { "Bytes" } } }
                tbody {
                    @for (name, reason, bytes) in &row.listed {
                        tr { td { a href={ "/admin/tools/" (encode(name)) } { code { (name) } } } td { (reason) } td.num { (bytes) } }
                    }
                }
            }
            @if !row.dropped.is_empty() {
                h2 { "Left off" }
                table #dropped {
                    caption.visually-hidden { "Candidates left off the list, with why" }
                    thead { tr { th scope="col" { "Tool" } th scope="col" { "Candidate as" } th scope="col" { "Left off because" } } }
                    tbody {
                        @for (name, reason, why) in &row.dropped {
                            tr { td { code { (name) } } td { (reason) } td { (why) } }
                        }
                    }
                }
            }
        }
        h2 { "Working set" }
        p { (row.set.len()) " of at most " (b.set_tools) " tools, " (row.set_bytes) " of " (b.set_bytes) " bytes." }
        @if !row.set.is_empty() {
            table #working-set {
                caption.visually-hidden { "Working set, most recently used first" }
                thead { tr { th scope="col" { "Tool" } th scope="col" { "Bytes" } th scope="col" { "Idle rounds" } } }
                tbody {
                    @for (name, bytes, idle) in &row.set {
                        tr { td { code { (name) } } td.num { (bytes) } td.num { (idle) " / " (b.idle_rounds) } }
                    }
                }
            }
        }
    }
}

/// A session's page: [`session_detail`], updated live.
pub(crate) fn session(row: &SessionRow, b: &Budgets, frame: &Frame<'_>) -> Markup {
    page(
        &format!("Session {}", row.key),
        "/admin/sessions",
        Some(frame),
        html! {
            p { a href={ "/admin/log?session=" (encode(&row.key)) } { "This session's calls" } }
            div.live-region #session-live data-refresh={ "/admin/sessions/" (encode(&row.key)) "?part=detail" } {
                (session_detail(row, b))
            }
        },
    )
}

/// One call's table row (the log view's, and what the live stream sends).
pub(crate) fn call_row(row: &CallRow) -> Markup {
    html! {
        tr class={ "call " (row.outcome) } data-call=(row.call_id) {
            td { time { (time::utc(row.at)) } }
            td { a href={ "/admin/calls/" (encode(&row.call_id)) } { code { (row.tool) } } }
            td { (row.principal.as_deref().unwrap_or("")) }
            td { code { (row.session.as_deref().unwrap_or("")) } }
            td { span class={ "outcome " (row.outcome) } { (row.outcome) } }
            td.num { (time::took(row.took)) }
            td.num { (time::took(row.queued)) }
            td.error { (row.error.as_deref().unwrap_or("")) }
        }
    }
}

/// The header row of a table of calls ([`call_row`]'s columns).
fn call_head() -> Markup {
    html! {
        thead { tr {
            th scope="col" { "At (UTC)" }
            th scope="col" { "Tool" }
            th scope="col" { "Principal" }
            th scope="col" { "Session" }
            th scope="col" { "Outcome" }
            th scope="col" { "Took" }
            th scope="col" { "Queued" }
            th scope="col" { "Error" }
        } }
    }
}

/// The call log: filters, the newest rows (live on the first page), a link to older ones.
pub(crate) fn log(
    rows: &[CallRow],
    query: &LogQuery,
    older: Option<String>,
    frame: &Frame<'_>,
) -> Markup {
    let filters = query.query_string();
    let first_page = query.before.is_none();
    let newest = rows
        .first()
        .map_or_else(|| "0".to_owned(), |r| time::row_cursor(r.at, r.row));
    let live = format!(
        "/admin/log/stream?{filters}{}after={newest}",
        if filters.is_empty() { "" } else { "&" }
    );
    page(
        "Call log",
        "/admin/log",
        Some(frame),
        html! {
            form.filters method="get" action="/admin/log" {
                label for="f-tool" { "Tool" }
                input id="f-tool" name="tool" value=(query.tool);
                label for="f-session" { "Session" }
                input id="f-session" name="session" value=(query.session);
                label for="f-principal" { "Principal" }
                input id="f-principal" name="principal" value=(query.principal);
                label for="f-outcome" { "Outcome" }
                select id="f-outcome" name="outcome" {
                    @for (value, label) in [("", "any"), ("ok", "ok"), ("hint", "hint"), ("err", "err")] {
                        option value=(value) selected[query.outcome == value] { (label) }
                    }
                }
                label for="f-within" { "Time" }
                select id="f-within" name="within" {
                    option value="" selected[query.within.is_empty()] { "any time" }
                    @for (value, label, _) in WINDOWS {
                        option value=(value) selected[query.within == value] { (label) }
                    }
                }
                button type="submit" { "Filter" }
            }
            @if first_page {
                p.live role="status" { "New calls appear at the top as they are logged." }
            }
            table #log data-live=[first_page.then_some(live)] {
                caption.visually-hidden { "Calls, newest first" }
                (call_head())
                tbody {
                    @for row in rows { (call_row(row)) }
                }
            }
            @if rows.is_empty() { p #no-calls { "No calls match." } }
            nav.pages aria-label="Pages" {
                a href={ "/admin/log/export?" (filters) @if let Some(b) = &query.before { @if !filters.is_empty() { "&" } "before=" (encode(b)) } } download { "Export these calls (JSON Lines)" } " "
                a href="/admin/log/chain" { "Verify the hash chain" } " "
                @if !first_page { a href={ "/admin/log?" (filters) } { "Newest" } " " }
                @if let Some(older) = older {
                    a href={ "/admin/log?" (filters) @if !filters.is_empty() { "&" } "before=" (older) } rel="next" { "Older calls" }
                }
            }
        },
    )
}

/// One call in full: JSON fields as given, `output` the rendered envelope.
pub(crate) struct CallDetail<'a> {
    pub(crate) row: &'a CallRow,
    pub(crate) parent: Option<&'a str>,
    /// The OpenTelemetry trace the call was part of, to look it up in the tracing backend.
    pub(crate) trace_id: Option<&'a str>,
    /// The calls made from this one (a custom tool's `call_tool` calls), oldest first.
    pub(crate) children: &'a [CallRow],
    pub(crate) input: &'a str,
    pub(crate) reasoning: Option<&'a str>,
    pub(crate) output: &'a str,
}

/// A call's detail page.
pub(crate) fn call(detail: &CallDetail<'_>, frame: &Frame<'_>) -> Markup {
    let row = detail.row;
    page(
        &format!("Call {}", row.call_id),
        "/admin/log",
        Some(frame),
        html! {
            dl.facts {
                dt { "Tool" } dd { a href={ "/admin/tools/" (encode(&row.tool)) } { code { (row.tool) } } }
                dt { "At (UTC)" } dd { (time::utc(row.at)) }
                dt { "Outcome" } dd { span class={ "outcome " (row.outcome) } { (row.outcome) } }
                dt { "Principal" } dd { (row.principal.as_deref().unwrap_or("—")) }
                dt { "Session" } dd { (row.session.as_deref().unwrap_or("—")) }
                dt { "Queued" } dd { (time::took(row.queued)) }
                dt { "Took" } dd { (time::took(row.took)) }
                dt { "Parent call" } dd {
                    @if let Some(parent) = detail.parent { a href={ "/admin/calls/" (encode(parent)) } { code { (parent) } } } @else { "—" }
                }
                dt { "Trace id" } dd {
                    @if let Some(trace) = detail.trace_id { code { (trace) } } @else { "— (traces are not exported)" }
                }
            }
            h2 { "Input" }
            pre.json { (detail.input) }
            @if let Some(reasoning) = detail.reasoning {
                h2 { "Reasoning" }
                pre { (reasoning) }
            }
            h2 { "Output (as the model read it)" }
            pre { (detail.output) }
            @if !detail.children.is_empty() {
                h2 { "Calls made from this call" }
                table #children {
                    caption.visually-hidden { "Calls made from this call, oldest first" }
                    (call_head())
                    tbody {
                        @for row in detail.children { (call_row(row)) }
                    }
                }
            }
        },
    )
}

/// One custom tool under review or served.
#[derive(Debug, Clone)]
pub(crate) struct CustomRow {
    pub(crate) name: String,
    pub(crate) version: u32,
    pub(crate) status: String,
    pub(crate) enabled: bool,
    /// The last test run's summary.
    pub(crate) tests: String,
    /// The version under review, if one is pending.
    pub(crate) pending: Option<String>,
    /// The reason it was rejected.
    pub(crate) rejected: Option<String>,
}

/// Custom tools, drafts first, with approve and reject forms; then the jobs.
pub(crate) fn custom(
    rows: &[CustomRow],
    jobs: &[JobRow],
    notice: Option<&str>,
    frame: &Frame<'_>,
) -> Markup {
    page(
        "Custom tools",
        "/admin/custom",
        Some(frame),
        html! {
            @if let Some(notice) = notice { p.notice role="status" { (notice) } }
            @if rows.is_empty() {
                p { "No custom tools. A model proposes one with " code { "propose_tool" } "; an operator adds one with " code { "quiver custom add" } "." }
            } @else {
                table #custom {
                    caption.visually-hidden { "Custom tools" }
                    thead { tr {
                        th scope="col" { "Tool" }
                        th scope="col" { "Version" }
                        th scope="col" { "Status" }
                        th scope="col" { "Enabled" }
                        th scope="col" { "Tests" }
                        th scope="col" { "Review" }
                    } }
                    tbody {
                        @for row in rows {
                            tr data-tool=(row.name) {
                                td { a href={ "/admin/tools/" (encode(&row.name)) } { code { (row.name) } } }
                                td.num { (row.version) }
                                td { (row.status) @if let Some(p) = &row.pending { " (pending " (p) ")" } }
                                td { @if row.enabled { "yes" } @else { "no" } }
                                td { (row.tests) }
                                td {
                                    @if let Some(why) = &row.rejected { p.error { "Rejected: " (why) } }
                                    @if row.status != "approved" || row.pending.is_some() {
                                        form.inline method="post" action={ "/admin/custom/" (encode(&row.name)) "/approve" } {
                                            input type="hidden" name="csrf" value=(frame.csrf);
                                            button type="submit" aria-label={ "Approve " (row.name) } { "Approve" }
                                        }
                                        form.inline method="post" action={ "/admin/custom/" (encode(&row.name)) "/reject" } {
                                            input type="hidden" name="csrf" value=(frame.csrf);
                                            label for={ "reason-" (row.name) } { "Reason" }
                                            input id={ "reason-" (row.name) } name="reason" required;
                                            button type="submit" aria-label={ "Reject " (row.name) } { "Reject" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Jobs" }
            div.live-region #jobs-live data-refresh="/admin/custom?part=jobs" {
                (jobs_table(jobs))
            }
        },
    )
}

/// One custom-tool job: id, tool, type, status, progress in percent.
pub(crate) type JobRow = (String, String, String, String, u8);

/// The custom-tool jobs, newest first: what the live region of the custom-tools view
/// holds.
pub(crate) fn jobs_table(jobs: &[JobRow]) -> Markup {
    html! {
        @if jobs.is_empty() {
            p #no-jobs { "No jobs." }
        } @else {
            table #jobs {
                caption.visually-hidden { "Custom-tool jobs, newest first" }
                thead { tr { th scope="col" { "Job" } th scope="col" { "Tool" } th scope="col" { "Type" } th scope="col" { "Status" } th scope="col" { "Progress" } } }
                tbody {
                    @for (id, tool, kind, status, pct) in jobs {
                        tr data-job=(id) {
                            td { code { (id) } }
                            td { code { (tool) } }
                            td { (kind) }
                            td { (status) }
                            td { progress max="100" value=(pct) aria-label={ "Progress of " (id) } { (pct) "%" } " " (pct) "%" }
                        }
                    }
                }
            }
        }
    }
}

/// A finding's severity as `quiver check` counts it.
fn severity(s: quiver_contract::Severity) -> &'static str {
    use quiver_contract::Severity;
    match s {
        Severity::Error => "finding",
        Severity::NotRegistered => "not registered",
        Severity::Unmatched => "unmatched",
        Severity::Breaking => "breaking",
        Severity::Note => "note",
        _ => "other",
    }
}

/// `quiver check`'s findings on the configuration in force.
fn findings(found: Option<&[quiver_contract::Finding]>) -> Markup {
    html! {
        h2 { code { "quiver check" } " findings" }
        @match found {
            None => p { "A reload holds the configuration: reload the page in a moment." },
            Some([]) => p #check-status { "None: the check passes." },
            Some(found) => {
                @let failing = found.iter().filter(|f| f.severity.fails()).count();
                p #check-status {
                    @if failing == 0 { "The check passes, with " (found.len()) " note(s)." }
                    @else { "The check fails: " (failing) " finding(s) fail it, " (found.len() - failing) " note(s)." }
                }
                ul #findings.findings {
                    @for f in found {
                        @if f.severity.fails() {
                            li.error { strong { (severity(f.severity)) } ": " (f.text) }
                        } @else {
                            li { strong { (severity(f.severity)) } ": " (f.text) }
                        }
                    }
                }
            },
        }
    }
}

/// The effective configuration, the last reload's result and `quiver check`'s findings.
pub(crate) fn config(
    effective: &str,
    last_reload: Option<&str>,
    found: Option<&[quiver_contract::Finding]>,
    frame: &Frame<'_>,
) -> Markup {
    page(
        "Config",
        "/admin/config",
        Some(frame),
        html! {
            (findings(found))
            h2 { "Last reload" }
            @match last_reload {
                Some(r) => pre.json { (r) },
                None => p { "No reload since the server started." },
            }
            h2 { "Effective configuration (secrets masked)" }
            pre.json { (effective) }
        },
    )
}

/// The hash chain's status: intact with its head, or the problems found.
pub(crate) fn chain(report: &quiver_registry::chain::VerifyReport, frame: &Frame<'_>) -> Markup {
    let span = match report.span {
        Some((a, b)) => format!("rows {a} to {b}"),
        None => "no rows".to_owned(),
    };
    page(
        "Hash chain",
        "/admin/log",
        Some(frame),
        html! {
            @if report.intact() {
                p #chain-status { "Chain intact: " (report.rows) " row(s) checked (" (span) "), "
                    (report.checkpoints_checked) " checkpoint(s) matched." }
                @if let Some(last) = report.last {
                    p { "Head: " code #chain-head { (last.to_string()) } }
                    p { "Record the head elsewhere; " code { "quiver log --verify --expect-head HEAD" }
                        " later checks that the chain still holds it." }
                }
            } @else {
                p #chain-status.error role="alert" { "Chain BROKEN: " (report.problems_found)
                    " problem(s) in " (report.rows) " row(s) checked (" (span) ")"
                    @if report.problems_unlisted() > 0 {
                        "; the first " (report.problems.len()) " are listed"
                    }
                    "; the first is where the tampering starts." }
                ol #chain-problems { @for p in &report.problems { li { (p.to_string()) } } }
                @if report.problems_unlisted() > 0 {
                    p { "... and " (report.problems_unlisted()) " more problem(s) not listed." }
                }
            }
            @if report.older_rows > 0 {
                p { (report.older_rows) " row(s) written before the chain existed are not covered." }
            }
        },
    )
}

/// The stylesheet and the script, embedded.
pub(crate) const CSS: &str = include_str!("../assets/admin.css");
pub(crate) const JS: &str = include_str!("../assets/live.js");

/// An SSE event's data: a row's HTML on one line (a newline would end the data field).
pub(crate) fn one_line(markup: Markup) -> String {
    markup.into_string().replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    /// A fixed time: 2026-12-06 10:00:00 UTC, plus `ms`.
    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_796_551_200) + Duration::from_millis(ms)
    }

    /// The frame of the views: a CSRF token and the replica.
    fn frame() -> Frame<'static> {
        static REPLICA: std::sync::LazyLock<Replica> =
            std::sync::LazyLock::new(|| Replica::new("q1.internal", 4242, "10.0.0.11:8080"));
        Frame {
            csrf: "CSRF",
            replica: Some(&REPLICA),
        }
    }

    /// Pretty-printed enough to review: one tag per line where the markup has none.
    fn lines(markup: Markup) -> String {
        markup.into_string().replace("><", ">\n<")
    }

    #[test]
    fn the_catalog_view() {
        let rows = vec![
            ToolRow {
                name: "tool_search".into(),
                family: "core".into(),
                status: "approved".into(),
                enabled: true,
                modes: "chat, agentic, delegate, plan".into(),
                calls_30d: 12,
                calls_total: 40,
                ..ToolRow::default()
            },
            ToolRow {
                name: "everything__echo".into(),
                family: "mcp:everything".into(),
                server: Some("everything".into()),
                status: "approved".into(),
                enabled: true,
                modes: "chat, agentic, delegate".into(),
                calls_30d: 3,
                calls_total: 3,
                last_error: Some("upstream `everything` is down <reconnecting>".into()),
                ..ToolRow::default()
            },
            ToolRow {
                name: "word_count".into(),
                family: "custom".into(),
                status: "draft".into(),
                enabled: false,
                modes: "none until approved".into(),
                ..ToolRow::default()
            },
        ];
        insta::assert_snapshot!("catalog", lines(catalog(&rows, "", Some(at(0)), &frame())));
        let mut hits = rows[1..2].to_vec();
        hits[0].score = Some(2.5);
        insta::assert_snapshot!(
            "catalog_search",
            lines(catalog(&hits, "echo \"x\"", None, &frame()))
        );
    }

    #[test]
    fn the_log_view() {
        let rows = vec![
            CallRow {
                call_id: "c-2".into(),
                at: at(1500),
                tool: "everything__echo".into(),
                principal: Some("ci".into()),
                session: Some("s-1".into()),
                outcome: "err".into(),
                error: Some("the upstream timed out".into()),
                queued: Duration::from_micros(40),
                took: Duration::from_millis(30_000),
                row: 2,
            },
            CallRow {
                call_id: "c-1".into(),
                at: at(0),
                tool: "tool_search".into(),
                principal: None,
                session: Some("s-1".into()),
                outcome: "ok".into(),
                error: None,
                queued: Duration::ZERO,
                took: Duration::from_micros(850),
                row: 1,
            },
        ];
        let first = LogQuery::default();
        insta::assert_snapshot!(
            "log",
            lines(log(
                &rows,
                &first,
                Some(time::row_cursor(at(0), 1)),
                &frame()
            ))
        );
        let filtered = LogQuery {
            tool: "everything__echo".into(),
            outcome: "err".into(),
            within: "1h".into(),
            before: Some("1796551300000000.9".into()),
            ..LogQuery::default()
        };
        insta::assert_snapshot!(
            "log_filtered",
            lines(log(&rows[..1], &filtered, None, &frame()))
        );
    }

    #[test]
    fn the_call_view_names_its_trace_and_the_calls_made_from_it() {
        let row = CallRow {
            call_id: "c-1".into(),
            at: at(0),
            tool: "relay".into(),
            principal: Some("ci".into()),
            session: Some("s-1".into()),
            outcome: "ok".into(),
            error: None,
            queued: Duration::ZERO,
            took: Duration::from_millis(12),
            row: 1,
        };
        let child = CallRow {
            call_id: "c-2".into(),
            at: at(1),
            tool: "everything__echo".into(),
            took: Duration::from_millis(3),
            ..row.clone()
        };
        let detail = CallDetail {
            row: &row,
            parent: None,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            children: std::slice::from_ref(&child),
            input: "{}",
            reasoning: None,
            output: "ok",
        };
        insta::assert_snapshot!("call", lines(call(&detail, &frame())));
        let untraced = CallDetail {
            trace_id: None,
            children: &[],
            ..detail
        };
        let text = call(&untraced, &frame()).into_string();
        assert!(text.contains("traces are not exported"), "{text}");
        assert!(!text.contains("Calls made from this call"), "{text}");
    }

    fn budgets_now() -> Budgets {
        Budgets {
            round_tools: 16,
            round_bytes: 24_000,
            set_tools: 12,
            set_bytes: 16_000,
            idle_rounds: 8,
            max_surface: 64,
        }
    }

    #[test]
    fn the_sessions_views() {
        let row = SessionRow {
            key: "mcp:5f2a".into(),
            principal: Some("ci".into()),
            protocol: Some("2025-06-18 (session era)".into()),
            mode: "chat".into(),
            round: 4,
            set: vec![("everything__echo".into(), 412, 0)],
            set_bytes: 412,
            listed: vec![
                ("tool_search".into(), "system".into(), 1210),
                ("everything__echo".into(), "working_set".into(), 498),
            ],
            listed_bytes: 1708,
            dropped: vec![(
                "everything__add".into(),
                "floor".into(),
                "not_allowed".into(),
            )],
            error: None,
        };
        let anonymous = SessionRow {
            key: "anonymous".into(),
            mode: "plan".into(),
            ..SessionRow::default()
        };
        let b = budgets_now();
        insta::assert_snapshot!(
            "sessions",
            lines(sessions(
                &[anonymous, row.clone()],
                &["tool_search".into(), "describe_tool".into()],
                &b,
                &frame()
            ))
        );
        insta::assert_snapshot!("session", lines(session(&row, &b, &frame())));
    }

    #[test]
    fn the_upstreams_view() {
        let rows = vec![
            UpstreamRow::new("everything", "connected")
                .with_counts(11, 2, 1, 40)
                .with_last_connect(at(0)),
            UpstreamRow::new("github", "disabled")
                .disabled()
                .with_why("disabled by an operator: enable it to connect it again"),
        ];
        let latency = std::collections::HashMap::from([(
            "everything".to_owned(),
            Latency {
                last: Duration::from_micros(850),
                median: Duration::from_millis(3),
                calls: 40,
            },
        )]);
        insta::assert_snapshot!(
            "upstreams",
            lines(upstreams(
                &rows,
                &latency,
                Some("`github` disabled"),
                &frame()
            ))
        );
    }

    #[test]
    fn the_config_view_with_check_findings() {
        let found = vec![
            quiver_contract::Finding::error(
                "tool fetch: [no description] say what the tool does and when to use it",
            ),
            quiver_contract::Finding::note("server slow: [slow start] it took 4 s to connect"),
        ];
        insta::assert_snapshot!(
            "config",
            lines(config(
                "[store]\ndurability = \"strict\"\n",
                None,
                Some(&found),
                &frame()
            ))
        );
    }

    /// A broken chain's page says how many problems there are in all and how many rows were
    /// walked, not only the ones it lists.
    #[test]
    fn the_chain_view_counts_the_problems_it_does_not_list() {
        use quiver_registry::chain::{MAX_PROBLEMS, Tamper, VerifyReport};
        let mut report = VerifyReport::default();
        report.rows = 5446;
        report.span = Some((1, 5446));
        report.problems = (1..=MAX_PROBLEMS as u64)
            .map(|seq| Tamper::Removed { from: seq, to: seq })
            .collect();
        report.problems_found = 2000;
        let text = chain(&report, &frame()).into_string();
        assert!(
            text.contains(
                "Chain BROKEN: 2000 problem(s) in 5446 row(s) checked (rows 1 to 5446); the first 50 are listed; the first is where the tampering starts."
            ),
            "{text}"
        );
        assert!(
            text.contains("... and 1950 more problem(s) not listed."),
            "{text}"
        );
    }
}
