//! Skills: `SKILL.md` bundles in the Agent Skills layout (a YAML front matter with `name`
//! and `description`, then Markdown instructions, beside the assets the instructions refer
//! to). A [`SkillSource`] serves them as logical bundles: a skill's metadata, its body, and
//! its assets by slash-separated name ([`validate_asset_name`]); no file-system path crosses
//! it. [`TieredSkills`] stacks sources in four tiers ([`SkillTier`]: explicit, project, user,
//! driver, in that precedence), the project tier only for a trusted workspace;
//! [`skill_tool`] offers the skills to the model as one `skill` tool; [`PromptSet`] offers
//! them, with local command files, as slash commands (MCP prompts).

use async_trait::async_trait;

mod asset;
mod command;
mod memory;
mod tiers;
mod tool;

pub use asset::{MAX_ASSET_BYTES, MAX_ASSET_NAME_BYTES, asset_text, validate_asset_name};
pub use command::{
    LocalPrompt, PromptFrom, PromptSet, SlashCommand, substitute, valid_command_name,
};
pub use memory::MemorySkills;
pub use tiers::{Shadowed, TierReport, TieredSkills};
pub use tool::SKILL_TOOL;
pub use tool::{MAX_LISTED_ASSETS, skill_tool};

/// The largest `SKILL.md` a source loads.
pub const MAX_SKILL_BYTES: u64 = 256 * 1024;
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1024;

/// The longest front matter read, in bytes (its fields are short: a 1024-character
/// description is the longest).
const MAX_FRONT_MATTER: usize = 16 * 1024;

/// The deepest nesting of `[` and `{` in a front matter.
const MAX_FRONT_MATTER_NESTING: usize = 16;

/// Where a skill came from, which decides who wins a name two sources hold. The order of
/// the variants is the precedence, highest first: what the operator configured for this
/// run, then the workspace's own skills, then the user's, then those a driver (an agent
/// distribution or remote source the operator installed) supplies. A closed set: a source
/// never mints its own label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum SkillTier {
    /// Operator-configured directories (`[skills] dirs`).
    Explicit,
    /// The workspace's skills (`[skills] project_dirs`): loaded only when the workspace is
    /// trusted, since a cloned repository must not steer the model unasked.
    Project,
    /// The user's own skills (`[skills] user_dirs`).
    User,
    /// Skills a driver supplies (`[skills] driver_dirs`).
    Driver,
}

impl SkillTier {
    /// Every tier, highest precedence first.
    pub const ALL: [SkillTier; 4] = [
        SkillTier::Explicit,
        SkillTier::Project,
        SkillTier::User,
        SkillTier::Driver,
    ];

    /// The lower-case label (`explicit`, `project`, `user`, `driver`).
    pub fn as_str(self) -> &'static str {
        match self {
            SkillTier::Explicit => "explicit",
            SkillTier::Project => "project",
            SkillTier::User => "user",
            SkillTier::Driver => "driver",
        }
    }
}

impl std::fmt::Display for SkillTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is always known of a skill: what the `skill` tool's description lists.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkillMeta {
    /// Its name: lower-case letters, digits and hyphens; the key it is loaded by.
    pub name: String,
    /// What it does and when to use it, on one line.
    pub description: String,
    /// The tier it was admitted in.
    pub tier: SkillTier,
}

impl SkillMeta {
    /// The metadata of a skill of `tier`.
    pub fn new(name: impl Into<String>, description: impl Into<String>, tier: SkillTier) -> Self {
        SkillMeta {
            name: name.into(),
            description: description.into(),
            tier,
        }
    }
}

/// One asset of a skill, as its inventory lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkillAsset {
    /// Its logical name (`references/api.md`), valid by [`validate_asset_name`].
    pub name: String,
    /// Its size in bytes when the source was built.
    pub bytes: u64,
}

impl SkillAsset {
    /// An asset named `name` of `bytes` bytes.
    pub fn new(name: impl Into<String>, bytes: u64) -> Self {
        SkillAsset {
            name: name.into(),
            bytes,
        }
    }
}

