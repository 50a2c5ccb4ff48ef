//! Slash commands: local command files and skills, offered to clients as prompts (MCP
//! `prompts/list` and `prompts/get`, which clients show as `/name`). A command's text is a
//! template: `$ARGUMENTS` becomes what follows the command, `$1`, `$2`, ... its words
//! ([`substitute`]).
//!
//! Precedence, first wins: a local command file, then a skill, then an upstream server's
//! prompt of the same name (the server's layer applies the last step, since upstream
//! prompts come and go while it runs). Every shadowing is reported.

use std::{collections::BTreeMap, sync::Arc};

use super::{
    MAX_DESCRIPTION, MAX_LISTED_ASSETS, SkillError, SkillMeta, SkillProblem, SkillSource,
    SkillTier, front_matter, hidden_text,
};

/// The longest command name.
const MAX_COMMAND_NAME: usize = 64;
/// How long a description taken from a command's first line is kept, in characters.
const MAX_FIRST_LINE: usize = 200;

/// Whether `name` can be a slash command: 1 to 64 ASCII letters, digits, `-`, `_` and `.`,
/// not starting with `.` or `-`. Every skill name is one.
pub fn valid_command_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_COMMAND_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with(['.', '-'])
}

/// `template` with its placeholders filled from `arguments` (what follows the command), in
/// one pass, so an argument's own `$1` is never replaced again: `$ARGUMENTS` is the
/// arguments' words joined by single spaces, `$1`, `$2`, ... (any number of digits) the
/// word at that place, or nothing past the last. Any other `$` (`$0`, `$HOME`, a lone `$`)
/// stays as written.
pub fn substitute(template: &str, arguments: &str) -> String {
    let words: Vec<&str> = arguments.split_whitespace().collect();
    let mut out = String::with_capacity(template.len() + arguments.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix("ARGUMENTS") {
            out.push_str(&words.join(" "));
            rest = tail;
            continue;
        }
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        match after[..digits].parse::<usize>() {
            Ok(n) if n >= 1 => {
                out.push_str(words.get(n - 1).copied().unwrap_or(""));
                rest = &after[digits..];
            }
            // A number too large for a place is past the last word.
            Err(_) if digits > 0 => rest = &after[digits..],
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A local command file: `<name>.md`, an optional front matter (`description`,
/// `argument-hint`; other keys are the client's and ignored), then the prompt's template.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlashCommand {
    /// The name clients show as `/name`.
    pub name: String,
    /// One line: the front matter's `description`, else the template's first line.
    pub description: String,
    /// What the arguments are, when the file says (`argument-hint`).
    pub argument_hint: Option<String>,
    /// The template ([`substitute`]).
    pub template: String,
    /// Where it came from, for the operator's messages.
    pub origin: String,
}

impl SlashCommand {
    /// Parses the text of command file `origin` named `name`.
    pub fn parse(name: &str, text: &str, origin: &str) -> Result<SlashCommand, String> {
        if !valid_command_name(name) {
            return Err(format!(
                "`{name}` cannot be a command name: 1 to {MAX_COMMAND_NAME} letters, digits, `-`, `_` and `.`, not starting with `.` or `-` (rename the file)"
            ));
        }
        let (fields, body) = match front_matter(text)? {
            Some((fields, at)) => (fields, &text.strip_prefix('\u{feff}').unwrap_or(text)[at..]),
            None => (
                serde_norway::Mapping::new(),
                text.strip_prefix('\u{feff}').unwrap_or(text),
            ),
        };
        let field = |key: &str| -> Result<Option<String>, String> {
            match fields.get(key) {
                None | Some(serde_norway::Value::Null) => Ok(None),
                Some(serde_norway::Value::String(s)) => Ok(Some(one_line(s))),
                Some(_) => Err(format!("`{key}` in the front matter must be a string")),
            }
        };
        let template = body.trim();
        if template.is_empty() {
            return Err("no prompt text: a command file holds the text sent as the prompt, below its front matter if it has one".to_owned());
        }
        let description = match field("description")? {
            Some(d) if !d.is_empty() => d,
            _ => {
                let first = template.lines().map(str::trim).find(|l| !l.is_empty());
                let first = one_line(first.unwrap_or_default());
                let mut short: String = first.chars().take(MAX_FIRST_LINE).collect();
                if short.len() < first.len() {
                    short.push('…');
                }
                short
            }
        };
        if description.chars().count() > MAX_DESCRIPTION {
            return Err(format!(
                "`description` is {} characters long; at most {MAX_DESCRIPTION}",
                description.chars().count()
            ));
        }
        let argument_hint = field("argument-hint")?.filter(|h| !h.is_empty());
        // The text first: a description taken from its first line holds what it holds.
        for (what, part, line) in [
            (
                "the prompt text holds",
                template,
                Some("of the prompt text"),
            ),
            ("`description` holds", description.as_str(), None),
            (
                "`argument-hint` holds",
                argument_hint.as_deref().unwrap_or(""),
                None,
            ),
        ] {
            if let Some(why) = hidden_text(what, part, line, "the command") {
                return Err(why);
            }
        }
        Ok(SlashCommand {
            name: name.to_owned(),
            description,
            argument_hint,
            template: template.to_owned(),
            origin: origin.to_owned(),
        })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where a local prompt comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PromptFrom {
    /// A local command file.
    Command,
    /// A skill of this tier.
    Skill(SkillTier),
}

/// One local prompt as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LocalPrompt {
    /// Its name.
    pub name: String,
    /// One line saying what it does.
    pub description: String,
    /// What its arguments are, when its file says.
    pub argument_hint: Option<String>,
    /// Where it comes from.
    pub from: PromptFrom,
}

enum Entry {
    Command(SlashCommand),
    Skill(SkillMeta),
}

/// The local prompts: command files first, then skills, one per name (see the module
/// docs). Skills are read through their [`SkillSource`] when a prompt is rendered.
pub struct PromptSet {
    entries: BTreeMap<String, Entry>,
    skills: Option<Arc<dyn SkillSource>>,
}

impl std::fmt::Debug for PromptSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptSet")
            .field("prompts", &self.entries.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl PromptSet {
    /// The prompts of `commands` (in precedence order: the first of a name wins) and of
    /// `skills`' skills; each command or skill left out is reported, with the file or
    /// skill that took its name.
    pub async fn build(
        commands: Vec<SlashCommand>,
        skills: Option<Arc<dyn SkillSource>>,
    ) -> (PromptSet, Vec<SkillProblem>) {
        let mut problems = Vec::new();
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        for command in commands {
            if let Some(Entry::Command(first)) = entries.get(&command.name) {
                problems.push(SkillProblem::new(
                    command.origin.clone(),
                    format!(
                        "command `{}` is left out: {} has that name and comes first",
                        command.name, first.origin
                    ),
                ));
                continue;
            }
            entries.insert(command.name.clone(), Entry::Command(command));
        }
        let listed = match &skills {
            Some(source) => source.list_skills().await.unwrap_or_else(|e| {
                problems.push(SkillProblem::new(
                    "skills",
                    format!("the skills could not be listed as prompts: {e}"),
                ));
                Vec::new()
            }),
            None => Vec::new(),
        };
        for skill in listed {
            match entries.get(&skill.name) {
                Some(Entry::Command(command)) => problems.push(SkillProblem::new(
                    command.origin.clone(),
                    format!(
                        "the prompt `{}` is this command file, which shadows the {} tier's skill of that name (the `skill` tool still serves the skill)",
                        skill.name, skill.tier
                    ),
                )),
                // A source lists a name once; a repeat is not a second prompt.
                Some(Entry::Skill(_)) => {}
                None => {
                    entries.insert(skill.name.clone(), Entry::Skill(skill));
                }
            }
        }
        (PromptSet { entries, skills }, problems)
    }

    /// Whether there is no local prompt.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `name` is a local prompt.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Every local prompt, by name.
    pub fn list(&self) -> Vec<LocalPrompt> {
        self.entries
            .iter()
            .map(|(name, entry)| match entry {
                Entry::Command(c) => LocalPrompt {
                    name: name.clone(),
                    description: c.description.clone(),
                    argument_hint: c.argument_hint.clone(),
                    from: PromptFrom::Command,
                },
                Entry::Skill(s) => LocalPrompt {
                    name: name.clone(),
                    description: s.description.clone(),
                    argument_hint: None,
                    from: PromptFrom::Skill(s.tier),
                },
            })
            .collect()
    }

    /// The text of prompt `name` with `arguments` substituted, or `None` when it is not a
    /// local prompt. A skill's text is its body; when it has assets, a line after it (not
    /// substituted: an asset name is never an argument) says how to read them.
    pub async fn render(&self, name: &str, arguments: &str) -> Result<Option<String>, SkillError> {
        let skill = match self.entries.get(name) {
            None => return Ok(None),
            Some(Entry::Command(c)) => return Ok(Some(substitute(&c.template, arguments))),
            Some(Entry::Skill(skill)) => skill,
        };
        let Some(source) = &self.skills else {
            return Err(SkillError::UnknownSkill {
                name: name.to_owned(),
            });
        };
        let body = source.skill_body(name).await?;
        let body = body.trim();
        let mut text = match body.is_empty() {
            true => skill.description.clone(),
            false => substitute(body, arguments),
        };
        let assets = source.list_assets(name).await?;
        if !assets.is_empty() {
            let names: Vec<&str> = assets
                .iter()
                .take(MAX_LISTED_ASSETS)
                .map(|a| a.name.as_str())
                .collect();
            text.push_str(&format!(
                "\n\n---\n\nAssets of this skill (read one with the `skill` tool: {{\"name\": \"{name}\", \"asset\": \"<asset>\"}}): {}",
                names.join(", ")
            ));
            if assets.len() > names.len() {
                text.push_str(&format!(", and {} more", assets.len() - names.len()));
            }
        }
        Ok(Some(text))
    }
}
