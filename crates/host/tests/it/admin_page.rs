//! The admin page's guards over raw HTTP (the browser test, `tests/it/admin_web.rs`, drives
//! the page itself): no `/admin` without an admin token; with one, a foreign `Host` or
//! `Origin` refused, a wrong token refused at the login form, the login cookie HttpOnly and
//! SameSite=Strict, every action refused without its session's CSRF token, and a token
//! rotated by a reload ending the logins made with the old one.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use crate::serve::{open, rpc, start_with, stop};

const TOKEN: &str = "admin-page-token-0123456789";
const ROTATED: &str = "admin-page-token-rotated-9876";

/// One HTTP/1.0 request: the status, the head and the body.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let host = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map_or(addr, |(_, v)| v);
    let extra: String = headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\n{extra}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_owned(), body.to_owned())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    })
}

#[test]
fn there_is_no_admin_page_without_an_admin_token() {
    let dir = crate::Scratch::new("admin-page-none");
    let (child, addr) = start_with(&dir, &[], &[], &[]);
    for path in ["/admin", "/admin/login", "/admin/catalog"] {
        let (status, _, body) = request(&addr, "GET", path, &[], "");
        assert_eq!(status, 404, "{path}");
        assert!(body.contains("`[admin] token`"), "{path}: {body}");
    }
    let (status, _, _) = request(
        &addr,
        "POST",
        "/admin/login",
        &[],
        &format!("token={TOKEN}"),
    );
    assert_eq!(status, 404);
    stop(child);
}

/// With inbound tokens and no `[admin] token`, `/metrics`, `/admin` and `POST
/// /admin/reload` say what is missing, to a caller with or without an inbound token: no 401
/// asking for a token that could never open them.
#[test]
fn without_an_admin_token_the_admin_endpoints_say_what_is_missing() {
    let dir = crate::Scratch::new("admin-page-missing");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"alice\"\ntoken = \"alice-secret-token-1\"\n",
    )
    .unwrap();
    let (child, addr) = start_with(&dir, &[], &[], &[]);
    for bearer in [None, Some("Bearer alice-secret-token-1")] {
        let headers: Vec<(&str, &str)> = bearer.map(|b| ("Authorization", b)).into_iter().collect();
        let (status, head, body) = request(&addr, "GET", "/metrics", &headers, "");
        assert_eq!(status, 404, "{bearer:?}: {body}");
        assert!(header(&head, "www-authenticate").is_none(), "{head}");
        assert!(
            body.contains("`[admin] token`") && body.contains("--metrics-listen"),
            "{body}"
        );
        for (method, path) in [
            ("GET", "/admin"),
            ("GET", "/admin/config"),
            ("POST", "/admin/reload"),
        ] {
            let (status, head, body) = request(&addr, method, path, &headers, "");
            assert_eq!(status, 404, "{method} {path} {bearer:?}: {body}");
            assert!(header(&head, "www-authenticate").is_none(), "{head}");
            assert!(
                body.contains("`[admin] token`") && body.contains("read at start"),
                "{method} {path}: {body}"
            );
        }
    }
    // Other unknown paths still answer behind the inbound token (401 before 404).
    let (status, _, _) = request(&addr, "GET", "/nothing-here", &[], "");
    assert_eq!(status, 401);
    stop(child);
}

/// Logs in at `addr` with `token`: the login cookie and the CSRF token of the page's forms.
fn log_in(addr: &str, token: &str) -> (String, String) {
    let (status, head, _) = request(addr, "POST", "/admin/login", &[], &format!("token={token}"));
    assert_eq!(status, 303, "{head}");
    let cookie = header(&head, "set-cookie")
        .expect("a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let (status, _, page) = request(addr, "GET", "/admin/catalog", &[("Cookie", &cookie)], "");
    assert_eq!(status, 200, "{page}");
    (cookie, csrf_of(&page))
}

/// The CSRF token the page's forms carry.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page's forms carry the CSRF token")
        .to_owned()
}

