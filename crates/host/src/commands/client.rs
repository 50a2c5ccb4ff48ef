//! `quiver client setup` and `quiver client import`: Quiver written into the MCP clients'
//! configuration files, and their servers taken into Quiver's.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use quiver_host::clients::{
    Client, Connection, ImportTarget, Os, Rewrite, UserDirs, check_http_url, import_servers,
    plan_setup,
};

/// The clients a command names (`all`, or none given: every one).
pub(crate) fn parse_client(s: &str) -> Result<Option<Client>, String> {
    if s == "all" {
        return Ok(None);
    }
    Client::parse(s).map(Some).ok_or_else(|| {
        let names: Vec<&str> = Client::ALL.iter().map(|c| c.name()).collect();
        format!(
            "`{s}` is not a client Quiver knows: {}, or all",
            names.join(", ")
        )
    })
}

/// The clients named, each once, in `Client::ALL`'s order; `explicit` when the user named
/// them (rather than `all` or nothing).
fn chosen(named: &[Option<Client>]) -> (Vec<Client>, bool) {
    let explicit = !named.is_empty() && named.iter().all(Option::is_some);
    let clients = Client::ALL
        .into_iter()
        .filter(|c| !explicit || named.contains(&Some(*c)))
        .collect();
    (clients, explicit)
}

/// `setup`'s options.
pub(crate) struct Setup {
    pub(crate) clients: Vec<Option<Client>>,
    pub(crate) http: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) name: String,
    pub(crate) dry_run: bool,
}

/// The configuration file a client's `quiver serve --stdio` should read: the one given, or
/// ./quiver.toml when it exists, as an absolute path (a client starts Quiver in a directory
/// of its own choosing).
fn config_for_clients(config: Option<&std::path::Path>) -> anyhow::Result<Option<PathBuf>> {
    let path = match config {
        Some(p) => p.to_owned(),
        None if std::path::Path::new("quiver.toml").is_file() => PathBuf::from("quiver.toml"),
        None => return Ok(None),
    };
    std::fs::canonicalize(&path)
        .map(Some)
        .with_context(|| format!("finding {}", path.display()))
}

/// Refuses a configuration that leaves the store at its default, `./quiver.db` in the working
/// directory: a client starts Quiver in a directory of its own choosing, so its Quiver would
/// keep another store (without the custom tools approved here, its calls logged apart).
fn store_is_pinned(file: &std::path::Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let store = toml::from_str::<toml::Value>(&text)
        .ok()
        .and_then(|v| v.get("store").cloned());
    let pinned = store.is_some_and(|s| s.get("path").is_some() || s.get("url").is_some());
    if pinned {
        return Ok(());
    }
    let here = std::env::current_dir()
        .context("finding the working directory")?
        .join("quiver.db");
    anyhow::bail!(
        "{} sets no `[store] path`, so the client's Quiver would keep its store (./quiver.db) in whatever directory the client starts it in, apart from the custom tools and the execution log of this one; add\n\n[store]\npath = {:?}\n\nto {} (the store commands run here use), then run setup again",
        file.display(),
        here.display().to_string(),
        file.display()
    )
}

