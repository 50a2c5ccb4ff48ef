//! Skills used as prompts through `quiver serve`, with the official Python MCP client
//! (`tests/fixtures/mcp_server/skill_prompts.py`): skills of two tiers and a command file
//! as prompts, `$ARGUMENTS`/`$1` substituted, a command file shadowing a skill and a skill
//! shadowing an upstream prompt (server-everything with `bare_prompts`), the project tier
//! behind `--trust-project`, and an asset read through the `skill` tool.

use std::path::Path;

use crate::mcp_server::{Server, fresh_dir, peers, quiver_binary, run_script};

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("the directory is made");
    std::fs::write(path, text).expect("the file is written");
}

fn skill(dir: &Path, name: &str, description: &str, body: &str) {
    write(
        &dir.join(name).join("SKILL.md"),
        &format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n"),
    );
}

/// A working directory with `quiver.toml` and the skills and command file the script
/// expects; server-everything upstream (bare prompt names) when `upstream`.
fn workspace(upstream: bool) -> std::path::PathBuf {
    let dir = fresh_dir();
    let explicit = dir.join("skills");
    skill(
        &explicit,
        "pdf-report",
        "Builds a PDF report from Markdown.",
        "Build $1 as a PDF (options: $ARGUMENTS).",
    );
    write(
        &explicit.join("pdf-report/references/style.md"),
        "Use serif headings.\n",
    );
    skill(
        &explicit,
        "simple-prompt",
        "A local prompt named as server-everything's.",
        "The local simple prompt.",
    );
    let project = dir.join(".claude/skills");
    skill(
        &project,
        "project-lint",
        "Lints the project.",
        "Lint $1 the project's way.",
    );
    skill(
        &project,
        "review",
        "Reviews as the project does.",
        "Project review.",
    );
    write(
        &dir.join("commands/review.md"),
        "---\ndescription: Reviews a file.\n---\nReview $1 as the command file says.\n",
    );
    let mut toml = String::from(
        "[skills]\ndirs = [\"skills\"]\nproject_dirs = [\".claude/skills\"]\ncommands_dirs = [\"commands\"]\n",
    );
    if upstream {
        let everything = peers().join("npm/node_modules/.bin/mcp-server-everything");
        assert!(
            everything.exists(),
            "{} is missing: run `bash .ci/setup-peers`",
            everything.display()
        );
        toml.push_str(&format!(
            "\n[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nbare_prompts = true\n",
            everything.to_string_lossy()
        ));
    }
    write(&dir.join("quiver.toml"), &toml);
    dir
}

async fn serve_and_run(dir: &Path, serve_args: &[&str], script_args: &[&str]) {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(serve_args);
    let mut server = Server::start_in(quiver_binary(), &args, dir).await;
    let mut script = vec![server.url.as_str()];
    script.extend_from_slice(script_args);
    run_script("skill_prompts.py", &script).await;
    assert!(server.terminate().await.success());
}

/// Trusted (`--trust-project`) with server-everything upstream: every precedence step.
#[tokio::test]
async fn skills_are_prompts_ahead_of_upstream_ones() {
    let dir = workspace(true);
    serve_and_run(&dir, &["--trust-project"], &["--trusted", "--upstream"]).await;
}

/// Without `--trust-project`, the project tier's skills are neither prompts nor skills.
#[tokio::test]
async fn an_untrusted_workspace_offers_no_project_prompt() {
    let dir = workspace(false);
    serve_and_run(&dir, &[], &["--untrusted"]).await;
}
