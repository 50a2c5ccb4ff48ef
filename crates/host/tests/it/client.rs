//! `quiver client setup` and `quiver client import` against sample configuration files of
//! each client, in a temporary HOME (Linux paths).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::{Value, json};

/// Each client's file under `home`, and a sample of it as the client writes it: one server
/// of its own and keys that are not about MCP.
fn samples(home: &Path) -> Vec<(&'static str, PathBuf, String)> {
    vec![
        (
            "claude-desktop",
            home.join(".config/Claude/claude_desktop_config.json"),
            r#"{
  "mcpServers": {
    "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]}
  },
  "globalShortcut": "Ctrl+Space"
}
"#
            .into(),
        ),
        (
            "claude-code",
            home.join(".claude.json"),
            r#"{
  "numStartups": 12,
  "projects": {"/src/app": {"allowedTools": []}},
  "mcpServers": {
    "github": {"type": "stdio", "command": "github-mcp", "args": [], "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}}
  }
}
"#
            .into(),
        ),
        (
            "cursor",
            home.join(".cursor/mcp.json"),
            r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}, "old": {"command": "x", "disabled": true}}}"#.into(),
        ),
        (
            "vscode",
            home.join(".config/Code/User/mcp.json"),
            r#"{
  // VS Code allows comments here
  "inputs": [{"type": "promptString", "id": "key", "password": true}],
  "servers": {
    "search": {"type": "http", "url": "https://search.example/mcp", "headers": {"Key": "${input:key}"}},
    "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"],},
  },
}
"#
            .into(),
        ),
        (
            "windsurf",
            home.join(".codeium/windsurf/mcp_config.json"),
            r#"{"mcpServers": {"docs": {"serverUrl": "https://docs.example/mcp"}, "events": {"type": "sse", "url": "https://events.example/sse"}}}"#.into(),
        ),
    ]
}

/// `quiver ARGS` in `cwd` with HOME at `home` (XDG_CONFIG_HOME unset).
fn quiver(home: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("APPDATA")
        .env("QUIVER_LOG", "error")
        .output()
        .unwrap()
}

/// A HOME with every client's sample written, and a working directory with a quiver.toml.
fn home_with_samples(prefix: &str) -> (crate::Scratch, PathBuf, PathBuf) {
    let dir = crate::Scratch::new(prefix);
    let home = dir.join("home");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("quiver.toml"),
        "# the team's Quiver\n[store]\npath = \"q.db\"\n",
    )
    .unwrap();
    for (_, path, text) in samples(&home) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    (dir, home, work)
}

/// The JSON of a client's file (comments and trailing commas are gone once Quiver wrote it).
fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// The backups written beside `path`.
fn backups(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{name}.")) && n.ends_with(".bak")
        })
        .collect()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// `setup all` writes a stdio entry that starts this binary with the working directory's
