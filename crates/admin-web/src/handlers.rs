//! The routes: login and logout, one GET per view, one POST per action. A view without a
//! live login redirects to the login form; an action without one, or whose form's CSRF
//! token is not the session's, is refused (403) and does nothing.
//!
//! Over 800 lines: every route of the page is here, so that the login and CSRF check each
//! one makes can be read side by side.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use axum::{
    Form, Router,
    extract::{Path, Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{
        IntoResponse, Redirect, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use maud::Markup;
use quiver_contract::{Capabilities, Mode, RenderOptions, lint_spec, render};
use quiver_registry::{
    Family,
    custom::PendingVersion,
    store::{CallFilter, LoggedCall, ToolDefinition},
};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    AdminPage,
    login::{self, Login, Logins},
    time,
    views::{self, CallRow, CustomRow, Frame, LogQuery, ToolRow},
};

/// Rows on one page of the call log.
const PAGE: usize = 50;

/// The failed calls read for the catalog's "last error" column.
const RECENT_ERRORS: usize = 200;

/// How often the live call log asks the store for new rows.
const LIVE_POLL: Duration = Duration::from_millis(500);

/// The most rows one poll of the live call log sends.
const LIVE_BATCH: usize = 100;

/// The most rows one export gives (the next ones: the same export with `before` set to the
/// last row's cursor, `AT_US.ROW`).
const EXPORT_ROWS: usize = 10_000;

/// How many hits a catalog search shows.
const SEARCH_HITS: usize = 50;

struct Admin {
    page: AdminPage,
    logins: Logins,
}

type St = State<Arc<Admin>>;

pub(crate) fn router(page: AdminPage) -> Router {
    let admin = Arc::new(Admin {
        logins: Logins(page.logins.clone()),
        page,
    });
    Router::new()
        .route("/admin", get(home))
        .route("/admin/", get(home))
        .route("/admin/login", get(login_form).post(log_in))
        .route("/admin/logout", post(log_out))
        .route("/admin/catalog", get(catalog))
        .route("/admin/tools/{name}", get(tool))
        .route("/admin/upstreams", get(upstreams))
        .route("/admin/upstreams/{name}/reconnect", post(reconnect))
        .route("/admin/upstreams/{name}/disable", post(disable))
        .route("/admin/upstreams/{name}/enable", post(enable))
        .route("/admin/sessions", get(sessions))
        .route("/admin/sessions/{key}", get(session))
        .route("/admin/log", get(log))
        .route("/admin/log/stream", get(stream))
        .route("/admin/log/export", get(export))
        .route("/admin/log/chain", get(chain))
        .route("/admin/calls/{id}", get(call))
        .route("/admin/custom", get(custom))
        .route("/admin/custom/{name}/approve", post(approve))
        .route("/admin/custom/{name}/reject", post(reject))
        .route("/admin/config", get(config))
        .route("/admin/assets/admin.css", get(css))
        .route("/admin/assets/live.js", get(js))
        .with_state(admin)
}

/// An HTML answer, never cached or framed; scripts and styles from this origin only.
fn html(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, axum::response::Html(markup.into_string())).into_response();
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

fn ok(markup: Markup) -> Response {
    html(StatusCode::OK, markup)
}

impl Admin {
    /// The frame of `login`'s pages: its CSRF token and this replica.
    fn frame<'a>(&'a self, login: &'a Login) -> Frame<'a> {
        Frame {
            csrf: &login.csrf,
            replica: self.page.replica.as_ref(),
        }
    }

    /// The request's login, if it is live and its token still the one in force.
    async fn login(&self, headers: &HeaderMap) -> Option<(String, Login)> {
        let (id, login) = self.logins.find(headers).await?;
        if (self.page.token)(&login.fingerprint) {
            Some((id, login))
        } else {
            // The token was rotated (a reload): this login is over.
            self.logins.close(&id).await;
            None
        }
    }

    /// The login of a view, or the redirect to the login form.
    async fn viewer(&self, headers: &HeaderMap) -> Result<Login, Box<Response>> {
        self.login(headers)
            .await
            .map(|(_, l)| l)
            .ok_or_else(|| Box::new(Redirect::to("/admin/login").into_response()))
    }

    /// The login of an action whose form carries `csrf`, or the refusal.
    async fn actor(
        &self,
        headers: &HeaderMap,
        csrf: &str,
    ) -> Result<(String, Login), Box<Response>> {
        let Some((id, login)) = self.login(headers).await else {
            return Err(Box::new(html(
                StatusCode::FORBIDDEN,
                views::message(
                    "Not logged in",
                    "This action needs a login: log in at /admin/login and try again.",
                    None,
                ),
            )));
        };
        if !login::same(csrf, &login.csrf) {
            tracing::warn!(target: "quiver::admin", "admin page: an action with a wrong CSRF token was refused");
            return Err(Box::new(html(
                StatusCode::FORBIDDEN,
                views::message(
                    "Refused",
                    "The form's CSRF token is not this session's: the action was not taken. Reload the page and try again.",
                    Some(&self.frame(&login)),
                ),
            )));
        }
        Ok((id, login))
    }
}

async fn home() -> Redirect {
    Redirect::to("/admin/catalog")
}

async fn login_form(State(admin): St, headers: HeaderMap) -> Response {
    if admin.login(&headers).await.is_some() {
        return Redirect::to("/admin/catalog").into_response();
    }
    ok(views::login(None))
}

#[derive(Deserialize)]
struct TokenForm {
    #[serde(default)]
    token: String,
}

async fn log_in(State(admin): St, Form(form): Form<TokenForm>) -> Response {
    if !(admin.page.token)(&quiver_contract::secret_fingerprint(&form.token)) {
        tracing::warn!(target: "quiver::admin", "admin page: a login with a wrong token was refused");
        return html(
            StatusCode::UNAUTHORIZED,
            views::login(Some(
                "That is not the admin token. Give the value of `[admin] token` in quiver.toml.",
            )),
        );
    }
    let id = match admin.logins.open(&form.token).await {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(target: "quiver::admin", "admin page: a login could not be kept ({e})");
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                views::login(Some(&format!(
                    "The login could not be kept: {e}. Try again in a moment."
                ))),
            );
        }
    };
    tracing::info!(target: "quiver::admin", "admin page: logged in");
    let mut response = Redirect::to("/admin/catalog").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&login::set_cookie(&id)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

