//! Skills: `SKILL.md` bundles in the Agent Skills layout (a YAML front matter with `name`
//! and `description`, then Markdown instructions, beside any files the instructions refer
//! to). A [`SkillSource`] loads them; [`skill_tool`] offers them to the model as one `skill`
//! tool for the catalog's `skills` family, whose call returns a skill's instructions.

use std::{collections::BTreeMap, sync::Arc};

use async_trait::async_trait;
use quiver_contract::{Alternative, CallContext, Envelope, Tool, ToolError, ToolResult, ToolSpec};
use serde_json::{Value, json};

use crate::did_you_mean;

/// The name of the tool that loads a skill.
pub(crate) const SKILL_TOOL: &str = "skill";
/// The largest `SKILL.md` a source loads.
pub const MAX_SKILL_BYTES: u64 = 256 * 1024;
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1024;

/// The longest front matter read, in bytes (its fields are short: a 1024-character
/// description is the longest).
const MAX_FRONT_MATTER: usize = 16 * 1024;

/// The deepest nesting of `[` and `{` in a front matter.
const MAX_FRONT_MATTER_NESTING: usize = 16;
/// The most bundled files a skill's result lists.
pub const MAX_LISTED_FILES: usize = 100;

/// One loaded skill.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skill {
    /// Its name: lower-case letters, digits and hyphens.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// The Markdown after the front matter.
    pub instructions: String,
    /// Where it came from (the `SKILL.md` path), for messages.
    pub origin: String,
    /// The directory its bundled files are in, if it has one.
    pub dir: Option<String>,
    /// Its bundled files, relative to `dir`, sorted (at most [`MAX_LISTED_FILES`]).
    pub files: Vec<String>,
    /// How many bundled files were not listed.
    pub more_files: usize,
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

/// What a [`SkillSource`] loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkillSet {
    /// The skills, in the source's order (the first of a name wins).
    pub skills: Vec<Skill>,
    /// What could not be loaded.
    pub problems: Vec<SkillProblem>,
}

/// Where skills come from (the host's adapter reads directories of `SKILL.md` bundles).
#[cfg_attr(feature = "mock", mockall::automock)]
pub trait SkillSource: Send + Sync {
    /// Loads every skill; what cannot be loaded is reported, not fatal.
    fn load(&self) -> SkillSet;
}