/// Why a [`SkillSource`] could not answer. The `skill` tool turns the first three into
/// hints the model can act on, the others into errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SkillError {
    /// No skill of that name.
    #[error("no skill named `{name}`")]
    UnknownSkill {
        /// The name asked for.
        name: String,
    },
    /// The skill has no asset of that name.
    #[error("skill `{skill}` has no asset `{asset}`")]
    UnknownAsset {
        /// The skill.
        skill: String,
        /// The asset asked for.
        asset: String,
    },
    /// The asset name breaks [`validate_asset_name`]'s rules.
    #[error("`{asset}` is not an asset name: {reason}")]
    InvalidAssetName {
        /// The name asked for (with its hidden characters escaped).
        asset: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The asset is larger than [`MAX_ASSET_BYTES`]: refused whole, never cut.
    #[error("asset `{asset}` is {bytes} bytes; an asset is at most {cap}")]
    TooLarge {
        /// The asset.
        asset: String,
        /// Its size.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// The asset is not text: invalid UTF-8, or a NUL byte.
    #[error("asset `{asset}` is not text: {reason}")]
    NotText {
        /// The asset.
        asset: String,
        /// What was found.
        reason: String,
    },
    /// The source could not be read (a file gone, a remote source down).
    #[error("{0}")]
    Unavailable(String),
}

/// Where skills come from, as logical bundles: names, bodies and named assets, never a
/// path. An implementation takes its snapshot when it is built: [`SkillSource::list_skills`]
/// answers the same for its whole life, so the `skill` tool's description stays
/// byte-identical and prompt caches hold. The host's adapter reads directories of
/// `SKILL.md` bundles; [`MemorySkills`] holds them in memory.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait SkillSource: Send + Sync {
    /// Every skill, in the source's order (the first of a name is the one served).
    async fn list_skills(&self) -> Result<Vec<SkillMeta>, SkillError>;

    /// The instructions of skill `name` (its `SKILL.md` after the front matter).
    async fn skill_body(&self, name: &str) -> Result<String, SkillError>;

    /// The assets of skill `name`, sorted by name; never its `SKILL.md`.
    async fn list_assets(&self, name: &str) -> Result<Vec<SkillAsset>, SkillError>;

    /// The text of one asset of `skill`: refused when the name is invalid, not in the
    /// inventory, larger than [`MAX_ASSET_BYTES`], or not text ([`asset_text`]).
    async fn read_asset(&self, skill: &str, asset: &str) -> Result<String, SkillError>;
}

/// One parsed `SKILL.md`: what an adapter reads before it serves the skill.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skill {
    /// Its name: lower-case letters, digits and hyphens.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// The Markdown after the front matter.
    pub instructions: String,
    /// Where it came from, for the operator's messages; never shown to the model.
    pub origin: String,
}

/// A skill a source could not load, or a skill left out (a name already taken).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkillProblem {
    /// The file or directory it is about.
    pub origin: String,
    /// What is wrong, and how to fix it.
    pub reason: String,
}

impl SkillProblem {
    /// A problem with `origin`.
    pub fn new(origin: impl Into<String>, reason: impl Into<String>) -> Self {
        SkillProblem {
            origin: origin.into(),
            reason: reason.into(),
        }
    }
}