pub(crate) fn setup(
    opts: Setup,
    config: Option<&std::path::Path>,
    mcp_configs: &[PathBuf],
) -> anyhow::Result<ExitCode> {
    let dirs = UserDirs::from_env()?;
    // The clients' files are under the home directory; a home that is not there is a HOME
    // set wrong, whose whole path setup would otherwise create.
    if !dirs.home.is_dir() {
        anyhow::bail!(
            "the home directory {} (HOME) does not exist, and the clients' files are under it; set HOME to your home directory",
            dirs.home.display()
        );
    }
    let connection = match opts.http {
        Some(url) => {
            check_http_url(&url)?;
            Connection::Http {
                url,
                token: opts.token,
            }
        }
        None => {
            if opts.token.is_some() {
                anyhow::bail!(
                    "--token goes with --http: a client that starts `quiver serve --stdio` needs none"
                );
            }
            let exe = std::env::current_exe().context("finding the quiver binary")?;
            let mut args = Vec::new();
            match config_for_clients(config)? {
                Some(file) => {
                    store_is_pinned(&file)?;
                    args.extend(["--config".to_owned(), file.display().to_string()])
                }
                None => eprintln!(
                    "note: no quiver.toml here and no --config: the client starts Quiver in a directory of its choosing and keeps the store (./quiver.db) there; give --config FILE to fix it"
                ),
            }
            // The `mcpServers` files this command was given go with the entry, as absolute
            // paths (the client starts Quiver elsewhere): its servers are the client's too.
            for file in mcp_configs {
                let file = std::fs::canonicalize(file)
                    .with_context(|| format!("finding {}", file.display()))?;
                args.extend(["--mcp-config".to_owned(), file.display().to_string()]);
            }
            args.extend(["serve".to_owned(), "--stdio".to_owned()]);
            Connection::Stdio {
                command: exe.display().to_string(),
                args,
            }
        }
    };
    let (clients, explicit) = chosen(&opts.clients);
    let mut failed = false;
    let mut any = false;
    for client in clients {
        // `all` sets up the clients this user has.
        if !explicit && !client.seems_installed(Os::current(), &dirs) {
            continue;
        }
        let path = client.config_path(Os::current(), &dirs);
        any = true;
        let plan = match plan_setup(client, &path, &opts.name, &connection) {
            Ok(plan) => plan,
            Err(e) => {
                eprintln!("{client}: {e:#}");
                failed = true;
                continue;
            }
        };
        if !plan.rewrite.changes() {
            say!(
                "{client}: unchanged: `{}` in {} is already as it would be written",
                opts.name,
                path.display()
            );
            continue;
        }
        let verb = if plan.replaced { "replaces" } else { "adds" };
        say!("{client}: {verb} `{}` in {}", opts.name, path.display());
        if !report(&plan.rewrite, opts.dry_run) {
            failed = true;
        }
    }
    if !any {
        say!(
            "no client's configuration directory was found under {}: name a client to create its file (quiver client setup cursor)",
            dirs.home.display()
        );
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Shows the rewrite's diff (`dry_run`) or writes it, saying where the backup went; false
/// when writing failed.
fn report(rewrite: &Rewrite, dry_run: bool) -> bool {
    if !rewrite.changes() {
        say!("  unchanged: it is already there");
        return true;
    }
    if rewrite.drops_comments {
        say!("  note: the file's comments and trailing commas are not kept (the backup has them)");
    }
    if dry_run {
        crate::say_raw(&rewrite.diff());
        say!("  dry run: nothing written");
        return true;
    }
    match rewrite.apply() {
        Ok(Some(backup)) => {
            say!("  written; the file as it was is in {}", backup.display());
            true
        }
        Ok(None) => {
            say!("  created");
            true
        }
        Err(e) => {
            eprintln!("  {e:#}");
            false
        }
    }
}

/// `import`'s options.
pub(crate) struct Import {
    pub(crate) clients: Vec<Option<Client>>,
    pub(crate) to: Option<PathBuf>,
    pub(crate) name: String,
    pub(crate) dry_run: bool,
}

pub(crate) fn import(opts: Import, config: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let dirs = UserDirs::from_env()?;
    let (clients, _) = chosen(&opts.clients);
    let sources: Vec<(Client, PathBuf)> = clients
        .into_iter()
        .map(|c| (c, c.config_path(Os::current(), &dirs)))
        .collect();
    let to = opts
        .to
        .or_else(|| config.map(ToOwned::to_owned))
        .unwrap_or_else(|| PathBuf::from("quiver.toml"));
    let target = ImportTarget::of_path(to);
    let done = import_servers(&sources, &target, &opts.name)?;
    let file = done.rewrite.path.display();
    for s in &done.imported {
        match &s.renamed {
            Some((own, why)) => say!("{own}: from {}, as {} ({why})", s.client, s.name),
            None => say!("{}: from {}", s.name, s.client),
        }
        for (key, instead) in &s.secrets {
            say!(
                "  note: {key} looks like a secret and is copied into {file} as it is; to keep it out of the file write \"{instead}\" there and set the variable where Quiver runs"
            );
        }
    }
    for why in &done.skipped {
        say!("skipped {why}");
    }
    if done.imported.is_empty() {
        say!("nothing to import into {file}");
        return Ok(ExitCode::SUCCESS);
    }
    say!("{} server(s) into {file}", done.imported.len());
    Ok(if report(&done.rewrite, opts.dry_run) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
