//! `quiver check`: prints the findings [`quiver_host::check`] gathers, then the summary.

use std::{path::PathBuf, process::ExitCode};

use quiver_host::{App, Config, check};

pub(crate) async fn run(
    app: &App,
    config: &Config,
    against: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let mut findings = check::findings(app, config);
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
