//! The routes over in-memory ports (a catalog and surface, the in-memory call log, no
//! upstreams): logged in as the page is, each answer read back as HTML. The browser test
//! (`tests/it/admin_web.rs`) drives the same routes over a real server.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, UNIX_EPOCH},
};

use async_trait::async_trait;
use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode, header},
};
use quiver_contract::{Envelope, Finding};
use quiver_registry::{
    CallRecord, Catalog, ToolCallRecorder,
    custom::CustomTools,
    sandbox::{Sandbox, SandboxError, SandboxLimits, SandboxOutput, SandboxRun},
    store::{MemoryCallLog, MemoryDefinitionStore, MemoryJobStore},
};
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig, core_tools, ports};
use tower::ServiceExt;

use crate::{AdminPage, ConfigView, UpstreamRow, Upstreams};

const TOKEN: &str = "admin-token-for-unit-tests";

/// A sandbox that runs nothing (no custom tool is run here).
struct NoSandbox;

#[async_trait]
impl Sandbox for NoSandbox {
    fn engine(&self) -> String {
        "none".into()
    }

    fn validate(&self, _: &str, _: &SandboxLimits) -> Result<(), SandboxError> {
        Ok(())
    }

    async fn run(&self, _: SandboxRun) -> Result<SandboxOutput, SandboxError> {
        Err(SandboxError::Timeout)
    }
}

/// One upstream, `everything`, whose switch is recorded.
#[derive(Default)]
struct OneUpstream {
    disabled: Mutex<bool>,
    actions: Mutex<Vec<String>>,
}

#[async_trait]
impl Upstreams for OneUpstream {
    fn upstreams(&self) -> Vec<UpstreamRow> {
        let row = UpstreamRow::new("everything", "connected").with_counts(3, 1, 0, 2);
        if *self.disabled.lock().unwrap() {
            vec![UpstreamRow::new("everything", "disabled").disabled()]
        } else {
            vec![row]
        }
    }

    async fn reconnect(&self, name: &str) -> Result<String, String> {
        self.actions
            .lock()
            .unwrap()
            .push(format!("reconnect {name}"));
        Ok("dialled again".into())
    }

    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<String, String> {
        if name != "everything" {
            return Err(format!("there is no upstream server named `{name}`"));
        }
        *self.disabled.lock().unwrap() = !enabled;
        self.actions.lock().unwrap().push(format!(
            "{} {name}",
            if enabled { "enable" } else { "disable" }
        ));
        Ok(format!(
            "`{name}` {}",
            if enabled { "enabled" } else { "disabled" }
        ))
    }
}

struct FixedConfig(Vec<Finding>);

impl ConfigView for FixedConfig {
    fn effective(&self) -> String {
        "config".into()
    }

    fn last_reload(&self) -> Option<String> {
        None
    }

    fn findings(&self) -> Option<Vec<Finding>> {
        Some(self.0.clone())
    }
}

struct Fixture {
    router: Router,
    calls: Arc<MemoryCallLog>,
    surface: Arc<Surface>,
    upstreams: Arc<OneUpstream>,
    cookie: String,
    csrf: String,
}

impl Fixture {
    /// The page over fresh ports, logged in.
    async fn new(findings: Vec<Finding>) -> Fixture {
        let catalog = Arc::new(Catalog::new());
        let surface = Surface::new(
            catalog.clone(),
            SurfaceConfig::default(),
            Arc::new(MemoryUsage::default()),
        )
        .unwrap();
        catalog.register_all("core", core_tools(&surface));
        surface.resync_index();
        let calls = Arc::new(MemoryCallLog::new());
        let custom = Arc::new(CustomTools::new(
            Arc::new(MemoryDefinitionStore::new()),
            Arc::new(MemoryJobStore::new()),
            Arc::new(NoSandbox),
            SandboxLimits::default(),
        ));
        let upstreams = Arc::new(OneUpstream::default());
        let router = AdminPage::new(
            surface.clone(),
            calls.clone(),
            Arc::new(ports::MemoryUsage::new()),
            custom,
            upstreams.clone(),
            Arc::new(FixedConfig(findings)),
            Arc::new(|fingerprint: &str| fingerprint == quiver_contract::secret_fingerprint(TOKEN)),
        )
        .router();
        let login = router
            .clone()
            .oneshot(
                Request::post("/admin/login")
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(Body::from(format!("token={TOKEN}")))
                    .unwrap(),
            )
            .await
            .unwrap();
        let cookie = login.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let mut fx = Fixture {
            router,
            calls,
            surface,
            upstreams,
            cookie,
            csrf: String::new(),
        };
        let (_, page) = fx.get("/admin/catalog").await;
        fx.csrf = between(&page, "name=\"csrf\" value=\"", "\"").to_owned();
        assert!(!fx.csrf.is_empty(), "{page}");
        fx
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let request = Request::get(path)
            .header(header::COOKIE, &self.cookie)
            .body(Body::empty())
            .unwrap();
        self.send(request).await
    }

