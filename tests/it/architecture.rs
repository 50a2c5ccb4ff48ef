//! The dependency graph is the architecture: this reads `cargo metadata` and fails on a
//! forbidden edge.

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
};

use serde_json::Value;

const CORE: [&str; 3] = ["quiver-contract", "quiver-registry", "quiver-surface"];
const ADAPTERS: [&str; 9] = [
    "quiver-admin-web",
    "quiver-telemetry-otel",
    "quiver-sandbox",
    "quiver-auth-oidc",
    "quiver-mcp-adapter",
    "quiver-store-sqlite",
    "quiver-store-postgres",
    "quiver-embed-candle",
    "quiver-metrics-prometheus",
];
/// Engines that only adapters may name, directly or through any dependency.
const ENGINES: [&str; 22] = [
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry-otlp",
    "tracing-opentelemetry",
    "tonic",
    "maud",
    "prometheus-client",
    "jsonwebtoken",
    "rusqlite",
    "tokio-postgres",
    "deadpool-postgres",
    "postgres-protocol",
    "tokio-postgres-rustls",
    "rmcp",
    "rquickjs",
    "axum",
    "reqwest",
    "libsqlite3-sys",
    "candle-core",
    "candle-transformers",
    "tokenizers",
    "safetensors",
];

struct Graph {
    /// package name -> names of its normal (non-dev, non-build) dependencies in the resolve.
    normal: BTreeMap<String, BTreeSet<String>>,
}

fn graph() -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut normal = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let name = names[node["id"].as_str().unwrap()].to_owned();
        let deps: BTreeSet<String> = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| names[d["pkg"].as_str().unwrap()].to_owned())
            .collect();
        normal.insert(name, deps);
    }
    Graph { normal }
}

impl Graph {
    fn direct(&self, pkg: &str) -> &BTreeSet<String> {
        &self.normal[pkg]
    }

    fn transitive(&self, pkg: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![pkg.to_owned()];
        while let Some(p) = stack.pop() {
            for d in self.normal.get(&p).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    }
}

/// Which workspace crates each crate may depend on.
fn allowed(pkg: &str) -> &'static [&'static str] {
    match pkg {
        "quiver-contract" => &[],
        "quiver-registry" => &["quiver-contract"],
        "quiver-surface" => &["quiver-contract", "quiver-registry"],
        p if ADAPTERS.contains(&p) => &CORE,
        // The store ports' contract suite and a test server, for adapters' tests: it names
        // no adapter (each adapter's tests bring their own backend).
        "quiver-store-testkit" => &CORE,
        "quiver-host" | "quiver-tests" => &[
            "quiver-contract",
            "quiver-registry",
            "quiver-surface",
            "quiver-sandbox",
            "quiver-mcp-adapter",
            "quiver-store-sqlite",
            "quiver-store-postgres",
            "quiver-store-testkit",
            "quiver-embed-candle",
            "quiver-metrics-prometheus",
            "quiver-admin-web",
            "quiver-auth-oidc",
            "quiver-telemetry-otel",
            "quiver-host",
        ],
        other => panic!("unknown workspace crate {other}: add it to the architecture rules"),
    }
}

fn violations(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for pkg in g.normal.keys().filter(|p| p.starts_with("quiver-")) {
        for dep in g.direct(pkg).iter().filter(|d| d.starts_with("quiver-")) {
            if !allowed(pkg).contains(&dep.as_str()) {
                out.push(format!("{pkg} -> {dep}: not an allowed edge"));
            }
        }
    }
    for core in CORE {
        let reach = g.transitive(core);
        for engine in ENGINES {
            if reach.contains(engine) {
                out.push(format!(
                    "{core} reaches {engine}: a core crate never names an engine"
                ));
            }
        }
    }
    out
}

#[test]
fn the_dependency_graph_has_no_forbidden_edge() {
    let g = graph();
    for pkg in CORE
        .iter()
        .chain(ADAPTERS.iter())
        .chain(["quiver-host"].iter())
    {
        assert!(
            g.normal.contains_key(*pkg),
            "{pkg} is missing from the workspace"
        );
    }
    let v = violations(&g);
    assert!(v.is_empty(), "forbidden edges:\n{}", v.join("\n"));
}

#[test]
fn the_check_catches_a_forbidden_edge() {
    // The rule must be able to fail: graft rusqlite under the contract crate (so every core
    // crate reaches it transitively) and an adapter under another; all are reported.
    let mut g = graph();
    g.normal
        .get_mut("quiver-contract")
        .unwrap()
        .insert("rusqlite".into());
    g.normal.insert("rusqlite".into(), BTreeSet::new());
    g.normal
        .get_mut("quiver-sandbox")
        .unwrap()
        .insert("quiver-store-sqlite".into());
    let v = violations(&g);
    assert!(
        v.iter()
            .any(|l| l == "quiver-contract reaches rusqlite: a core crate never names an engine"),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|l| l == "quiver-sandbox -> quiver-store-sqlite: not an allowed edge"),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|l| l.starts_with("quiver-surface reaches rusqlite")),
        "transitive: {v:?}"
    );
}

/// The halves of the MCP adapter that must not import each other: the client (upstreams as
/// tools) and the server (the MCP endpoint) share only the crate's floor (content port,
/// SSE reading, protocol versions, wire helpers).
const MCP_HALVES: [(&str, &str); 2] = [("client", "server"), ("server", "client")];

/// `path::to::module` references in `source` that reach into the `other` half: `crate::other`
/// or `super::...::other` (with or without `::`), and `use` lists naming it.
fn reaches_into(source: &str, other: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let crate_path = format!("crate::{other}");
        let super_path = format!("super::{other}");
        let through_super = code.contains("super::super::") && code.contains(&format!("::{other}"));
        if code.contains(&crate_path) || code.contains(&super_path) || through_super {
            found.push(format!("{}: {}", n + 1, line.trim()));
        }
    }
    found
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_mcp_client_and_server_never_import_each_other() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/mcp-adapter/src");
    let mut violations = Vec::new();
    for (half, other) in MCP_HALVES {
        let files = rust_files(&src.join(half));
        assert!(!files.is_empty(), "no sources under {half}/");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for hit in reaches_into(&text, other) {
                violations.push(format!("{}:{hit}", file.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "the MCP client and server import each other (move what they share to the crate's floor):\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_import_check_catches_a_reach_across() {
    let client = "use crate::server::ListChange;\nfn f() { crate::server::from_mcp_level(x) }\n// crate::server in a comment\n";
    assert_eq!(reaches_into(client, "server").len(), 2);
    assert_eq!(
        reaches_into("use super::super::server::X;", "server").len(),
        1
    );
    assert!(reaches_into("use crate::content::ListChange;", "server").is_empty());
}
