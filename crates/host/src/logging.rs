//! Logging to stderr, as `QUIVER_LOG` says.

/// The levels a `QUIVER_LOG` directive may be on its own (one for every target).
const LEVELS: &[&str] = &[
    "off", "error", "warn", "info", "debug", "trace", "0", "1", "2", "3", "4", "5",
];

use tracing_subscriber::{Layer, Registry, layer::SubscriberExt, util::SubscriberInitExt};

/// A layer that records spans elsewhere (the OpenTelemetry bridge), beside the log.
pub(crate) type SpanLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Logs to stderr as `QUIVER_LOG` says (warnings when it is unset or not a filter), and
/// hands spans to `spans` when given. The log's filter is the log's own: it does not
/// decide which spans `spans` sees.
pub(crate) fn init(spans: Option<SpanLayer>) {
    let spec = std::env::var("QUIVER_LOG").unwrap_or_default();
    let parsed = tracing_subscriber::EnvFilter::try_new(&spec);
    let bad_spec = parsed.as_ref().err().map(ToString::to_string);
    let mut filter = parsed
        .ok()
        .filter(|_| !spec.trim().is_empty())
        .unwrap_or_else(|| "warn".into());
    // A filter that sets no level for everything else (`quiver_host=debug`, or a typo like
    // `degub`, which reads as a target) keeps the warnings: they say what was skipped and
    // why, and switching them off is what `off` or `error` is for.
    if !spec
        .split(',')
        .any(|d| LEVELS.contains(&d.trim().to_ascii_lowercase().as_str()))
        && let Ok(warn) = "warn".parse()
    {
        filter = filter.add_directive(warn);
    }
    // What an operator does on the admin page (log in, approve, reject, reconnect) is an
    // audit trail: logged at INFO under `quiver::admin`, shown unless QUIVER_LOG names it.
    if !spec.contains("quiver::admin")
        && let Ok(admin) = "quiver::admin=info".parse()
    {
        filter = filter.add_directive(admin);
    }
    // rmcp's transport worker logs each failed upstream connection at ERROR, with Rust type
    // names; Quiver reports the same failure itself, in words (start-up lines, `status`).
    // Shown only when QUIVER_LOG names rmcp.
    // Its service loop warns of every error answer Quiver gives an upstream's request (a
    // roots/list outside a forwarded call, which Quiver refuses by design), as a Debug
    // dump: left to QUIVER_LOG too.
    // Its HTTP client logs a broken event stream and a failed session DELETE the same way,
    // where Quiver logs the connection's loss itself. Its service loop's errors are all a
    // message it could not send (a client gone: Quiver's stdio transport says so itself,
    // once, and ends the session), one line per answer still due, in Rust's words.
    // Its HTTP server warns of each request it refuses for the client's own mistake (a
    // version header that does not match the body, a resumption of a stream it no longer
    // keeps), one line per retry, with Rust's Debug text; the client is told in its answer.
    // The one such refusal an operator needs, a web page of another site (`Origin`), Quiver
    // logs itself, once per origin. Its errors (a session that failed) stay shown.
    if !spec.contains("rmcp") {
        for directive in [
            "rmcp::transport::worker=off",
            "rmcp::transport::common::client_side_sse=off",
            "rmcp::transport::streamable_http_client=off",
            "rmcp::transport::streamable_http_server::tower=error",
            "rmcp::service=off",
        ] {
            if let Ok(quiet) = directive.parse() {
                filter = filter.add_directive(quiet);
            }
        }
    }
    // The PostgreSQL pool warns of every connection it drops after a database restart, in
    // its own words ("could not be recycled"); the store says what the outage means for the
    // log itself (rows held, then the all-clear). Shown only when QUIVER_LOG names deadpool.
    if !spec.contains("deadpool")
        && let Ok(quiet) = "deadpool=off".parse()
    {
        filter = filter.add_directive(quiet);
    }
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not into a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    tracing_subscriber::registry().with(spans).with(log).init();
    if let Some(why) = bad_spec {
        eprintln!(
            "quiver: QUIVER_LOG={spec:?} is not a log filter ({why}); logging warnings. Give a level (error, warn, info, debug, trace, off) or target=level pairs, e.g. QUIVER_LOG=info,quiver_mcp_adapter=debug"
        );
    }
}
