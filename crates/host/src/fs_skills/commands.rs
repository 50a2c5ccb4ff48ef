//! Local command files: `<name>.md` in the `[skills] commands_dirs`, served as prompts.

use std::path::{Path, PathBuf};

use quiver_registry::skill::{MAX_SKILL_BYTES, SkillProblem, SlashCommand};

/// The command files of `dirs`, in order (the first directory holding a name wins; the
/// prompt layer reports the others), and what could not be read. Only `*.md` regular files
/// directly in each directory are commands; a link is followed to the file it names (the
/// operator's own files, unlike a skill's assets).
pub fn load_commands(dirs: &[PathBuf]) -> (Vec<SlashCommand>, Vec<SkillProblem>) {
    let mut commands = Vec::new();
    let mut problems = Vec::new();
    for dir in dirs {
        let shown = dir.display().to_string();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                problems.push(SkillProblem::new(
                    shown,
                    format!(
                        "cannot read the commands directory: {e} (check `[skills] commands_dirs`)"
                    ),
                ));
                continue;
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        files.sort();
        for file in files {
            match load_command(&file) {
                Ok(Some(command)) => commands.push(command),
                Ok(None) => {}
                Err(reason) => problems.push(SkillProblem::new(file.display().to_string(), reason)),
            }
        }
    }
    (commands, problems)
}

/// One command file; `None` for what is not one (a directory named `x.md`).
fn load_command(file: &Path) -> Result<Option<SlashCommand>, String> {
    let meta = std::fs::metadata(file).map_err(|e| format!("cannot read it: {e}"))?;
    if meta.is_dir() {
        return Ok(None);
    }
    if !meta.is_file() {
        return Err(
            "not a regular file (a FIFO, a socket or a device): a command is a Markdown file"
                .to_owned(),
        );
    }
    if meta.len() > MAX_SKILL_BYTES {
        return Err(format!(
            "{} bytes; a command file is at most {MAX_SKILL_BYTES}",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read it: {e}"))?;
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or("the file name is not UTF-8: rename it")?;
    SlashCommand::parse(name, &text, &file.display().to_string()).map(Some)
}
