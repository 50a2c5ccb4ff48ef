//! The skills directories of `[skills] dirs`: a [`SkillSource`] over the file system.
//!
//! Each configured directory is either one skill (it holds a `SKILL.md`) or a directory of
//! skills (each subdirectory holding a `SKILL.md` is one; its name must be the skill's name).
//! Files beside a `SKILL.md` are listed in the skill's result so the model can open them.

use std::path::{Path, PathBuf};

use quiver_registry::skill::{
    MAX_LISTED_FILES, MAX_SKILL_BYTES, Skill, SkillProblem, SkillSet, SkillSource,
};

const SKILL_FILE: &str = "SKILL.md";
/// How deep the bundled files of a skill are listed.
const MAX_DEPTH: usize = 4;

/// Skills read from directories, in the configured order.
#[derive(Debug, Clone)]
pub struct DirSkills {
    dirs: Vec<PathBuf>,
}

impl DirSkills {
    /// A source over `dirs`.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        DirSkills { dirs }
    }
}

impl SkillSource for DirSkills {
    fn load(&self) -> SkillSet {
        let mut set = SkillSet::default();
        let mut read = std::collections::HashSet::new();
        for dir in &self.dirs {
            // The same directory listed twice (or by two paths) is read once: its skills
            // are not duplicates of themselves.
            if !read.insert(dir.canonicalize().unwrap_or_else(|_| dir.clone())) {
                tracing::warn!(dir = %dir.display(), "skills directory listed twice; read once");
                continue;
            }
            load_dir(dir, &mut set);
        }
        set
    }
}

fn load_dir(dir: &Path, set: &mut SkillSet) {
    let shown = dir.display().to_string();
    if dir.join(SKILL_FILE).is_file() {
        load_skill(dir, set);
        return;
    }
    if let Some(why) = misnamed_skill_file(dir) {
        set.problems.push(SkillProblem::new(shown, why));
        return;
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            set.problems.push(SkillProblem::new(
                shown,
                format!("cannot read the skills directory: {e} (check `[skills] dirs`)"),
            ));
            return;
        }
    };
    let mut all: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    all.sort();
    let mut subdirs = Vec::new();
    for sub in all {
        if sub.join(SKILL_FILE).is_file() {
            subdirs.push(sub);
        } else if let Some(why) = misnamed_skill_file(&sub) {
            set.problems
                .push(SkillProblem::new(sub.display().to_string(), why));
        }
    }
    if subdirs.is_empty() {
        set.problems.push(SkillProblem::new(
            shown,
            format!(
                "no skill here: a skills directory holds a {SKILL_FILE}, or subdirectories that each hold one"
            ),
        ));
    }
    for sub in subdirs {
        load_skill(&sub, set);
    }
}

/// Why `dir` looks like a skill that will not be read: its `SKILL.md` is a directory, or
/// the file is named in another case (`skill.md`; the name is case-sensitive).
fn misnamed_skill_file(dir: &Path) -> Option<String> {
    let file = dir.join(SKILL_FILE);
    if file.is_dir() {
        return Some(format!(
            "{SKILL_FILE} here is a directory, not a file: a skill is a {SKILL_FILE} file with its front matter"
        ));
    }
    // There, but not a file that can be read: a link to nothing, a FIFO, a socket. Said,
    // or the skill would be missing without a word.
    if let Ok(meta) = std::fs::symlink_metadata(&file) {
        match std::fs::metadata(&file) {
            Err(e) if meta.file_type().is_symlink() => {
                return Some(format!(
                    "{SKILL_FILE} here is a link whose target cannot be read ({e}): point it at the skill's file"
                ));
            }
            Ok(target) if !target.is_file() => {
                return Some(format!(
                    "{SKILL_FILE} here is not a regular file (a FIFO, a socket or a device): a skill is a {SKILL_FILE} file with its front matter"
                ));
            }
            _ => {}
        }
    }
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n != SKILL_FILE && n.eq_ignore_ascii_case(SKILL_FILE))
        .map(|n| {
            format!(
                "found `{n}`, which is not read: name the file `{SKILL_FILE}`, in those capitals"
            )
        })
}

