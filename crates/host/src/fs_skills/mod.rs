//! The file-system adapter of the registry's [`SkillSource`] port: skills read from
//! directories of `SKILL.md` bundles, and local command files.
//!
//! Each configured directory is either one skill (it holds a `SKILL.md`) or a directory of
//! skills (each subdirectory holding a `SKILL.md` is one; its name must be the skill's name).
//! [`DirSkills::load`] takes the snapshot: every skill's metadata, body and asset inventory
//! (the files beside its `SKILL.md`, by name relative to it). Paths stay inside this module:
//! what crosses the port is names and text. An asset's bytes are read when it is asked for,
//! through the same rules the inventory was made by (no link followed, a regular file), and
//! checked as any source's are (`asset_text`).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use quiver_registry::skill::{
    MAX_SKILL_BYTES, Skill, SkillAsset, SkillError, SkillMeta, SkillProblem, SkillSource,
    SkillTier, validate_asset_name,
};

mod commands;
mod walk;

pub use commands::load_commands;

const SKILL_FILE: &str = "SKILL.md";

/// One skill of the snapshot.
#[derive(Debug, Clone)]
struct Bundle {
    meta: SkillMeta,
    body: String,
    /// The `SKILL.md` path, for the operator's messages.
    origin: String,
    /// The skill's directory, resolved: assets are read under it.
    root: PathBuf,
    assets: Vec<SkillAsset>,
}

/// What loading found: the skills, in the configured order, and what could not be loaded.
#[derive(Debug, Default)]
struct SkillSet {
    skills: Vec<Bundle>,
    problems: Vec<SkillProblem>,
}

/// The skills of one tier's directories, as they were when [`DirSkills::load`] read them.
#[derive(Debug, Clone)]
pub struct DirSkills {
    tier: SkillTier,
    skills: Vec<Bundle>,
    problems: Vec<SkillProblem>,
}

impl DirSkills {
    /// Reads `dirs` now, in order, stamping each skill with `tier`. A skill whose name an
    /// earlier one of these directories took is left out and reported; so is what cannot
    /// be loaded.
    pub fn load(tier: SkillTier, dirs: &[PathBuf]) -> Self {
        let mut set = SkillSet::default();
        let mut read = std::collections::HashSet::new();
        for dir in dirs {
            // The same directory listed twice (or by two paths) is read once: its skills
            // are not duplicates of themselves.
            if !read.insert(dir.canonicalize().unwrap_or_else(|_| dir.clone())) {
                tracing::warn!(dir = %dir.display(), "skills directory listed twice; read once");
                continue;
            }
            load_dir(dir, tier, &mut set);
        }
        let mut skills: Vec<Bundle> = Vec::new();
        for skill in set.skills {
            if let Some(first) = skills.iter().find(|k| k.meta.name == skill.meta.name) {
                set.problems.push(SkillProblem::new(
                    skill.origin.clone(),
                    format!(
                        "a skill named `{}` was already loaded from {}: this one is left out",
                        skill.meta.name, first.origin
                    ),
                ));
                continue;
            }
            skills.push(skill);
        }
        DirSkills {
            tier,
            skills,
            problems: set.problems,
        }
    }

    /// The tier its skills are stamped with.
    pub fn tier(&self) -> SkillTier {
        self.tier
    }

    /// What could not be loaded, or was left out, with the file or directory it is about.
    pub fn problems(&self) -> &[SkillProblem] {
        &self.problems
    }

    /// The `SKILL.md` skill `name` was read from, for the operator's messages.
    pub fn origin(&self, name: &str) -> Option<&str> {
        self.find(name).map(|b| b.origin.as_str())
    }

    /// How long skill `name`'s instructions are, in characters.
    pub fn instructions_chars(&self, name: &str) -> Option<usize> {
        self.find(name).map(|b| b.body.chars().count())
    }

    fn find(&self, name: &str) -> Option<&Bundle> {
        self.skills.iter().find(|b| b.meta.name == name)
    }

    fn bundle(&self, name: &str) -> Result<&Bundle, SkillError> {
        self.find(name).ok_or_else(|| SkillError::UnknownSkill {
            name: name.to_owned(),
        })
    }
}

#[async_trait]
impl SkillSource for DirSkills {
    async fn list_skills(&self) -> Result<Vec<SkillMeta>, SkillError> {
        Ok(self.skills.iter().map(|b| b.meta.clone()).collect())
    }

    async fn skill_body(&self, name: &str) -> Result<String, SkillError> {
        Ok(self.bundle(name)?.body.clone())
    }

    async fn list_assets(&self, name: &str) -> Result<Vec<SkillAsset>, SkillError> {
        Ok(self.bundle(name)?.assets.clone())
    }

    async fn read_asset(&self, skill: &str, asset: &str) -> Result<String, SkillError> {
        let bundle = self.bundle(skill)?;
        validate_asset_name(asset).map_err(|reason| SkillError::InvalidAssetName {
            asset: asset.escape_debug().to_string(),
            reason,
        })?;
        // Only what the snapshot listed: a file added since, or one the walk left out (a
        // link, a hidden file), is not an asset.
        if !bundle.assets.iter().any(|a| a.name == asset) {
            return Err(SkillError::UnknownAsset {
                skill: skill.to_owned(),
                asset: asset.to_owned(),
            });
        }
        let (root, name) = (bundle.root.clone(), asset.to_owned());
        let skill = skill.to_owned();
        tokio::task::spawn_blocking(move || walk::read_asset(&root, &skill, &name))
            .await
            .map_err(|e| SkillError::Unavailable(format!("reading the asset: {e}")))?
    }
}

fn load_dir(dir: &Path, tier: SkillTier, set: &mut SkillSet) {
    let shown = dir.display().to_string();
    if dir.join(SKILL_FILE).is_file() {
        load_skill(dir, tier, set);
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
        load_skill(&sub, tier, set);
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

fn load_skill(dir: &Path, tier: SkillTier, set: &mut SkillSet) {
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
            let (assets, more) = walk::inventory(&canonical);
            if more > 0 {
                set.problems.push(SkillProblem::new(
                    origin.clone(),
                    format!(
                        "{} assets are served; {more} more files beside it are not (at most {} a skill)",
                        assets.len(),
                        walk::MAX_ASSETS
                    ),
                ));
            }
            set.skills.push(Bundle {
                meta: SkillMeta::new(skill.name, skill.description, tier),
                body: skill.instructions,
                origin,
                root: canonical,
                assets,
            });
        }
        Err(reason) => set.problems.push(SkillProblem::new(origin, reason)),
    }
}

#[cfg(test)]
mod tests;