    /// A form posted with `csrf`.
    async fn post(&self, path: &str, csrf: &str) -> (StatusCode, String) {
        let request = Request::post(path)
            .header(header::COOKIE, &self.cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("csrf={csrf}")))
            .unwrap();
        self.send(request).await
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }
}

/// The text of `page` between `start` and the next `end`.
fn between<'a>(page: &'a str, start: &str, end: &str) -> &'a str {
    let Some(i) = page.find(start) else {
        return "";
    };
    let rest = &page[i + start.len()..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// The call ids of a page of the log, in order.
fn call_ids(page: &str) -> Vec<String> {
    page.split("data-call=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_owned())
        .collect()
}

/// The href of the page's "Older calls" link, unescaped.
fn older_link(page: &str) -> Option<String> {
    let i = page.find("rel=\"next\"")?;
    let href = page[..i].rfind("href=\"")?;
    let rest = &page[href + 6..];
    Some(rest[..rest.find('"')?].replace("&amp;", "&"))
}

#[tokio::test]
async fn calls_logged_in_one_microsecond_page_without_loss_or_repeat() {
    let fx = Fixture::new(Vec::new()).await;
    // More than a page of calls in one microsecond, then one later (a burst of parallel
    // calls logged with the same dispatch time).
    let at = UNIX_EPOCH + Duration::from_secs(1_796_551_200);
    for i in 0..70 {
        let record = CallRecord::new(
            "tool_search",
            format!("c{i:02}"),
            serde_json::json!({}),
            Envelope::text("ok"),
        )
        .with_at(at);
        fx.calls.record(record).await;
    }
    let later = CallRecord::new(
        "tool_search",
        "late",
        serde_json::json!({}),
        Envelope::text("ok"),
    )
    .with_at(at + Duration::from_micros(1));
    fx.calls.record(later).await;

    let mut seen: Vec<String> = Vec::new();
    let mut path = "/admin/log".to_owned();
    for _ in 0..5 {
        let (status, page) = fx.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        seen.extend(call_ids(&page));
        match older_link(&page) {
            Some(next) => path = next,
            None => break,
        }
    }
    let mut want: Vec<String> = vec!["late".into()];
    want.extend((0..70).rev().map(|i| format!("c{i:02}")));
    assert_eq!(seen, want, "every call once, newest first, over two pages");
    // A cursor of the time alone (what the pages gave before rows were in it) passes over
    // the rest of the crowded microsecond: the second page would be empty.
    let micros = at.duration_since(UNIX_EPOCH).unwrap().as_micros();
    let (_, page) = fx.get(&format!("/admin/log?before={micros}")).await;
    assert!(call_ids(&page).is_empty(), "{page}");

    // The export's cursor is the same.
    let (_, first) = fx.get("/admin/log").await;
    let cursor = between(&first, "before=", "\"").to_owned();
    let (status, jsonl) = fx.get(&format!("/admin/log/export?before={cursor}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(jsonl.lines().count(), 71 - 50, "{jsonl}");
    // A cursor that is not one is refused in words.
    let (status, page) = fx.get("/admin/log?before=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("MICROS.ROW"), "{page}");
}

#[tokio::test]
async fn the_sessions_view_shows_each_session_as_its_model_is_listed() {
    let fx = Fixture::new(Vec::new()).await;
    let (_, page) = fx.get("/admin/sessions").await;
    assert!(page.contains("No sessions."), "{page}");
    let caps = Arc::new(quiver_contract::Capabilities::all());
    fx.surface
        .compose("mcp:abc", quiver_contract::Mode::Plan, &caps)
        .unwrap();
    fx.surface.note_client(
        "mcp:abc",
        quiver_surface::SessionClient::new(
            Some("ci".into()),
            Some("2025-06-18 (session era)".into()),
            caps,
        ),
    );
    let (status, table) = fx.get("/admin/sessions?part=table").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!table.contains("<html"), "a fragment, not a page: {table}");
    for want in ["mcp:abc", "ci", "plan", "2025-06-18 (session era)"] {
        assert!(table.contains(want), "{want} in {table}");
    }
    let (status, detail) = fx.get("/admin/sessions/mcp%3Aabc").await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert!(
        detail.contains("tool_search") && detail.contains("Listed to the model"),
        "{detail}"
    );
    let (status, _) = fx.get("/admin/sessions/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Without a login a fragment is refused, not answered with the login form.
    let request = Request::get("/admin/sessions?part=table")
        .body(Body::empty())
        .unwrap();
    let response = fx.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_disable_switch_is_an_action_with_its_csrf_token() {
    let fx = Fixture::new(Vec::new()).await;
    let (status, page) = fx
        .post("/admin/upstreams/everything/disable", "forged")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(fx.upstreams.actions.lock().unwrap().is_empty());
    let (status, page) = fx
        .post("/admin/upstreams/everything/disable", &fx.csrf)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("aria-label=\"Enable everything\""), "{page}");
    let (status, page) = fx
        .post("/admin/upstreams/everything/enable", &fx.csrf)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("aria-label=\"Disable everything\""), "{page}");
    let (status, page) = fx.post("/admin/upstreams/nope/disable", &fx.csrf).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(page.contains("no upstream server named `nope`"), "{page}");
    assert_eq!(
        *fx.upstreams.actions.lock().unwrap(),
        ["disable everything", "enable everything"]
    );
}

#[tokio::test]
async fn the_config_view_shows_the_check_findings() {
    let fx = Fixture::new(vec![
        Finding::error("tool x: [no description] say what it does"),
        Finding::note("server y: [slow] it took 4 s to connect"),
    ])
    .await;
    let (_, page) = fx.get("/admin/config").await;
    assert!(
        page.contains("The check fails: 1 finding(s) fail it, 1 note(s)."),
        "{page}"
    );
    assert!(page.contains("[no description] say what it does"), "{page}");
    let fx = Fixture::new(Vec::new()).await;
    let (_, page) = fx.get("/admin/config").await;
    assert!(page.contains("None: the check passes."), "{page}");
}

#[tokio::test]
async fn the_catalog_names_the_modes_that_list_each_tool() {
    let fx = Fixture::new(Vec::new()).await;
    let (_, page) = fx.get("/admin/tools/tool_search").await;
    assert!(
        page.contains("<dd>chat, agentic, delegate, plan</dd>"),
        "{page}"
    );
}

/// A `#rgb` or `#rrggbb` colour's channels.
fn rgb(hex: &str) -> [f64; 3] {
    let hex = hex.trim_start_matches('#');
    let hex: String = if hex.len() == 3 {
        hex.chars().flat_map(|c| [c, c]).collect()
    } else {
        hex.to_owned()
    };
    assert_eq!(hex.len(), 6, "a colour: #{hex}");
    let channel = |i: usize| f64::from(u8::from_str_radix(&hex[i..i + 2], 16).unwrap()) / 255.0;
    [channel(0), channel(2), channel(4)]
}

/// WCAG 2's relative luminance.
fn luminance(hex: &str) -> f64 {
    let [r, g, b] = rgb(hex).map(|c| {
        if c <= 0.039_28 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    });
    0.2126 * r + 0.7152 * g + 0.0722 * b
}

/// WCAG 2's contrast ratio of two colours.
fn contrast(a: &str, b: &str) -> f64 {
    let (la, lb) = (luminance(a), luminance(b));
    (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
}

#[test]
fn the_contrast_ratio_is_computed_as_wcag_says() {
    assert!((contrast("#000", "#fff") - 21.0).abs() < 1e-9);
    assert!((contrast("#777", "#777") - 1.0).abs() < 1e-9);
    // A known pair: #767676 on white is the lightest grey at 4.5:1.
    assert!((contrast("#767676", "#fff") - 4.54).abs() < 0.01);
}

/// Every text colour of the stylesheet on every background it is drawn on reads at WCAG
/// AA (4.5:1 for text), and the focus ring stands out from the backgrounds (3:1 for a
/// control's outline). The colours are read from the stylesheet itself, so a change to it
/// is checked.
#[test]
fn the_palette_meets_wcag_aa_contrast() {
    let css = crate::views::CSS;
    let var = |name: &str| -> String {
        let start = css
            .find(&format!("--{name}:"))
            .unwrap_or_else(|| panic!("--{name}"));
        let rest = &css[start + name.len() + 3..];
        rest[..rest.find(';').unwrap()].trim().to_owned()
    };
    let rule = |selector: &str, property: &str| -> String {
        let start = css.find(selector).unwrap_or_else(|| panic!("{selector}"));
        let block = &css[start..start + css[start..].find('}').unwrap()];
        let at = block
            .find(&format!("{property}:"))
            .unwrap_or_else(|| panic!("{property} in {selector}"));
        let rest = &block[at + property.len() + 1..];
        let value = rest[..rest.find(';').unwrap_or(rest.len())].trim();
        // `3px solid #1a73e8`: the colour.
        value
            .split_whitespace()
            .find(|w| w.starts_with('#'))
            .unwrap_or_else(|| panic!("a colour in {selector} {{ {property}: {value} }}"))
            .to_owned()
    };
    let backgrounds = [
        ("page", var("bg")),
        ("header", rule("header {", "background")),
        ("table head", rule("th {", "background")),
        ("pre", rule("pre {", "background")),
        ("notice", rule(".notice {", "background")),
    ];
    let texts = ["fg", "muted", "link", "err", "ok", "warn"];
    let mut failures = Vec::new();
    for (place, bg) in &backgrounds {
        for text in texts {
            let fg = var(text);
            let ratio = contrast(&fg, bg);
            if ratio < 4.5 {
                failures.push(format!("--{text} {fg} on the {place} {bg}: {ratio:.2}:1"));
            }
        }
        let ring = rule(":focus-visible {", "outline");
        let ratio = contrast(&ring, bg);
        if ratio < 3.0 {
            failures.push(format!(
                "the focus ring {ring} on the {place} {bg}: {ratio:.2}:1"
            ));
        }
    }
    assert!(failures.is_empty(), "below WCAG AA: {failures:#?}");
}