fn load_skill(dir: &Path, set: &mut SkillSet) {
    let file = dir.join(SKILL_FILE);
    let origin = file.display().to_string();
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    if size > MAX_SKILL_BYTES {
        set.problems.push(SkillProblem::new(
            origin,
            format!(
                "{size} bytes; a {SKILL_FILE} is at most {MAX_SKILL_BYTES} (move long material into files beside it)"
            ),
        ));
        return;
    }
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) => {
            set.problems
                .push(SkillProblem::new(origin, format!("cannot read it: {e}")));
            return;
        }
    };
    // The name the operator sees (a link named for the skill may point anywhere); a path
    // without one (`.`) is named by where it leads.
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let dir_name = dir
        .file_name()
        .or_else(|| canonical.file_name())
        .and_then(|n| n.to_str());
    match Skill::parse(&text, &origin, dir_name) {
        Ok(skill) => {
            let mut files = Files::default();
            list_files(&canonical, &canonical, 0, &mut files);
            let mut skill = skill.with_files(canonical.display().to_string(), files.names);
            // The files past the names kept are counted, not listed.
            skill.more_files += files.uncounted;
            set.skills.push(skill);
        }
        Err(reason) => set.problems.push(SkillProblem::new(origin, reason)),
    }
}

/// The files under `dir` (relative to `root`), hidden ones and the `SKILL.md` itself left
/// out; stops a little past what a skill lists, so a huge tree is not walked in full.
/// A skill's bundled files as the walk found them.
#[derive(Default)]
struct Files {
    /// The first names, sorted within each directory.
    names: Vec<String>,
    /// The files found after `names` was full.
    uncounted: usize,
}

/// The most entries one walk looks at (names kept or files counted).
const MAX_WALKED: usize = 100_000;