impl Skill {
    /// Parses the text of a `SKILL.md` read from `origin`. When the skill lives in a
    /// directory of its own, `dir_name` is that directory's name, which the skill's name
    /// must match (as the Agent Skills format requires).
    pub fn parse(text: &str, origin: &str, dir_name: Option<&str>) -> Result<Skill, String> {
        const LAYOUT: &str = "a SKILL.md starts with a `---` line, then `name:` and `description:` lines, then a closing `---` line, then the instructions";
        let Some((fields, body_at)) = front_matter(text)? else {
            return Err(format!("no front matter: {LAYOUT}"));
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let text_field = |key: &str| -> Result<String, String> {
            match fields.get(key) {
                None | Some(serde_norway::Value::Null) => {
                    Err(format!("the front matter has no `{key}`: {LAYOUT}"))
                }
                Some(serde_norway::Value::String(s)) => Ok(s.trim().to_owned()),
                Some(_) => Err(format!("`{key}` in the front matter must be a string")),
            }
        };
        let name = text_field("name")?;
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-')
            && !name.contains("--");
        if !valid {
            return Err(format!(
                "`name: {name}` must be 1 to {MAX_NAME} lower-case letters, digits and single hyphens, not starting or ending with a hyphen (e.g. `pdf-report`)"
            ));
        }
        if let Some(dir) = dir_name
            && dir != name
        {
            return Err(format!(
                "`name: {name}` does not match its directory `{dir}`: rename one so they are the same"
            ));
        }
        // One line: the `skill` tool lists each skill as `- name: description`, and a
        // description of several lines (`description: |`) would add lines that read as
        // other skills.
        let description = text_field("description")?
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if description.is_empty() {
            return Err(
                "`description` is empty: say what the skill does and when to use it".to_owned(),
            );
        }
        if description.chars().count() > MAX_DESCRIPTION {
            return Err(format!(
                "`description` is {} characters long; at most {MAX_DESCRIPTION} (the instructions go below the front matter)",
                description.chars().count()
            ));
        }
        // What a model reads and a person reviewing the skill would not see (tag
        // characters spelling instructions, terminal escapes, bidi controls) refuses the
        // skill, with where: a bundle from elsewhere must not smuggle text past its reviewer.
        let instructions = text[body_at..].trim();
        for (what, part, line) in [
            ("`description` holds", description.as_str(), None),
            (
                "the instructions hold",
                instructions,
                Some("of the instructions"),
            ),
        ] {
            if let Some(why) = hidden_text(what, part, line, "the skill") {
                return Err(why);
            }
        }
        Ok(Skill {
            name,
            description,
            instructions: instructions.to_owned(),
            origin: origin.to_owned(),
        })
    }
}

/// The front matter of `text` (a `---` line, YAML, a closing `---` or `...` line) parsed as
/// a mapping, and where the body starts (in `text` without a byte-order mark); `None` when
/// `text` has no front matter.
pub(crate) fn front_matter(text: &str) -> Result<Option<(serde_norway::Mapping, usize)>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Ok(None);
    }
    let mut front = String::new();
    let mut closed = None;
    let mut at = first.len();
    for line in lines {
        at += line.len();
        if matches!(line.trim_end(), "---" | "...") {
            closed = Some(at);
            break;
        }
        front.push_str(line);
    }
    let Some(body_at) = closed else {
        return Err(
            "the front matter has no closing `---` line: it starts with a `---` line, then `key: value` lines, then a closing `---` line".to_owned(),
        );
    };
    // The YAML parser takes time that grows faster than the text with nesting (a 50 KB
    // front matter of `[`s took 12 s): a front matter holds a few short fields, so a
    // long or deeply nested one is refused before it is parsed.
    if front.len() > MAX_FRONT_MATTER {
        return Err(format!(
            "the front matter is {} bytes long; at most {MAX_FRONT_MATTER} (the instructions go below the closing `---` line)",
            front.len()
        ));
    }
    let nesting = front
        .bytes()
        .scan(0usize, |depth, b| {
            match b {
                b'[' | b'{' => *depth += 1,
                b']' | b'}' => *depth = depth.saturating_sub(1),
                _ => {}
            }
            Some(*depth)
        })
        .max()
        .unwrap_or(0);
    if nesting > MAX_FRONT_MATTER_NESTING {
        return Err(format!(
            "the front matter nests `[` or `{{` {nesting} levels deep; at most {MAX_FRONT_MATTER_NESTING}"
        ));
    }
    // A `Mapping` (not a map type of serde's) refuses a key given twice, at any depth:
    // with last-wins, a second `description:` would silently replace the first.
    let fields: serde_norway::Mapping = if front.trim().is_empty() {
        serde_norway::Mapping::new()
    } else {
        serde_norway::from_str(&front).map_err(|e| {
            let e = e.to_string();
            if e.starts_with("duplicate entry") {
                format!("the front matter gives a key twice ({e}); keep one")
            } else {
                format!("the front matter is not a YAML mapping: {e}")
            }
        })?
    };
    Ok(Some((fields, body_at)))
}

/// The sentence refusing `part` (text a model reads) when it hides characters a person
/// reviewing `whose` would not see (tag characters spelling instructions, terminal escapes,
/// bidi controls); `what` names the part, `line` (e.g. "of the instructions") adds the line.
pub fn hidden_text(what: &str, part: &str, line: Option<&str>, whose: &str) -> Option<String> {
    let (_, Some(note)) = quiver_contract::without_hidden(part) else {
        return None;
    };
    let at = part
        .lines()
        .position(|l| l.chars().any(quiver_contract::is_hidden_in_text))
        .map_or(1, |i| i + 1);
    let line = line
        .map(|of| format!(" (line {at} {of})"))
        .unwrap_or_default();
    Some(format!(
        "{what} {note}{line}: a model would read them and a person reviewing {whose} would not see them; remove them"
    ))
}

#[cfg(test)]
mod tests;
