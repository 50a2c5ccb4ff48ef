//! `[skills]`: where skills and command files are read, by tier, and whether the workspace
//! is trusted.

use std::path::PathBuf;

use quiver_registry::skill::SkillTier;
use serde::{Deserialize, Serialize};

/// `[skills]`. Each directory of a tier is one skill (it holds a `SKILL.md`) or holds one
/// subdirectory per skill, in the Agent Skills layout. A name held by two tiers goes to
/// the higher (explicit, then project, then user, then driver); within a tier, to the
/// directory listed first. Relative paths are relative to the directory of the file that
/// gives them. Every list defaults to none.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SkillsConfig {
    /// The explicit tier: skills the operator names for this configuration.
    pub dirs: Vec<PathBuf>,
    /// The project tier: the workspace's own skills (e.g. `.claude/skills`). Read only when
    /// the workspace is trusted (`trust_project`, or `quiver serve --trust-project`): a
    /// cloned repository's skills must not steer the model before its operator trusts it.
    pub project_dirs: Vec<PathBuf>,
    /// The user tier: the user's own skills (e.g. `~/.claude/skills`, written out).
    pub user_dirs: Vec<PathBuf>,
    /// The driver tier: skills an installed agent distribution supplies; lowest precedence.
    pub driver_dirs: Vec<PathBuf>,
    /// Trusts the workspace: the project tier loads. Default false.
    pub trust_project: bool,
    /// Directories of local command files, `<name>.md` each (as in `.claude/commands`): an
    /// optional front matter with `description` and `argument-hint`, then the prompt text,
    /// where `$ARGUMENTS`, `$1`, `$2`... take what follows the command. Served as prompts
    /// beside the skills; a command file shadows a skill of its name. The first directory
    /// listed wins a name.
    pub commands_dirs: Vec<PathBuf>,
    /// Set by `quiver serve --trust-project`: a reload keeps the trust the flag gave.
    #[serde(skip)]
    pub(crate) trusted_by_flag: bool,
}

impl SkillsConfig {
    /// Each tier's directories, highest precedence first.
    pub fn tiers(&self) -> [(SkillTier, &[PathBuf]); 4] {
        [
            (SkillTier::Explicit, &self.dirs),
            (SkillTier::Project, &self.project_dirs),
            (SkillTier::User, &self.user_dirs),
            (SkillTier::Driver, &self.driver_dirs),
        ]
    }
}

impl SkillsConfig {
    /// Trusts the workspace for this run, as `quiver serve --trust-project` does; a reload
    /// keeps it.
    pub fn trust_by_flag(&mut self) {
        self.trust_project = true;
        self.trusted_by_flag = true;
    }

    /// Every directory skills and command files are read from, whatever its tier (the
    /// project tier's too: a reload watches them all).
    pub fn all_dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.dirs
            .iter()
            .chain(&self.project_dirs)
            .chain(&self.user_dirs)
            .chain(&self.driver_dirs)
            .chain(&self.commands_dirs)
    }
}