impl Skill {
    /// Parses the text of a `SKILL.md` read from `origin`. When the skill lives in a
    /// directory of its own, `dir_name` is that directory's name, which the skill's name
    /// must match (as the Agent Skills format requires).
    pub fn parse(text: &str, origin: &str, dir_name: Option<&str>) -> Result<Skill, String> {
        const LAYOUT: &str = "a SKILL.md starts with a `---` line, then `name:` and `description:` lines, then a closing `---` line, then the instructions";
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text.split_inclusive('\n');
        let first = lines.next().unwrap_or_default();
        if first.trim_end() != "---" {
            return Err(format!("no front matter: {LAYOUT}"));
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
            return Err(format!(
                "the front matter has no closing `---` line: {LAYOUT}"
            ));
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
        for (what, part) in [
            ("`description` holds", description.as_str()),
            ("the instructions hold", instructions),
        ] {
            if let (_, Some(note)) = quiver_contract::without_hidden(part) {
                let line = part
                    .lines()
                    .position(|l| l.chars().any(quiver_contract::is_hidden_in_text))
                    .map_or(1, |i| i + 1);
                let line = match part == instructions {
                    true => format!(" (line {line} of the instructions)"),
                    false => String::new(),
                };
                return Err(format!(
                    "{what} {note}{line}: a model would read them and a person reviewing the skill would not see them; remove them"
                ));
            }
        }
        Ok(Skill {
            name,
            description,
            instructions: instructions.to_owned(),
            origin: origin.to_owned(),
            dir: None,
            files: Vec::new(),
            more_files: 0,
        })
    }

    /// The skill with its bundle directory and files (relative to `dir`; at most
    /// [`MAX_LISTED_FILES`] are kept, the rest counted).
    pub fn with_files(mut self, dir: impl Into<String>, mut files: Vec<String>) -> Self {
        files.sort();
        self.more_files = files.len().saturating_sub(MAX_LISTED_FILES);
        files.truncate(MAX_LISTED_FILES);
        self.dir = Some(dir.into());
        self.files = files;
        self
    }

    /// What a call of the `skill` tool returns for it: where its files are first (a result
    /// cut at the result cap loses the instructions' tail, not where the files are).
    fn render(&self) -> String {
        let mut out = format!("# Skill `{}`\n\n", self.name);
        match &self.dir {
            Some(dir) if self.files.is_empty() => {
                out.push_str(&format!("Skill directory: {dir} (no other files)."));
            }
            Some(dir) => {
                out.push_str(&format!(
                    "Skill directory: {dir}\nFiles the instructions may refer to (relative to it): {}",
                    self.files.join(", ")
                ));
                if self.more_files > 0 {
                    out.push_str(&format!(", and {} more", self.more_files));
                }
            }
            None => out.push_str(&format!("Loaded from {}.", self.origin)),
        }
        out.push_str("\n\n---\n\n");
        if self.instructions.is_empty() {
            out.push_str("(This skill has no instructions beyond its description.)\n");
            out.push_str(&self.description);
        } else {
            out.push_str(&self.instructions);
        }
        out
    }
}

/// The `skill` tool over `skills` (the first of a name wins; the others are reported), or
/// none when there is no skill.
pub fn skill_tool(skills: Vec<Skill>) -> (Option<Arc<dyn Tool>>, Vec<SkillProblem>) {
    let mut problems = Vec::new();
    let mut kept: Vec<Skill> = Vec::new();
    for skill in skills {
        if let Some(first) = kept.iter().find(|k| k.name == skill.name) {
            problems.push(SkillProblem::new(
                skill.origin.clone(),
                format!(
                    "a skill named `{}` was already loaded from {}: this one is left out",
                    skill.name, first.origin
                ),
            ));
            continue;
        }
        kept.push(skill);
    }
    if kept.is_empty() {
        return (None, problems);
    }
    let (description, names) = listing(&kept);
    let mut name = json!({
        "type": "string",
        "description": "The skill to load, as listed in this tool's description."
    });
    match names {
        Some(names) => name["enum"] = json!(names),
        None => {
            name["description"] = json!(format!(
                "The skill to load, as listed in this tool's description; `{LIST_ALL}` lists every skill with its description."
            ))
        }
    }
    let spec = ToolSpec::new(SKILL_TOOL, description)
        .read_only()
        .with_category("skills")
        .with_schema(json!({
            "type": "object",
            "properties": {"name": name},
            "required": ["name"],
            "additionalProperties": false
        }));
    let tool = SkillTool {
        spec,
        skills: kept.into_iter().map(|s| (s.name.clone(), s)).collect(),
    };
    (Some(Arc::new(tool)), problems)
}

/// What the `skill` tool's `name` takes to list every skill, when its description cannot.
pub(crate) const LIST_ALL: &str = "?";

/// The most bytes the `skill` tool's description (and its `enum` of names) may take: a
/// definition has to fit a round's budget (16 KiB by default) beside the other tools.
/// Beyond it the descriptions are shortened, then only names are listed: a full listing of
/// ~100 skills would outgrow the round, and the tool would never be shown, anchored or not.
pub(crate) const MAX_SKILL_LISTING_BYTES: usize = 6 * 1024;

/// How long a skill's description is kept in a shortened listing, in characters.
const SHORT_DESCRIPTION_CHARS: usize = 80;

/// The `skill` tool's description, and the `enum` of names when everything fits
/// [`MAX_SKILL_LISTING_BYTES`] whole: every skill with its description; else with
/// descriptions cut short; else the names that fit, and how to list the rest
/// ([`LIST_ALL`]).
fn listing(kept: &[Skill]) -> (String, Option<Vec<String>>) {
    const HEAD: &str = "Loads the instructions of a skill: a packaged way of doing one kind of task. When the task matches a skill below, call this with the skill's name before starting, then follow what it returns.\n\nSkills:";
    let full: String = kept
        .iter()
        .map(|s| format!("\n- {}: {}", s.name, s.description))
        .collect();
    let names: Vec<String> = kept.iter().map(|s| s.name.clone()).collect();
    let enum_bytes: usize = names.iter().map(|n| n.len() + 3).sum();
    if HEAD.len() + full.len() + enum_bytes <= MAX_SKILL_LISTING_BYTES {
        return (format!("{HEAD}{full}"), Some(names));
    }
    let tail = format!(
        "\n\nCall this with `name` set to `{LIST_ALL}` for every skill with its whole description."
    );
    let short: String = kept
        .iter()
        .map(|s| {
            let mut d: String = s
                .description
                .chars()
                .take(SHORT_DESCRIPTION_CHARS)
                .collect();
            if d.len() < s.description.len() {
                d.push('…');
            }
            format!("\n- {}: {d}", s.name)
        })
        .collect();
    if HEAD.len() + short.len() + tail.len() <= MAX_SKILL_LISTING_BYTES {
        return (format!("{HEAD}{short}{tail}"), None);
    }
    let mut out = String::from(HEAD);
    out.push(' ');
    let mut listed = 0;
    for (i, n) in names.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        if out.len() + sep.len() + n.len() + tail.len() + 40 > MAX_SKILL_LISTING_BYTES {
            break;
        }
        out.push_str(sep);
        out.push_str(n);
        listed += 1;
    }
    if listed < names.len() {
        out.push_str(&format!(", and {} more", names.len() - listed));
    }
    out.push('.');
    out.push_str(&tail);
    (out, None)
}

struct SkillTool {
    spec: ToolSpec,
    skills: BTreeMap<String, Skill>,
}

#[async_trait]
impl Tool for SkillTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// It renders a skill's text; it never asks the client.
    fn reaches_client(&self) -> bool {
        false
    }

    async fn call(&self, input: Value, _: &CallContext) -> ToolResult {
        // The dispatcher has checked the argument against the schema's enum already; this
        // answers a direct call all the same.
        let name = input.get("name").and_then(Value::as_str).unwrap_or("");
        if name == LIST_ALL && !self.skills.contains_key(name) {
            let mut out = format!("{} skills:", self.skills.len());
            for s in self.skills.values() {
                out.push_str(&format!("\n- {}: {}", s.name, s.description));
            }
            return Ok(Envelope::text(out));
        }
        match self.skills.get(name) {
            Some(skill) => Ok(Envelope::text(skill.render())),
            None => {
                let names: Vec<&str> = self.skills.keys().map(String::as_str).collect();
                let alternatives: Vec<Alternative> = did_you_mean(name, names.iter().copied(), 3)
                    .into_iter()
                    .map(|(label, score)| Alternative::new(label, score))
                    .collect();
                Err(ToolError::schema_hint(
                    format!(
                        "no skill named `{name}`; the skills are: {}",
                        names.join(", ")
                    ),
                    alternatives,
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests;