/// quiver.toml into every client's file, under each client's own servers key; the other
/// servers and keys stay as they were, and the file as it was is the backup. A second run
/// changes nothing and backs nothing up.
#[test]
fn setup_writes_quiver_into_every_client_and_keeps_the_rest() {
    let (_dir, home, work) = home_with_samples("client-setup");
    let out = quiver(&home, &work, &["client", "setup", "all"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let config = std::fs::canonicalize(work.join("quiver.toml")).unwrap();
    let exe = env!("CARGO_BIN_EXE_quiver");
    for (client, path, original) in samples(&home) {
        let after = read_json(&path);
        let key = if client == "vscode" {
            "servers"
        } else {
            "mcpServers"
        };
        let entry = &after[key]["quiver"];
        assert_eq!(entry["command"], exe, "{client}: {after}");
        assert_eq!(
            entry["args"],
            json!(["--config", config.display().to_string(), "serve", "--stdio"]),
            "{client}"
        );
        // Everything else as it was.
        let before: Value = serde_json::from_str(&strip_jsonc(&original)).unwrap();
        let mut without = after.clone();
        without[key].as_object_mut().unwrap().remove("quiver");
        assert_eq!(without, before, "{client}: only quiver was added");
        let saved = backups(&path);
        assert_eq!(saved.len(), 1, "{client}: {saved:?}");
        assert_eq!(
            std::fs::read_to_string(&saved[0]).unwrap(),
            original,
            "{client}"
        );
    }
    let again = quiver(&home, &work, &["client", "setup", "all"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        text(&again.stdout).matches("unchanged").count(),
        5,
        "{}",
        text(&again.stdout)
    );
    // A no-op is said to be one, not to replace anything.
    assert!(
        !text(&again.stdout).contains("replaces"),
        "{}",
        text(&again.stdout)
    );
    for (client, path, _) in samples(&home) {
        assert_eq!(backups(&path).len(), 1, "{client}: nothing new backed up");
    }
}

/// The sample's JSONC as JSON (the test's own reading of VS Code's comments).
fn strip_jsonc(s: &str) -> String {
    s.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(",}", "}")
        .replace(",\n  }", "\n  }")
        .replace(",\n}", "\n}")
}

/// Over HTTP each client gets its own keys for the URL and the token as a bearer header;
/// Claude Desktop, whose file takes stdio servers only, is refused and left alone.
#[test]
fn setup_over_http_writes_each_clients_own_keys() {
    let (_dir, home, work) = home_with_samples("client-http");
    let url = "http://127.0.0.1:7345/mcp";
    let out = quiver(
        &home,
        &work,
        &[
            "client",
            "setup",
            "claude-code",
            "cursor",
            "vscode",
            "windsurf",
            "--http",
            url,
            "--token",
            "t0ken-for-the-test",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bearer = json!({"Authorization": "Bearer t0ken-for-the-test"});
    let all = samples(&home);
    let file = |client: &str| read_json(&all.iter().find(|(c, _, _)| *c == client).unwrap().1);
    assert_eq!(
        file("claude-code")["mcpServers"]["quiver"],
        json!({"type": "http", "url": url, "headers": bearer})
    );
    assert_eq!(
        file("cursor")["mcpServers"]["quiver"],
        json!({"url": url, "headers": bearer})
    );
    assert_eq!(
        file("vscode")["servers"]["quiver"],
        json!({"type": "http", "url": url, "headers": bearer})
    );
    assert_eq!(
        file("windsurf")["mcpServers"]["quiver"],
        json!({"serverUrl": url, "headers": bearer})
    );
    let desktop = &all[0].1;
    let before = std::fs::read_to_string(desktop).unwrap();
    let refused = quiver(
        &home,
        &work,
        &["client", "setup", "claude-desktop", "--http", url],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("stdio"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(std::fs::read_to_string(desktop).unwrap(), before);
    assert!(backups(desktop).is_empty());
}

/// `--dry-run` prints the change as a unified diff and writes nothing, not even a backup;
/// a client whose file does not exist yet is shown created.
#[test]
fn a_dry_run_shows_the_diff_and_writes_nothing() {
    let (_dir, home, work) = home_with_samples("client-dry");
    let cursor = home.join(".cursor/mcp.json");
    let before = std::fs::read_to_string(&cursor).unwrap();
    std::fs::remove_file(home.join(".codeium/windsurf/mcp_config.json")).unwrap();
    let out = quiver(
        &home,
        &work,
        &["client", "setup", "cursor", "windsurf", "--dry-run"],
    );
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // An absolute path as `git diff` shows one: `a/tmp/...`, not `a//tmp/...`.
    let unrooted = cursor.display().to_string();
    let unrooted = unrooted.trim_start_matches('/');
    assert!(shown.contains(&format!("--- a/{unrooted}\n")), "{shown}");
    assert!(shown.contains(&format!("+++ b/{unrooted}\n")), "{shown}");
    assert!(!shown.contains("a//") && !shown.contains("b//"), "{shown}");
    assert!(shown.contains("+    \"quiver\": {"), "{shown}");
    assert!(
        shown.contains("-{\"mcpServers\""),
        "the old line is shown removed: {shown}"
    );
    assert_eq!(
        shown.matches("dry run: nothing written").count(),
        2,
        "{shown}"
    );
    assert_eq!(std::fs::read_to_string(&cursor).unwrap(), before);
    assert!(backups(&cursor).is_empty());
    assert!(!home.join(".codeium/windsurf/mcp_config.json").exists());
}

/// A file that is not valid JSON is refused with its path, line and column, and nothing is
/// written: not the file, not a backup, not a temporary file; the other clients named are
/// still set up. `import` refuses it the same way.
#[test]
fn a_malformed_file_is_refused_with_its_path_and_line_and_nothing_written() {
    let (_dir, home, work) = home_with_samples("client-bad");
    let cursor = home.join(".cursor/mcp.json");
    let broken =
        "{\n  \"mcpServers\": {\n    \"time\": {\"command\": \"uvx\" \"args\": []}\n  }\n}\n";
    std::fs::write(&cursor, broken).unwrap();
    let out = quiver(&home, &work, &["client", "setup", "cursor", "windsurf"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let said = text(&out.stderr);
    assert!(said.contains(&format!("{}:3:", cursor.display())), "{said}");
    assert!(said.contains("left as it is"), "{said}");
    assert_eq!(std::fs::read_to_string(&cursor).unwrap(), broken);
    let entries: Vec<_> = std::fs::read_dir(cursor.parent().unwrap())
        .unwrap()
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "no backup, no temporary file: {entries:?}"
    );
    let windsurf = read_json(&home.join(".codeium/windsurf/mcp_config.json"));
    assert!(windsurf["mcpServers"]["quiver"].is_object(), "{windsurf}");

    let to = work.join("servers.json");
    let import = quiver(
        &home,
        &work,
        &["client", "import", "--to", to.to_str().unwrap()],
    );
    assert_ne!(import.status.code(), Some(0));
    assert!(
        text(&import.stderr).contains(&format!("{}:3:", cursor.display())),
        "{}",
        text(&import.stderr)
    );
    assert!(!to.exists(), "nothing written");

    // A servers key that is not an object: the path and the line of the key.
    std::fs::write(&cursor, "{\n  \"theme\": 1,\n  \"mcpServers\": [1]\n}\n").unwrap();
    let out = quiver(&home, &work, &["client", "setup", "cursor"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("{}:3:", cursor.display())),
        "{}",
        text(&out.stderr)
    );
}

/// Round trip: after `setup`, `import` takes every client's servers but Quiver itself into
/// an mcpServers file, with Claude Code's `${VAR}` as `${env:VAR}` and Windsurf's
/// `serverUrl` as a URL; what Quiver cannot run as written (disabled, SSE, VS Code
/// `${input:...}`) is skipped and said why. `quiver serve --mcp-config`'s reader takes the
/// file; into a quiver.toml the servers are appended and the file's own lines stay.
#[test]
fn import_takes_the_clients_servers_into_quiver() {
    let (_dir, home, work) = home_with_samples("client-import");
    let setup = quiver(&home, &work, &["client", "setup", "all"]);
    assert!(setup.status.success(), "{}", text(&setup.stderr));

    let to = work.join("servers.json");
    let out = quiver(
        &home,
        &work,
        &["client", "import", "--to", to.to_str().unwrap()],
    );
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    let file = read_json(&to);
    assert_eq!(
        file,
        json!({"mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
            "github": {"command": "github-mcp", "env": {"GITHUB_TOKEN": "${env:GITHUB_TOKEN}"}},
            "time": {"command": "uvx", "args": ["mcp-server-time"]},
            "git": {"command": "uvx", "args": ["mcp-server-git"]},
            "docs": {"url": "https://docs.example/mcp", "type": "http"},
        }}),
        "{said}"
    );
    for skipped in [
        "skipped old (cursor): it is disabled there",
        "skipped search (vscode): `${input:key}` is filled in by the client itself",
        "skipped events (windsurf): it is an SSE server",
    ] {
        assert!(said.contains(skipped), "{skipped} in {said}");
    }
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with("quiver") || l.starts_with("skipped quiver")),
        "Quiver itself is neither imported nor reported: {said}"
    );
    // The reader of `quiver serve --mcp-config` takes the file whole.
    let servers = quiver_host::parse_mcp_servers(
        &std::fs::read_to_string(&to).unwrap(),
        "servers.json",
        &|k| (k == "GITHUB_TOKEN").then(|| "from-the-environment".to_owned()),
    )
    .expect("the imported file reads");
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["fs", "github", "time", "git", "docs"]);
    let github = servers.iter().find(|s| s.name == "github").unwrap();
    assert_eq!(github.env["GITHUB_TOKEN"], "${env:GITHUB_TOKEN}");

    // Into the quiver.toml: appended, the comment and the store kept, and it still loads.
    let out = quiver(&home, &work, &["client", "import", "cursor", "windsurf"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let toml_text = std::fs::read_to_string(work.join("quiver.toml")).unwrap();
    assert!(
        toml_text.starts_with("# the team's Quiver\n[store]\npath = \"q.db\"\n"),
        "{toml_text}"
    );
    let (config, _) = quiver_host::Config::load(Some(&work.join("quiver.toml"))).unwrap();
    let names: Vec<&str> = config.mcp.servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["time", "docs"], "{toml_text}");
    assert_eq!(backups(&work.join("quiver.toml")).len(), 1);
    // Importing again finds them there and adds nothing.
    let again = quiver(&home, &work, &["client", "import", "cursor", "windsurf"]);
    assert!(
        text(&again.stdout).contains("nothing to import"),
        "{}",
        text(&again.stdout)
    );
}

/// A quiver.toml that leaves the store at its default (`./quiver.db` in the working
/// directory) is refused for a stdio entry, with the line to add: a client starts Quiver in a
/// directory of its own, whose store would hold none of the custom tools approved here and
/// log the client's calls apart. Nothing is written; once the store is pinned, setup goes on.
#[test]
fn setup_refuses_a_config_whose_store_follows_the_working_directory() {
    let dir = crate::Scratch::new("client-store-unpinned");
    let home = dir.join("home");
    let work = dir.join("work");
    std::fs::create_dir_all(home.join(".cursor")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("quiver.toml"), "[skills]\ndirs = []\n").unwrap();
    let out = quiver(&home, &work, &["client", "setup", "cursor"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    let here = std::fs::canonicalize(&work).unwrap().join("quiver.db");
    assert!(
        said.contains("sets no `[store] path`")
            && said.contains(&format!("path = {:?}", here.display().to_string())),
        "{said}"
    );
    assert!(!home.join(".cursor/mcp.json").exists(), "nothing written");
    std::fs::write(work.join("quiver.toml"), "[store]\npath = \"q.db\"\n").unwrap();
    let out = quiver(&home, &work, &["client", "setup", "cursor"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(read_json(&home.join(".cursor/mcp.json"))["mcpServers"]["quiver"].is_object());
}

/// `all` takes the clients this user has (their file, or the directory it goes in) and
/// creates no file for the others; a client named is set up whether or not it is there.
#[test]
fn all_takes_the_clients_that_are_there() {
    let dir = crate::Scratch::new("client-all");
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".cursor")).unwrap();
    let out = quiver(&home, &dir, &["client", "setup"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(read_json(&home.join(".cursor/mcp.json"))["mcpServers"]["quiver"].is_object());
    for absent in [".claude.json", ".codeium", ".config"] {
        assert!(!home.join(absent).exists(), "{absent} not created");
    }
    let named = quiver(&home, &dir, &["client", "setup", "windsurf"]);
    assert!(named.status.success(), "{}", text(&named.stderr));
    assert!(
        read_json(&home.join(".codeium/windsurf/mcp_config.json"))["mcpServers"]["quiver"]
            .is_object()
    );
}

/// `--http` takes an http(s) URL only, and a HOME that does not exist is refused by name:
/// both exit 2 and write nothing.
#[test]
fn setup_refuses_a_url_that_is_not_one_and_a_home_that_is_not_there() {
    let dir = crate::Scratch::new("client-refuse");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    for url in ["notaurl", "ftp://h/mcp", "http://", "127.0.0.1:7345/mcp"] {
        let out = quiver(&home, &dir, &["client", "setup", "cursor", "--http", url]);
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {said}");
        assert!(
            said.contains(&format!("--http {url:?}"))
                && said.contains("e.g. http://127.0.0.1:7345/mcp"),
            "{url}: {said}"
        );
        assert!(!home.join(".cursor").exists(), "{url}: nothing written");
    }
    let good = quiver(
        &home,
        &dir,
        &[
            "client",
            "setup",
            "cursor",
            "--http",
            "https://quiver.example/mcp",
        ],
    );
    assert!(good.status.success(), "{}", text(&good.stderr));

    let missing = dir.join("no/such/home");
    let out = quiver(&missing, &dir, &["client", "setup", "cursor"]);
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("the home directory {}", missing.display()))
            && said.contains("does not exist"),
        "{said}"
    );
    assert!(!dir.join("no").exists(), "no path created");
}

/// Names the loader refuses (`brave-search`, `a.b`, the reserved `resources`) are taken
/// under the name its error suggests, `_2` when a client already has that one, and said
/// so; a name nothing can be made of is skipped. The result loads, into a quiver.toml and
/// into an mcpServers file alike, and importing again adds nothing.
#[test]
fn import_takes_names_the_loader_refuses_under_names_it_takes() {
    let dir = crate::Scratch::new("client-names");
    let home = dir.join("home");
    let cursor = home.join(".cursor/mcp.json");
    std::fs::create_dir_all(cursor.parent().unwrap()).unwrap();
    std::fs::write(
        &cursor,
        r#"{"mcpServers": {
  "brave-search": {"command": "npx", "args": ["-y", "brave-search-mcp"]},
  "time": {"command": "uvx", "args": ["mcp-server-time"]},
  "a.b": {"command": "ab"},
  "a_b": {"command": "other"},
  "resources": {"command": "res"},
  "--": {"command": "dashes"}
}}"#,
    )
    .unwrap();
    for to in ["quiver.toml", "servers.json"] {
        let out = quiver(&home, &dir, &["client", "import", "cursor", "--to", to]);
        let said = text(&out.stdout);
        assert!(out.status.success(), "{to}: {said}{}", text(&out.stderr));
        for line in [
            "brave-search: from cursor, as brave_search (Quiver's server names are [A-Za-z0-9_])\n",
            "time: from cursor\n",
            "a.b: from cursor, as a_b_2 (Quiver's server names are [A-Za-z0-9_]; a_b is another server's name)\n",
            "a_b: from cursor\n",
            "resources: from cursor, as resources_2 (the MCP server name \"resources\" is reserved)\n",
            "skipped \"--\" (cursor): no Quiver server name can be made of it",
            "5 server(s) into",
        ] {
            assert!(said.contains(line), "{to}: {line} in {said}");
        }
        let names = loaded_server_names(&dir.join(to));
        assert_eq!(
            names,
            ["brave_search", "time", "a_b_2", "a_b", "resources_2"],
            "{to}: {said}"
        );
        let again = quiver(&home, &dir, &["client", "import", "cursor", "--to", to]);
        let said = text(&again.stdout);
        assert!(said.contains("nothing to import"), "{to}: {said}");
        assert!(
            said.contains("skipped brave-search (cursor): ")
                && said.contains("already has a server named brave_search"),
            "{to}: {said}"
        );
    }
}

/// The servers of an imported file as `quiver serve` loads them: the whole check the loader
/// makes, names and all.
fn loaded_server_names(path: &Path) -> Vec<String> {
    let servers = if path.extension().is_some_and(|e| e == "toml") {
        quiver_host::Config::load(Some(path)).unwrap().0.mcp.servers
    } else {
        quiver_host::read_mcp_servers(path).unwrap()
    };
    quiver_mcp_adapter::validate_all(&servers, &|_| None)
        .unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()));
    servers.into_iter().map(|s| s.name).collect()
}

/// A new target is its owner's alone (a client's servers carry keys), an existing one keeps
/// its mode; a key that names a secret with a literal value gets a note suggesting
/// `${env:NAME}`, without the value.
#[cfg(unix)]
#[test]
fn import_keeps_secrets_private_and_says_which_they_are() {
    use std::os::unix::fs::PermissionsExt;
    let dir = crate::Scratch::new("client-secrets");
    let home = dir.join("home");
    let cursor = home.join(".cursor/mcp.json");
    std::fs::create_dir_all(cursor.parent().unwrap()).unwrap();
    std::fs::write(
        &cursor,
        r#"{"mcpServers": {
  "brave": {"command": "npx", "env": {"BRAVE_API_KEY": "s3cret-value", "LOG_LEVEL": "debug", "GITHUB_TOKEN": "${env:GITHUB_TOKEN}"}},
  "docs": {"url": "https://docs.example/mcp", "headers": {"Authorization": "Bearer h3ader-value"}}
}}"#,
    )
    .unwrap();
    std::fs::set_permissions(&cursor, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for to in ["new.toml", "new.json"] {
        let out = quiver(&home, &dir, &["client", "import", "cursor", "--to", to]);
        let said = text(&out.stdout);
        assert!(out.status.success(), "{to}: {said}{}", text(&out.stderr));
        assert_eq!(mode(&dir.join(to)), 0o600, "{to}");
        assert!(
            said.contains(&format!(
                "  note: env.BRAVE_API_KEY looks like a secret and is copied into {to} as it is; to keep it out of the file write \"${{env:BRAVE_API_KEY}}\" there"
            )),
            "{to}: {said}"
        );
        assert!(
            said.contains("note: headers.Authorization looks like a secret")
                && said.contains("\"Bearer ${env:DOCS_AUTHORIZATION}\""),
            "{to}: {said}"
        );
        assert!(
            !said.contains("LOG_LEVEL") && !said.contains("GITHUB_TOKEN"),
            "only literal secrets: {said}"
        );
        assert!(
            !said.contains("s3cret") && !said.contains("h3ader"),
            "no value shown: {said}"
        );
    }
    // An existing file keeps its mode.
    let shared = dir.join("shared.toml");
    std::fs::write(&shared, "# ours\n").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = quiver(
        &home,
        &dir,
        &["client", "import", "cursor", "--to", "shared.toml"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&shared), 0o644);
}

/// The `--mcp-config` files setup is given go into the entry it writes, as absolute paths:
/// the client's Quiver serves their servers too.
#[test]
fn setup_passes_the_mcp_config_files_on() {
    let (_dir, home, work) = home_with_samples("client-mcp-config");
    std::fs::write(
        work.join("mcp.json"),
        r#"{"mcpServers": {"time": {"command": "python3", "args": ["-m", "mcp_server_time"]}}}"#,
    )
    .unwrap();
    let out = quiver(
        &home,
        &work,
        &["--mcp-config", "mcp.json", "client", "setup", "cursor"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let entry = &read_json(&home.join(".cursor/mcp.json"))["mcpServers"]["quiver"];
    let file = std::fs::canonicalize(work.join("mcp.json")).unwrap();
    let args: Vec<&str> = entry["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--mcp-config")
        .unwrap_or_else(|| panic!("no --mcp-config: {args:?}"));
    assert_eq!(args[at + 1], file.display().to_string(), "{args:?}");
    assert_eq!(&args[args.len() - 2..], ["serve", "--stdio"], "{args:?}");
}