fn list_files(root: &Path, dir: &Path, depth: usize, out: &mut Files) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    paths.sort();
    for path in paths {
        if out.names.len() + out.uncounted >= MAX_WALKED {
            return;
        }
        // `symlink_metadata`: a link is listed, never followed (no loops).
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                list_files(root, &path, depth + 1, out);
            }
            continue;
        }
        if depth == 0 && path.file_name().is_some_and(|n| n == SKILL_FILE) {
            continue;
        }
        if out.names.len() > MAX_LISTED_FILES * 10 {
            out.uncounted += 1;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.names.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn skill_md(name: &str, description: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\nDo the {name} steps.\n")
    }

    #[test]
    fn a_directory_of_skills_loads_each_with_its_files() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("skills");
        write(
            &root.join("pdf-report/SKILL.md"),
            &skill_md("pdf-report", "Builds PDF reports."),
        );
        write(&root.join("pdf-report/scripts/build.py"), "print(1)");
        write(&root.join("pdf-report/.cache"), "x");
        write(
            &root.join("csv-clean/SKILL.md"),
            &skill_md("csv-clean", "Cleans CSV files."),
        );
        // Not a skill: no SKILL.md.
        write(&root.join("notes/readme.txt"), "x");
        let set = DirSkills::new(vec![root.clone()]).load();
        assert_eq!(set.problems, []);
        let names: Vec<&str> = set.skills.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["csv-clean", "pdf-report"]);
        assert_eq!(set.skills[1].files, ["scripts/build.py"]);
        assert_eq!(set.skills[0].files, Vec::<String>::new());
        // A directory that is itself a skill.
        let one = DirSkills::new(vec![root.join("pdf-report")]).load();
        assert_eq!(one.skills.len(), 1);
        // One listed twice, the second time by another path, is read once.
        let twice = DirSkills::new(vec![root.clone(), root.join("../skills")]).load();
        assert_eq!(
            (twice.skills.len(), twice.problems.len()),
            (2, 0),
            "{twice:?}"
        );
        // A link named for the skill, to a directory named otherwise (a versioned store).
        let store = tmp.path().join("store/pdf-report-1.2");
        std::fs::create_dir_all(store.parent().unwrap()).unwrap();
        std::fs::rename(root.join("pdf-report"), &store).unwrap();
        std::os::unix::fs::symlink(&store, root.join("pdf-report")).unwrap();
        let linked = DirSkills::new(vec![root.clone()]).load();
        assert_eq!(linked.problems, [], "{linked:?}");
        assert_eq!(linked.skills.len(), 2);
    }

    /// Past the names kept, files are counted: 1500 bundled files are 100 listed and 1400
    /// more (the walk stopped at 1001, and said 901 more).
    #[test]
    fn every_bundled_file_is_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("many");
        write(&root.join("SKILL.md"), &skill_md("many", "Has many files."));
        for i in 0..1500 {
            write(&root.join(format!("data/f{i:04}.txt")), "x");
        }
        let set = DirSkills::new(vec![root]).load();
        assert_eq!(set.skills.len(), 1, "{set:?}");
        let skill = &set.skills[0];
        assert_eq!(skill.files.len() + skill.more_files, 1500);
        assert_eq!(skill.files[0], "data/f0000.txt");
    }

    #[test]
    fn what_cannot_be_loaded_is_reported_with_its_path() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("skills");
        write(
            &root.join("wrong-dir/SKILL.md"),
            &skill_md("other-name", "Mismatched."),
        );
        write(&root.join("no-front/SKILL.md"), "Just text.\n");
        write(
            &root.join("huge/SKILL.md"),
            &"x".repeat(MAX_SKILL_BYTES as usize + 1),
        );
        write(
            &root.join("lower/skill.md"),
            &skill_md("lower", "Lower-case file."),
        );
        std::fs::create_dir_all(root.join("isdir/SKILL.md")).unwrap();
        // A link to nothing and a FIFO: each a problem, not skipped without a word.
        std::fs::create_dir_all(root.join("dangling")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("gone.md"), root.join("dangling/SKILL.md"))
            .unwrap();
        std::fs::create_dir_all(root.join("fifo")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(root.join("fifo/SKILL.md"))
            .status()
            .unwrap();
        assert!(made.success());
        // A plain folder beside the skills (shared assets) is no finding.
        std::fs::create_dir_all(root.join("assets")).unwrap();
        let empty = tmp.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let missing = tmp.path().join("missing");
        let lone = tmp.path().join("lone");
        write(&lone.join("Skill.MD"), &skill_md("lone", "Odd case."));
        let set = DirSkills::new(vec![root, empty, missing, lone]).load();
        assert!(set.skills.is_empty());
        let problems: Vec<String> = set
            .problems
            .iter()
            .map(|p| format!("{} | {}", p.origin, p.reason))
            .collect();
        assert_eq!(problems.len(), 10, "{problems:#?}");
        let has =
            |path: &str, why: &str| problems.iter().any(|p| p.contains(path) && p.contains(why));
        assert!(has("huge/SKILL.md", "at most"), "{problems:#?}");
        assert!(has("no-front/SKILL.md", "no front matter"), "{problems:#?}");
        assert!(
            has(
                "wrong-dir/SKILL.md",
                "does not match its directory `wrong-dir`"
            ),
            "{problems:#?}"
        );
        assert!(has("empty", "no skill here"), "{problems:#?}");
        assert!(
            has(
                "lower",
                "found `skill.md`, which is not read: name the file `SKILL.md`"
            ),
            "{problems:#?}"
        );
        assert!(
            has("isdir", "SKILL.md here is a directory"),
            "{problems:#?}"
        );
        assert!(has("lone", "found `Skill.MD`"), "{problems:#?}");
        assert!(
            has(
                "dangling",
                "SKILL.md here is a link whose target cannot be read"
            ),
            "{problems:#?}"
        );
        assert!(
            has("fifo", "SKILL.md here is not a regular file"),
            "{problems:#?}"
        );
        assert!(
            !problems.iter().any(|p| p.contains("assets")),
            "{problems:#?}"
        );
        assert!(
            has("missing", "cannot read the skills directory"),
            "{problems:#?}"
        );
    }
}
