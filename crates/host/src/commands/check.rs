//! `quiver check`: prints the findings [`quiver_host::check`] gathers, then the summary.

use std::{path::PathBuf, process::ExitCode};

use quiver_host::{App, Config, check};

pub(crate) async fn run(
    app: &App,
    config: &Config,
    against: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let mut findings = check::findings(app, config);
    // A configured model that cannot be loaded leaves `tool_search` lexical: the check says
    // so (loading it takes a moment, and only with `[search] model_dir`).
    if let (Some(dir), quiver_host::SearchMode::Broken(why)) = (
        &config.search.model_dir,
        quiver_host::search_mode(config).await,
    ) {
        findings.push(quiver_contract::Finding::error(format!(
            "[search] model_dir {}: [cannot load] {why}; until it loads, tool_search is lexical",
            dir.display()
        )));
    }
    // A wrong `issuer` fails every user's first request and nothing before: the provider
    // is asked now.
    if let Some(oidc) = &config.auth.oidc
        && let Some((why, _)) =
            quiver_host::identity::oidc_problem(oidc, std::time::Duration::from_secs(10)).await
    {
        findings.push(quiver_contract::Finding::error(format!(
            "[auth.oidc] issuer {}: [tokens cannot be checked] {why}",
            oidc.issuer
        )));
    }
    for f in &findings {
        say!("{f}");
    }
    if let Some(db) = &against {
        let compared = check::against(app, config, db).await?;
        for f in &compared {
            say!("{f}");
        }
        findings.extend(compared);
    }
    say!(
        "{}",
        check::summary(&findings, app.catalog.len(), against.is_some())
    );
    Ok(if check::passes(&findings) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