async fn log_out(State(admin): St, headers: HeaderMap, Form(form): Form<ActionForm>) -> Response {
    let (id, _) = match admin.actor(&headers, &form.csrf).await {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    admin.logins.close(&id).await;
    tracing::info!(target: "quiver::admin", "admin page: logged out");
    let mut response = Redirect::to("/admin/login").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&login::clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// A store failure shown to the operator, with its cause.
fn failed(what: &str, e: impl std::fmt::Display, frame: &Frame<'_>) -> Response {
    tracing::warn!(target: "quiver::admin", "admin page: {what} failed: {e}");
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        views::message("Unavailable", &format!("{what} failed: {e}"), Some(frame)),
    )
}

/// The modes that list a tool, for people: `chat, agentic, delegate, plan`, or `none`.
fn modes_text(modes: &[Mode]) -> String {
    if modes.is_empty() {
        return "none".to_owned();
    }
    modes
        .iter()
        .map(|m| m.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Deserialize)]
struct CatalogQuery {
    #[serde(default)]
    q: String,
}

/// The catalog's rows, each with its usage and last error, and when the usage was counted
/// (`None`: not counted yet).
async fn tool_rows(
    page: &AdminPage,
) -> Result<(Vec<ToolRow>, Option<std::time::SystemTime>), String> {
    let usage = page.usage_cache.get(&page.usage).await;
    let mut errors: HashMap<String, String> = HashMap::new();
    for call in page
        .calls
        .recent_calls(CallFilter::recent(RECENT_ERRORS).kind("err"))
        .await
        .map_err(|e| e.to_string())?
    {
        if let Some(e) = call.error {
            errors.entry(call.tool_name).or_insert(e);
        }
    }
    let mut rows: Vec<ToolRow> = page
        .surface
        .catalog()
        .tools()
        .iter()
        .map(|entry| {
            let spec = &entry.spec;
            let (calls_30d, calls_total) = usage
                .as_ref()
                .and_then(|u| u.counts.get(&spec.name).copied())
                .unwrap_or_default();
            ToolRow {
                name: spec.name.clone(),
                family: entry.family.to_string(),
                server: Family::mcp_server(&entry.family).map(str::to_owned),
                status: spec.lifecycle.as_str().to_owned(),
                enabled: spec.enabled,
                modes: modes_text(&page.surface.listing_modes(&spec.name)),
                calls_30d,
                calls_total,
                last_error: errors.get(&spec.name).cloned(),
                score: None,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((rows, usage.map(|u| u.at)))
}

async fn catalog(State(admin): St, headers: HeaderMap, Query(q): Query<CatalogQuery>) -> Response {
    let login = match admin.viewer(&headers).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let (rows, counted) = match tool_rows(&admin.page).await {
        Ok(rows) => rows,
        Err(e) => return failed("reading the call log", e, &admin.frame(&login)),
    };
    let query = q.q.trim();
    if query.is_empty() {
        return ok(views::catalog(&rows, "", counted, &admin.frame(&login)));
    }
    // The engine `tool_search` runs, over every tool an unrestricted caller would find.
    let hits = admin
        .page
        .surface
        .search(query, SEARCH_HITS, Mode::default(), &Capabilities::all());
    let by_name: HashMap<&str, &ToolRow> = rows.iter().map(|r| (r.name.as_str(), r)).collect();
    let found: Vec<ToolRow> = hits
        .iter()
        .filter_map(|hit| {
            by_name.get(hit.name.as_str()).map(|row| ToolRow {
                score: Some(hit.score),
                ..(*row).clone()
            })
        })
        .collect();
    ok(views::catalog(&found, query, counted, &admin.frame(&login)))
}

/// A custom tool as `quiver custom show` prints it (for one not in the catalog: a draft).
fn custom_shown(def: &ToolDefinition) -> Value {
    serde_json::json!({
        "name": def.name,
        "version": def.version,
        "status": def.status.as_str(),
        "enabled": def.enabled,
        "description": def.description,
        "input_schema": def.input_schema,
        "source": def.implementation,
        "test_cases": def.test_cases,
        "test_results": def.test_results,
        "rejection_reason": def.rejection_reason,
        "pending": def.pending,
    })
}

async fn tool(State(admin): St, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let login = match admin.viewer(&headers).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let (rows, _) = match tool_rows(&admin.page).await {
        Ok(rows) => rows,
        Err(e) => return failed("reading the call log", e, &admin.frame(&login)),
    };
    if let Some(entry) = admin.page.surface.catalog().lookup(&name)
        && let Some(row) = rows.iter().find(|r| r.name == name)
    {
        let definition = serde_json::to_string_pretty(&entry.spec).unwrap_or_default();
        let findings: Vec<(String, String, String)> = lint_spec(&entry.spec)
            .into_iter()
            .map(|f| (f.rule.to_owned(), f.path, f.message))
            .collect();
        return ok(views::tool(
            row,
            &definition,
            &findings,
            &admin.frame(&login),
        ));
    }
    // Not served: a custom tool under review, or rejected.
    if let Ok(def) = admin.page.custom.show(&name).await {
        let row = ToolRow {
            name: def.name.clone(),
            family: "custom".into(),
            status: def.status.as_str().to_owned(),
            enabled: def.enabled,
            modes: "none until approved".into(),
            ..ToolRow::default()
        };
        let definition = serde_json::to_string_pretty(&custom_shown(&def)).unwrap_or_default();
        return ok(views::tool(&row, &definition, &[], &admin.frame(&login)));
    }
    html(
        StatusCode::NOT_FOUND,
        views::message(
            "No such tool",
            &format!("No tool named `{name}` is in the catalog or among the custom tools."),
            Some(&admin.frame(&login)),
        ),
    )
}

/// The calls read for the upstreams' latency.
const LATENCY_CALLS: usize = 500;

/// Each upstream server's call latency over the newest [`LATENCY_CALLS`] calls in the log
/// (its tools' calls, found through the catalog's families).
async fn latency(page: &AdminPage) -> HashMap<String, views::Latency> {
    let Ok(calls) = page
        .calls
        .recent_calls(CallFilter::recent(LATENCY_CALLS))
        .await
    else {
        return HashMap::new();
    };
    let catalog = page.surface.catalog();
    let mut by_server: HashMap<String, Vec<std::time::Duration>> = HashMap::new();
    for call in &calls {
        if let Some(entry) = catalog.lookup(&call.tool_name)
            && let Some(server) = Family::mcp_server(&entry.family)
        {
            by_server
                .entry(server.to_owned())
                .or_default()
                .push(call.took);
        }
    }
    by_server
        .into_iter()
        .map(|(server, took)| {
            let last = took[0];
            let mut sorted = took.clone();
            sorted.sort_unstable();
            let median = sorted[sorted.len() / 2];
            (
                server,
                views::Latency {
                    last,
                    median,
                    calls: took.len(),
                },
            )
        })
        .collect()
}

/// The upstreams view (or its table, for the live region), with `notice` above it.
async fn upstreams_page(
    admin: &Admin,
    login: &Login,
    status: StatusCode,
    notice: Option<&str>,
    part: bool,
) -> Response {
    let rows = admin.page.upstreams.upstreams();
    let latency = latency(&admin.page).await;
    if part {
        return html(
            status,
            views::upstreams_table(&rows, &latency, &admin.frame(login)),
        );
    }
    html(
        status,
        views::upstreams(&rows, &latency, notice, &admin.frame(login)),
    )
}

async fn upstreams(State(admin): St, headers: HeaderMap, Query(q): Query<PartQuery>) -> Response {
    let part = q.part == "table";
    let login = match if part {
        part_viewer(&admin, &headers).await
    } else {
        admin.viewer(&headers).await
    } {
        Ok(l) => l,
        Err(r) => return *r,
    };
    upstreams_page(&admin, &login, StatusCode::OK, None, part).await
}

/// What an upstream action does.
#[derive(Clone, Copy)]
enum UpstreamAction {
    Reconnect,
    Disable,
    Enable,
}

impl UpstreamAction {
    fn as_str(self) -> &'static str {
        match self {
            UpstreamAction::Reconnect => "reconnect",
            UpstreamAction::Disable => "disable",
            UpstreamAction::Enable => "enable",
        }
    }
}

/// An upstream action, taken through the host's port and logged (target `quiver::admin`).
async fn upstream_action(
    admin: &Admin,
    headers: &HeaderMap,
    name: &str,
    form: &ActionForm,
    action: UpstreamAction,
) -> Response {
    let login = match admin.actor(headers, &form.csrf).await {
        Ok((_, l)) => l,
        Err(r) => return *r,
    };
    let upstreams = &admin.page.upstreams;
    let done = match action {
        UpstreamAction::Reconnect => upstreams.reconnect(name).await,
        UpstreamAction::Disable => upstreams.set_enabled(name, false).await,
        UpstreamAction::Enable => upstreams.set_enabled(name, true).await,
    };
    let (status, notice) = match done {
        Ok(done) => {
            tracing::info!(target: "quiver::admin", action = action.as_str(), upstream = %name, "admin page: {done}");
            (StatusCode::OK, done)
        }
        Err(why) => {
            tracing::warn!(target: "quiver::admin", action = action.as_str(), upstream = %name, "admin page: {} refused: {why}", action.as_str());
            (StatusCode::NOT_FOUND, why)
        }
    };
    upstreams_page(admin, &login, status, Some(&notice), false).await
}

async fn reconnect(
    State(admin): St,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    upstream_action(&admin, &headers, &name, &form, UpstreamAction::Reconnect).await
}

async fn disable(
    State(admin): St,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    upstream_action(&admin, &headers, &name, &form, UpstreamAction::Disable).await
}

async fn enable(
    State(admin): St,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    upstream_action(&admin, &headers, &name, &form, UpstreamAction::Enable).await
}

#[derive(Deserialize)]
struct PartQuery {
    /// A live region's fragment instead of the whole page (`table`, `detail`, `jobs`).
    #[serde(default)]
    part: String,
}

/// The login of a live region's fetch: its fragment, or a bare refusal (no login page to
/// paste into the region).
async fn part_viewer(admin: &Admin, headers: &HeaderMap) -> Result<Login, Box<Response>> {
    admin.login(headers).await.map(|(_, l)| l).ok_or_else(|| {
        Box::new((StatusCode::FORBIDDEN, "log in at /admin/login first").into_response())
    })
}

/// The surface's budgets now.
fn budgets(surface: &quiver_surface::Surface) -> views::Budgets {
    let config = surface.config();
    views::Budgets {
        round_tools: config.round.max_definitions,
        round_bytes: config.round.max_bytes,
        set_tools: config.working_set.max_tools,
        set_bytes: config.working_set.max_bytes,
        idle_rounds: config.idle_rounds,
        max_surface: config.max_surface,
    }
}

/// The session `key` as the page shows it, `None` when the surface does not hold it.
fn session_row(surface: &quiver_surface::Surface, key: &str) -> Option<views::SessionRow> {
    let mut row = views::SessionRow {
        key: key.to_owned(),
        ..views::SessionRow::default()
    };
    match surface.session_view(key) {
        Ok(None) => return None,
        Ok(Some(view)) => {
            row.mode = view.mode.as_str().to_owned();
            row.round = view.round;
            if let Some(client) = &view.client {
                row.principal.clone_from(&client.principal);
                row.protocol.clone_from(&client.protocol);
            }
            row.set = view
                .working_set
                .iter()
                .map(|s| (s.name.clone(), s.bytes, s.idle_rounds))
                .collect();
            row.set_bytes = view.working_set_bytes;
            row.listed = view
                .surface
                .tools
                .iter()
                .map(|t| (t.spec.name.clone(), t.reason.as_str().to_owned(), t.bytes))
                .collect();
            row.listed_bytes = view.surface.bytes;
            row.dropped = view
                .surface
                .dropped
                .iter()
                .map(|d| {
                    (
                        d.name.clone(),
                        d.reason.as_str().to_owned(),
                        d.why.as_str().to_owned(),
                    )
                })
                .collect();
        }
        Err(e) => row.error = Some(e.to_string()),
    }
    Some(row)
}

async fn sessions(State(admin): St, headers: HeaderMap, Query(q): Query<PartQuery>) -> Response {
    let part = q.part == "table";
    let login = match if part {
        part_viewer(&admin, &headers).await
    } else {
        admin.viewer(&headers).await
    } {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let surface = &admin.page.surface;
    let mut keys = surface.session_keys();
    keys.sort();
    let rows: Vec<views::SessionRow> = keys
        .iter()
        .filter_map(|k| session_row(surface, k))
        .collect();
    let b = budgets(surface);
    if part {
        return ok(views::sessions_table(&rows, &b));
    }
    let floor: Vec<String> = surface
        .floor()
        .entries
        .iter()
        .map(|e| e.name.clone())
        .collect();
    ok(views::sessions(&rows, &floor, &b, &admin.frame(&login)))
}

async fn session(
    State(admin): St,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<PartQuery>,
) -> Response {
    let part = q.part == "detail";
    let login = match if part {
        part_viewer(&admin, &headers).await
    } else {
        admin.viewer(&headers).await
    } {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let surface = &admin.page.surface;
    let Some(row) = session_row(surface, &key) else {
        let text = format!(
            "The surface holds no session `{key}` now: it ended, or was dropped from memory (its working set stays in the store and comes back with its next request)."
        );
        if part {
            return (StatusCode::NOT_FOUND, text).into_response();
        }
        return html(
            StatusCode::NOT_FOUND,
            views::message("No such session", &text, Some(&admin.frame(&login))),
        );
    };
    let b = budgets(surface);
    if part {
        ok(views::session_detail(&row, &b))
    } else {
        ok(views::session(&row, &b, &admin.frame(&login)))
    }
}

fn call_row(call: &LoggedCall) -> CallRow {
    CallRow {
        call_id: call.call_id.clone(),
        at: call.at,
        tool: call.tool_name.clone(),
        principal: call.principal.clone(),
        session: call.session.clone(),
        outcome: call.kind.clone(),
        error: call.error.clone(),
        queued: call.queued,
        took: call.took,
        row: call.row,
    }
}

/// The store filter of the log view's query (the cursor and the limit aside).
fn filter_of(q: &LogQuery) -> Result<CallFilter, String> {
    let mut f = CallFilter::recent(PAGE);
    for (value, set) in [
        (
            &q.tool,
            CallFilter::tool as fn(CallFilter, String) -> CallFilter,
        ),
        (&q.session, CallFilter::session),
        (&q.principal, CallFilter::principal),
    ] {
        let value = value.trim();
        if !value.is_empty() {
            f = set(f, value.to_owned());
        }
    }
    match q.outcome.as_str() {
        "" => {}
        "ok" | "hint" | "err" => f = f.kind(q.outcome.clone()),
        other => {
            return Err(format!(
                "`{other}` is not an outcome: choose ok, hint or err (or any)"
            ));
        }
    }
    if !q.within.is_empty() {
        let Some((_, _, window)) = views::WINDOWS.iter().find(|(v, _, _)| *v == q.within) else {
            return Err(format!(
                "`{}` is not a time window: choose 15m, 1h, 24h or 7d (or any time)",
                q.within
            ));
        };
        f = f.after(std::time::SystemTime::now() - *window);
    }
    Ok(f)
}

async fn log(State(admin): St, headers: HeaderMap, Query(q): Query<LogQuery>) -> Response {
    let login = match admin.viewer(&headers).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let mut filter = match filter_of(&q) {
        Ok(f) => f,
        Err(why) => {
            return html(
                StatusCode::BAD_REQUEST,
                views::message("Bad filter", &why, Some(&admin.frame(&login))),
            );
        }
    };
    if let Some(before) = &q.before {
        filter = match time::parse_cursor(before) {
            Ok((at, Some(row))) => filter.before_row(at, row),
            Ok((at, None)) => filter.before(at),
            Err(why) => {
                return html(
                    StatusCode::BAD_REQUEST,
                    views::message("Bad filter", &why, Some(&admin.frame(&login))),
                );
            }
        };
    }
    // One more than a page: whether there are older rows.
    filter.limit = PAGE + 1;
    let calls = match admin.page.calls.recent_calls(filter).await {
        Ok(calls) => calls,
        Err(e) => return failed("reading the call log", e, &admin.frame(&login)),
    };
    let rows: Vec<CallRow> = calls.iter().take(PAGE).map(call_row).collect();
    let older = (calls.len() > PAGE)
        .then(|| rows.last().map(|r| time::row_cursor(r.at, r.row)))
        .flatten();
    ok(views::log(&rows, &q, older, &admin.frame(&login)))
}

/// The log's hash chain walked as `quiver log --verify` walks it: whole (with its head, to
/// record elsewhere), or what is broken, first problem first.
async fn chain(State(admin): St, headers: HeaderMap) -> Response {
    let login = match admin.viewer(&headers).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    match quiver_registry::chain::verify(&*admin.page.calls, None).await {
        Ok(report) => {
            tracing::info!(target: "quiver::admin", action = "verify_chain", rows = report.rows, intact = report.intact(), "admin page: the log's hash chain verified");
            ok(views::chain(&report, &admin.frame(&login)))
        }
        Err(e) => failed("verifying the log's hash chain", e, &admin.frame(&login)),
    }
}

/// A row of the export: what `quiver log --json` names, times in microseconds.
fn exported(call: &LoggedCall) -> Value {
    serde_json::json!({
        "call_id": call.call_id,
        "at_us": u64::try_from(time::cursor(call.at)).unwrap_or(u64::MAX),
        "row": call.row,
        "tool": call.tool_name,
        "principal": call.principal,
        "session": call.session,
        "tenant": call.tenant,
        "parent": call.parent_call_id,
        "trace_id": call.trace_id,
        "outcome": call.kind,
        "error": call.error,
        "input": call.input,
        "reasoning": call.reasoning,
        "output_summary": call.output_summary,
        "queued_us": u64::try_from(call.queued.as_micros()).unwrap_or(u64::MAX),
        "took_us": u64::try_from(call.took.as_micros()).unwrap_or(u64::MAX),
    })
}

/// The filtered log as JSON Lines, newest first, at most [`EXPORT_ROWS`] rows (`before`
/// pages on).
async fn export(State(admin): St, headers: HeaderMap, Query(q): Query<LogQuery>) -> Response {
    if admin.login(&headers).await.is_none() {
        return (StatusCode::FORBIDDEN, "log in at /admin/login first").into_response();
    }
    let mut filter = match filter_of(&q) {
        Ok(f) => f,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    if let Some(before) = &q.before {
        filter = match time::parse_cursor(before) {
            Ok((at, Some(row))) => filter.before_row(at, row),
            Ok((at, None)) => filter.before(at),
            Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
        };
    }
    filter.limit = EXPORT_ROWS;
    let calls = match admin.page.calls.recent_calls(filter).await {
        Ok(calls) => calls,
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("reading the call log failed: {e}"),
            )
                .into_response();
        }
    };
    tracing::info!(target: "quiver::admin", action = "export", rows = calls.len(), "admin page: call log exported");
    let mut body = String::new();
    for call in &calls {
        body.push_str(&exported(call).to_string());
        body.push('\n');
    }
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"quiver-calls.jsonl\"",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

#[derive(Deserialize)]
struct StreamQuery {
    #[serde(flatten)]
    filters: LogQuery,
    /// Rows after this cursor (`MICROS.ROW`, see `time::row_cursor`) are new.
    #[serde(default)]
    after: String,
}

/// New calls as they are logged: an SSE event `call` per row (its HTML), oldest first,
/// each with its cursor as the event id, so a reconnecting browser (`Last-Event-ID`)
/// resumes where it was.
async fn stream(State(admin): St, headers: HeaderMap, Query(q): Query<StreamQuery>) -> Response {
    if admin.login(&headers).await.is_none() {
        return StatusCode::FORBIDDEN.into_response();
    }
    let filter = match filter_of(&q.filters) {
        Ok(f) => f,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let resumed = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| time::parse_cursor(v).ok());
    let mut after = match resumed {
        Some(cursor) => cursor,
        None if q.after.is_empty() => (std::time::UNIX_EPOCH, None),
        None => match time::parse_cursor(&q.after) {
            Ok(cursor) => cursor,
            Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
        },
    };
    let calls = admin.page.calls.clone();
    let stop = admin.page.stop.clone();
    let events = async_stream(move |tx| async move {
        let mut tick = tokio::time::interval(LIVE_POLL);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let mut f = match after {
                (at, Some(row)) => filter.clone().after_row(at, row),
                (at, None) => filter.clone().after(at),
            };
            f.limit = LIVE_BATCH;
            let Ok(mut rows) = calls.recent_calls(f).await else {
                continue;
            };
            rows.reverse();
            for call in rows {
                after = (call.at, Some(call.row));
                let event = Event::default()
                    .event("call")
                    .id(time::row_cursor(call.at, call.row))
                    .data(views::one_line(views::call_row(&call_row(&call))));
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream of what `body` sends, ending when it returns or the receiver is dropped.
fn async_stream<F, Fut>(
    body: F,
) -> impl futures::Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Event, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(body(tx));
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn call(State(admin): St, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let login = match admin.viewer(&headers).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let found = match admin
        .page
        .calls
        .recent_calls(CallFilter::recent(1).call_id(id.clone()).with_output())
        .await
    {
        Ok(found) => found,
        Err(e) => return failed("reading the call log", e, &admin.frame(&login)),
    };
    let Some(call) = found.first() else {
        return html(
            StatusCode::NOT_FOUND,
            views::message(
                "No such call",
                &format!(
                    "No call `{id}` is in the execution log (it may have been purged by the retention setting)."
                ),
                Some(&admin.frame(&login)),
            ),
        );
    };
    let row = call_row(call);
    // The calls it made, oldest first (a custom tool's budget caps them; the page shows
    // the first hundred).
    let children = match admin
        .page
        .calls
        .recent_calls(CallFilter::recent(100).parent(id.clone()))
        .await
    {
        Ok(found) => found.iter().rev().map(call_row).collect::<Vec<_>>(),
        Err(e) => return failed("reading the call log", e, &admin.frame(&login)),
    };
    let input = serde_json::to_string_pretty(&call.input).unwrap_or_default();
    let output = call
        .output
        .as_ref()
        .map(|env| render(env, &RenderOptions::default()))
        .unwrap_or_else(|| call.output_summary.clone());
    ok(views::call(
        &views::CallDetail {
            row: &row,
            parent: call.parent_call_id.as_deref(),
            trace_id: call.trace_id.as_deref(),
            children: &children,
            input: &input,
            reasoning: call.reasoning.as_deref(),
            output: &output,
        },
        &admin.frame(&login),
    ))
}

/// The custom tools as the page lists them, those waiting for review first.
fn custom_rows(defs: &[ToolDefinition]) -> Vec<CustomRow> {
    let mut rows: Vec<CustomRow> = defs
        .iter()
        .map(|def| {
            let pending: Option<PendingVersion> = def
                .pending
                .as_ref()
                .and_then(|p| serde_json::from_value(p.clone()).ok());
            let tests = match &def.test_results {
                None => "not run".to_owned(),
                Some(r) => format!(
                    "{} {}",
                    r.get("kind").and_then(Value::as_str).unwrap_or("audit"),
                    if r.get("passed").and_then(Value::as_bool) == Some(true) {
                        "passed"
                    } else {
                        "failed"
                    }
                ),
            };
            CustomRow {
                name: def.name.clone(),
                version: def.version,
                status: def.status.as_str().to_owned(),
                enabled: def.enabled,
                tests,
                pending: pending.map(|p| format!("v{} {}", p.version, p.status)),
                rejected: def.rejection_reason.clone(),
            }
        })
        .collect();
    rows.sort_by_key(|r| {
        (
            r.status == "approved" && r.pending.is_none(),
            r.name.clone(),
        )
    });
    rows
}

/// The custom-tool jobs, newest first.
async fn job_rows(admin: &Admin) -> Result<Vec<views::JobRow>, String> {
    match admin.page.custom.jobs(None).await {
        Ok(jobs) => Ok(jobs
            .into_iter()
            .map(|j| {
                (
                    j.id,
                    j.tool_name,
                    j.job_type.as_str().to_owned(),
                    j.status.as_str().to_owned(),
                    j.progress_pct,
                )
            })
            .collect()),
        Err(e) => Err(e.to_string()),
    }
}

async fn custom_page(
    admin: &Admin,
    login: &Login,
    status: StatusCode,
    notice: Option<&str>,
) -> Response {
    let defs = match admin.page.custom.list().await {
        Ok(defs) => defs,
        Err(e) => return failed("reading the custom tools", e, &admin.frame(login)),
    };
    let jobs = match job_rows(admin).await {
        Ok(jobs) => jobs,
        Err(e) => return failed("reading the custom-tool jobs", e, &admin.frame(login)),
    };
    html(
        status,
        views::custom(&custom_rows(&defs), &jobs, notice, &admin.frame(login)),
    )
}

async fn custom(State(admin): St, headers: HeaderMap, Query(q): Query<PartQuery>) -> Response {
    if q.part == "jobs" {
        if let Err(r) = part_viewer(&admin, &headers).await {
            return *r;
        }
        return match job_rows(&admin).await {
            Ok(jobs) => ok(views::jobs_table(&jobs)),
            Err(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("reading the custom-tool jobs failed: {e}"),
            )
                .into_response(),
        };
    }
    match admin.viewer(&headers).await {
        Ok(login) => custom_page(&admin, &login, StatusCode::OK, None).await,
        Err(r) => *r,
    }
}

async fn approve(
    State(admin): St,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    let login = match admin.actor(&headers, &form.csrf).await {
        Ok((_, l)) => l,
        Err(r) => return *r,
    };
    match admin.page.custom.approve(&name, false).await {
        Ok(note) => {
            tracing::info!(target: "quiver::admin", action = "approve", tool = %name, "admin page: {note}");
            let notice = format!("{note}; it is served within a second or two");
            custom_page(&admin, &login, StatusCode::OK, Some(&notice)).await
        }
        Err(e) => {
            tracing::warn!(target: "quiver::admin", action = "approve", tool = %name, "admin page: approval refused: {e}");
            custom_page(
                &admin,
                &login,
                StatusCode::CONFLICT,
                Some(&format!("Not approved: {e}")),
            )
            .await
        }
    }
}

async fn reject(
    State(admin): St,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    let login = match admin.actor(&headers, &form.csrf).await {
        Ok((_, l)) => l,
        Err(r) => return *r,
    };
    let reason = form.reason.trim();
    if reason.is_empty() {
        return custom_page(
            &admin,
            &login,
            StatusCode::BAD_REQUEST,
            Some("Not rejected: give the reason the tool is turned down."),
        )
        .await;
    }
    match admin.page.custom.reject(&name, reason).await {
        Ok(()) => {
            tracing::info!(target: "quiver::admin", action = "reject", tool = %name, reason = %reason, "admin page: custom tool rejected");
            custom_page(
                &admin,
                &login,
                StatusCode::OK,
                Some(&format!("`{name}` rejected: {reason}")),
            )
            .await
        }
        Err(e) => {
            tracing::warn!(target: "quiver::admin", action = "reject", tool = %name, "admin page: rejection refused: {e}");
            custom_page(
                &admin,
                &login,
                StatusCode::CONFLICT,
                Some(&format!("Not rejected: {e}")),
            )
            .await
        }
    }
}

async fn config(State(admin): St, headers: HeaderMap) -> Response {
    let login = match admin.viewer(&headers).await {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let reload = admin.page.config.last_reload();
    let found = admin.page.config.findings();
    ok(views::config(
        &admin.page.config.effective(),
        reload.as_deref(),
        found.as_deref(),
        &admin.frame(&login),
    ))
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        views::CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        views::JS,
    )
}
