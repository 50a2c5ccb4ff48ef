//! The admin page over a 1-million-row execution log (issue 44's target: the log view opens
//! in ≤ 300 ms, with a paged query and an index). One SQLite store is filled once through
//! the batching writer, then each view is fetched through the page's router as a logged-in
//! browser would (query, rows, HTML): the first page of the log, a page deep in it (the time
//! cursor), the log filtered by tool, principal, session and outcome, one call's detail, and
//! the catalog (which counts every tool's usage over the whole log).

use std::{
    hint::black_box,
    time::{Duration, SystemTime},
};

use axum::{body::Body, http::Request};
use criterion::{Criterion, criterion_group, criterion_main};
use quiver_contract::{Envelope, ErrKind, HintKind};
use quiver_registry::{CallRecord, ToolCallRecorder};
use tower::ServiceExt;

const ROWS: usize = 1_000_000;
const TOKEN: &str = "bench-admin-token-0123456789";

/// Row `i`: 20 tools, 5 principals, 1000 sessions; one in ten fails, one in twenty is a
/// hint; one call a millisecond, the newest now.
fn record(i: usize, now: SystemTime) -> CallRecord {
    let env = match i % 20 {
        0 => Envelope::hint(
            HintKind::Schema,
            "missing required argument `path`",
            Vec::new(),
        ),
        1 | 11 => Envelope::err(ErrKind::ToolFailed, "the upstream timed out"),
        _ => Envelope::text(format!("result {i}: {}", "lorem ipsum ".repeat(8))),
    };
    CallRecord::new(
        format!("tool_{:02}", i % 20),
        format!("call-{i:07}"),
        serde_json::json!({"path": format!("/data/{i}"), "limit": 10}),
        env,
    )
    .with_session(format!("s{:04}", i % 1000))
    .with_principal(format!("p{}", i % 5))
    .with_timings(Duration::from_micros(20), Duration::from_micros(900))
    .with_at(now - Duration::from_millis((ROWS - i) as u64))
}

fn admin_log(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quiver.toml");
    std::fs::write(
        &file,
        format!(
            "[store]\npath = \"{}\"\n\n[admin]\ntoken = \"{TOKEN}\"\n",
            dir.path().join("q.db").display()
        ),
    )
    .unwrap();
    let (config, _) = quiver_host::Config::load(Some(&file)).unwrap();
    let app = runtime
        .block_on(quiver_host::App::build(&config, &[]))
        .unwrap();
    let now = SystemTime::now();
    let filled = std::time::Instant::now();
    runtime.block_on(async {
        for i in 0..ROWS {
            app.store.record(record(i, now)).await;
        }
        app.store.flush().await;
    });
    eprintln!("{ROWS} rows written in {:.1?}", filled.elapsed());
    let token = config.admin.token().unwrap().expect("a token");
    let reloader = std::sync::Arc::new(app.reloader(&config));
    let router = quiver_host::admin_page::admin_page(&app, reloader, token).router();

    let login = runtime.block_on(
        router.clone().oneshot(
            Request::post("/admin/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(format!("token={TOKEN}")))
                .unwrap(),
        ),
    );
    let cookie = login.unwrap().headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let get = |path: &str| {
        let router = router.clone();
        let request = Request::get(path)
            .header("cookie", &cookie)
            .body(Body::empty())
            .unwrap();
        let path = path.to_owned();
        async move {
            let response = router.oneshot(request).await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            black_box(body.len())
        }
    };
    let middle = now - Duration::from_millis(ROWS as u64 / 2);
    let cursor = middle
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let views = [
        ("log_first_page", "/admin/log".to_owned()),
        // The page cursor is (time, row): the row written in the middle.
        (
            "log_page_at_500k",
            format!("/admin/log?before={cursor}.{}", ROWS / 2),
        ),
        ("log_by_tool", "/admin/log?tool=tool_07".to_owned()),
        ("log_by_principal", "/admin/log?principal=p3".to_owned()),
        ("log_by_session", "/admin/log?session=s0042".to_owned()),
        ("log_errors", "/admin/log?outcome=err".to_owned()),
        (
            "log_last_hour",
            "/admin/log?within=1h&tool=tool_03".to_owned(),
        ),
        ("call_detail", "/admin/calls/call-0500000".to_owned()),
        ("catalog", "/admin/catalog".to_owned()),
    ];
    let mut group = c.benchmark_group("admin_1m_rows");
    group.sample_size(20);
    for (name, path) in &views {
        // The first fetch of each view, with cold caches for it, printed apart.
        let first = std::time::Instant::now();
        runtime.block_on(get(path));
        eprintln!("{name}: first fetch {:.1?}", first.elapsed());
        group.bench_function(*name, |b| b.iter(|| runtime.block_on(get(path))));
    }
    group.finish();
    runtime.block_on(app.shutdown()).unwrap();
}

criterion_group!(benches, admin_log);
criterion_main!(benches);