/// The text of an HTML page's markup (the entities maud writes, undone).
fn unescaped(html: &str) -> String {
    html.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The effective configuration reads as quiver.toml: its tables and keys, values as TOML
/// writes them, secrets masked, no Rust `Debug` (`Some(`, type names) and no internal field.
#[test]
fn the_config_page_shows_the_configuration_as_quiver_toml() {
    let dir = crate::Scratch::new("admin-page-config");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            r#"[admin]
token = "{TOKEN}"

[store]
durability = "strict"
retention_days = 30

[[auth.tokens]]
name = "ci"
token = "ci-secret-token-0123456789"
allowed_tools = ["tool_search"]
mode = "plan"

[[mcp.servers]]
name = "one"
command = "python3"
args = [{ONE_TOOL_SERVER:?}]
env = {{ API_KEY = "env-secret-value" }}
call_timeout = "90s"
"#,
            ONE_TOOL_SERVER = crate::ONE_TOOL_SERVER
        ),
    )
    .unwrap();
    let (child, addr) = start_with(&dir, &[], &["--trust-project"], &[]);
    let (cookie, _) = log_in(&addr, TOKEN);
    let (status, _, page) = request(&addr, "GET", "/admin/config", &[("Cookie", &cookie)], "");
    stop(child);
    assert_eq!(status, 200, "{page}");
    let text = unescaped(
        page.split("Effective configuration")
            .nth(1)
            .expect("the effective configuration"),
    );
    for shown in [
        "[store]\n",
        "durability = \"strict\"",
        "retention_days = 30",
        "[[auth.tokens]]",
        "name = \"ci\"",
        "mode = \"plan\"",
        "allowed_tools = [\"tool_search\"]",
        "[[mcp.servers]]",
        "name = \"one\"",
        "command = \"python3\"",
        "call_timeout = \"90s\"",
        "trust_project = true",
        "[admin]\ntoken = \"<masked>\"",
        "API_KEY = \"<masked>\"",
    ] {
        assert!(text.contains(shown), "{shown:?} in\n{text}");
    }
    for hidden in [
        TOKEN,
        "ci-secret-token-0123456789",
        "env-secret-value",
        "Some(",
        "None",
        "StoreConfig",
        "trusted_by_flag",
        "denied_tools",
        "url = ",
    ] {
        assert!(!text.contains(hidden), "{hidden:?} in\n{text}");
    }
}

/// With replicas, the page says which one it is (host name, pid, listen address), and the
/// upstreams' actions say they act on it alone; a server disabled there shows on its
/// `/metrics` as `state="disabled"`.
#[test]
fn the_page_names_its_replica_and_its_upstream_actions_act_on_it_alone() {
    let dir = crate::Scratch::new("admin-page-replica");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[admin]\ntoken = \"{TOKEN}\"\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{:?}]\nrequired = true\n",
            crate::ONE_TOOL_SERVER
        ),
    )
    .unwrap();
    let (child, addr) = start_with(&dir, &[], &[], &[]);
    let pid = child.id().to_string();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("the host name")
        .trim()
        .to_owned();
    let (cookie, csrf) = log_in(&addr, TOKEN);
    let (_, _, page) = request(&addr, "GET", "/admin/upstreams", &[("Cookie", &cookie)], "");
    let text = unescaped(&page);
    let replica = text
        .split("id=\"replica\"")
        .nth(1)
        .and_then(|rest| rest.split("</").next())
        .unwrap_or_else(|| panic!("the header names the replica in\n{text}"));
    for part in [&host, &pid, &addr] {
        assert!(replica.contains(part.as_str()), "{part} in {replica}");
    }
    assert!(text.contains("on this replica only"), "{text}");
    let (status, _, page) = request(
        &addr,
        "POST",
        "/admin/upstreams/one/disable",
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(status, 200, "{page}");
    assert!(
        unescaped(&page).contains("`one` disabled on this replica"),
        "{page}"
    );
    let (status, metrics) = crate::serve::get(
        &addr,
        "/metrics",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    );
    stop(child);
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"quiver_upstream_state{server="one",state="disabled"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"quiver_upstream_state{server="one",state="connected"} 0"#),
        "{metrics}"
    );
}

#[test]
fn the_admin_page_guards_its_host_origin_login_and_forms() {
    let dir = crate::Scratch::new("admin-page");
    let config = |token: &str| {
        std::fs::write(
            dir.join("quiver.toml"),
            format!("[admin]\ntoken = \"{token}\"\n"),
        )
        .unwrap();
    };
    config(TOKEN);
    let (child, addr) = start_with(&dir, &[], &[], &[]);
    let login = format!("token={TOKEN}");

    // Another Host (DNS rebinding) or Origin (a form on another site): refused before the
    // page sees the request, the right token notwithstanding.
    for headers in [
        vec![("Host", "evil.example:80")],
        vec![("Origin", "http://evil.example")],
        vec![("Origin", "http://127.0.0.1:1")],
    ] {
        let (status, head, body) = request(&addr, "POST", "/admin/login", &headers, &login);
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert!(header(&head, "set-cookie").is_none(), "{head}");
    }
    let (status, _, _) = request(
        &addr,
        "GET",
        "/admin/login",
        &[("Host", "evil.example")],
        "",
    );
    assert_eq!(status, 403);

    // A wrong token: refused, no cookie.
    let (status, head, body) = request(
        &addr,
        "POST",
        "/admin/login",
        &[],
        "token=wrong-token-wrong-token",
    );
    assert_eq!(status, 401, "{body}");
    assert!(header(&head, "set-cookie").is_none(), "{head}");
    assert!(body.contains("That is not the admin token"), "{body}");

    // Not logged in: views redirect to the login form, actions are refused.
    let (status, head, _) = request(&addr, "GET", "/admin/log", &[], "");
    assert_eq!(
        (status, header(&head, "location")),
        (303, Some("/admin/login"))
    );
    let (status, _, _) = request(&addr, "POST", "/admin/upstreams/x/reconnect", &[], "csrf=x");
    assert_eq!(status, 403);

    // The right token, from the server's own origin.
    let origin = format!("http://{addr}");
    let (status, head, _) = request(
        &addr,
        "POST",
        "/admin/login",
        &[("Origin", &origin)],
        &login,
    );
    assert_eq!(status, 303, "{head}");
    let set = header(&head, "set-cookie").expect("a cookie").to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/admin"] {
        assert!(set.contains(attribute), "{set}");
    }
    let cookie = set.split(';').next().unwrap().to_owned();
    let (status, head, page) = request(&addr, "GET", "/admin/catalog", &[("Cookie", &cookie)], "");
    assert_eq!(status, 200);
    assert_eq!(header(&head, "x-frame-options"), Some("DENY"));
    assert!(
        header(&head, "content-security-policy")
            .is_some_and(|c| c.contains("frame-ancestors 'none'"))
    );
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page's forms carry the CSRF token")
        .to_owned();
    assert_eq!(csrf.len(), 64);

    // An action: refused without the session's CSRF token, taken with it.
    for form in ["", "csrf=", "csrf=forged", &format!("csrf={}", &csrf[1..])] {
        let (status, _, body) = request(
            &addr,
            "POST",
            "/admin/upstreams/nope/reconnect",
            &[("Cookie", &cookie)],
            form,
        );
        assert_eq!(status, 403, "{form:?}: {body}");
    }
    let (status, _, body) = request(
        &addr,
        "POST",
        "/admin/upstreams/nope/reconnect",
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(
        status, 404,
        "the action ran, and there is no such server: {body}"
    );
    assert!(
        body.contains("there is no upstream server named `nope`"),
        "{body}"
    );

    // The export: JSON Lines of the filtered log, once a call made over MCP is logged.
    let sid = open(&addr, "admin-export");
    let answer = rpc(
        &addr,
        &[
            ("Mcp-Session-Id", &sid),
            ("Quiver-Conversation", "admin-export"),
        ],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"read a file"}}}"#,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let (status, head, body) = request(
            &addr,
            "GET",
            "/admin/log/export?tool=tool_search",
            &[("Cookie", &cookie)],
            "",
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(header(&head, "content-type"), Some("application/x-ndjson"));
        let rows: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if !rows.is_empty() || std::time::Instant::now() > deadline {
            break rows;
        }
        std::thread::sleep(Duration::from_millis(20)); // the poll interval; the deadline bounds the wait
    };
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0]["tool"].as_str(), rows[0]["outcome"].as_str()),
        (Some("tool_search"), Some("ok"))
    );
    assert_eq!(rows[0]["input"]["query"], "read a file");
    let (_, _, none) = request(
        &addr,
        "GET",
        "/admin/log/export?tool=tool_search&outcome=err",
        &[("Cookie", &cookie)],
        "",
    );
    assert_eq!(none, "", "the filters apply");
    let (status, _, _) = request(&addr, "GET", "/admin/log/export", &[], "");
    assert_eq!(status, 403, "no export without a login");

    // The hash chain: whole, then a row changed behind Quiver's back is named.
    let (status, _, body) = request(&addr, "GET", "/admin/log/chain", &[("Cookie", &cookie)], "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Chain intact: "), "{body}");
    assert!(body.contains("id=\"chain-head\""), "{body}");
    let db = rusqlite::Connection::open(dir.join("quiver.db")).expect("the store");
    db.execute(
        "UPDATE execution_log SET reasoning = 'edited' WHERE call_id = ?1",
        [rows[0]["call_id"].as_str().expect("a call id")],
    )
    .expect("changed behind Quiver's back");
    drop(db);
    let (_, _, body) = request(&addr, "GET", "/admin/log/chain", &[("Cookie", &cookie)], "");
    assert!(body.contains("Chain BROKEN: 1 problem(s)"), "{body}");
    assert!(body.contains("does not hash to its link"), "{body}");
    let (status, _, _) = request(&addr, "GET", "/admin/log/chain", &[], "");
    assert_ne!(status, 200, "no chain page without a login");

    // The token rotated by a reload: the old login is over, the new token logs in.
    config(ROTATED);
    let (status, _, body) = request(
        &addr,
        "POST",
        "/admin/reload",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        "",
    );
    assert_eq!(status, 200, "{body}");
    let (status, head, _) = request(&addr, "GET", "/admin/catalog", &[("Cookie", &cookie)], "");
    assert_eq!(
        (status, header(&head, "location")),
        (303, Some("/admin/login"))
    );
    let (status, _, _) = request(&addr, "POST", "/admin/login", &[], &login);
    assert_eq!(status, 401, "the old token no longer logs in");
    let (status, _, _) = request(
        &addr,
        "POST",
        "/admin/login",
        &[],
        &format!("token={ROTATED}"),
    );
    assert_eq!(status, 303);
    stop(child);
}
