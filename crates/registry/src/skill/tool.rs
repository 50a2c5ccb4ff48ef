//! The `skill` tool: the skills' names and descriptions in its description, a skill's body
//! and asset inventory for `{name}`, one asset's text for `{name, asset}`. Loading a skill
//! registers nothing: the model reads its instructions and follows them.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{
    Alternative, CallContext, Envelope, ErrKind, Tool, ToolError, ToolResult, ToolSpec,
};
use serde_json::{Value, json};

use super::{SkillError, SkillMeta, SkillSource};
use crate::did_you_mean;

/// The name of the tool that loads a skill.
pub const SKILL_TOOL: &str = "skill";

/// The most assets a skill's result lists by name (the rest are counted).
pub const MAX_LISTED_ASSETS: usize = 100;

/// The `skill` tool over `source`'s skills, or none when it has none. Its description and
/// schema are made here, once, from [`SkillSource::list_skills`]: the same listing gives the
/// same bytes, so the definition does not move from turn to turn.
pub async fn skill_tool(source: Arc<dyn SkillSource>) -> Result<Option<Arc<dyn Tool>>, SkillError> {
    let skills = source.list_skills().await?;
    if skills.is_empty() {
        return Ok(None);
    }
    let (description, names) = listing(&skills);
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
    let asset = json!({
        "type": "string",
        "description": "An asset's name from the skill's inventory (e.g. `references/api.md`): returns its text instead of the skill."
    });
    let spec = ToolSpec::new(SKILL_TOOL, description)
        .read_only()
        .with_category("skills")
        .with_schema(json!({
            "type": "object",
            "properties": {"name": name, "asset": asset},
            "required": ["name"],
            "additionalProperties": false
        }));
    Ok(Some(Arc::new(SkillTool {
        spec,
        skills,
        source,
    })))
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
fn listing(kept: &[SkillMeta]) -> (String, Option<Vec<String>>) {
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
    /// The listing the description was made from.
    skills: Vec<SkillMeta>,
    source: Arc<dyn SkillSource>,
}

impl SkillTool {
    fn meta(&self, name: &str) -> Option<&SkillMeta> {
        self.skills.iter().find(|s| s.name == name)
    }

    /// `{name}`: the inventory first (a result cut at the result limit loses the
    /// instructions' tail, not what there is to read), then the instructions.
    async fn load(&self, skill: &SkillMeta) -> ToolResult {
        let body = self.source.skill_body(&skill.name).await.map_err(failure)?;
        let assets = self
            .source
            .list_assets(&skill.name)
            .await
            .map_err(failure)?;
        let mut out = format!("# Skill `{}`\n\n", skill.name);
        if assets.is_empty() {
            out.push_str("This skill has no assets.");
        } else {
            let listed: Vec<&str> = assets
                .iter()
                .take(MAX_LISTED_ASSETS)
                .map(|a| a.name.as_str())
                .collect();
            out.push_str(&format!(
                "Assets the instructions may refer to (read one with {{\"name\": \"{}\", \"asset\": \"<asset>\"}}): {}",
                skill.name,
                listed.join(", ")
            ));
            if assets.len() > listed.len() {
                out.push_str(&format!(", and {} more", assets.len() - listed.len()));
            }
        }
        out.push_str("\n\n---\n\n");
        // `$ARGUMENTS` is filled when the skill runs as a slash command; loaded through this
        // tool, which takes none, it is nothing, not a placeholder for the model to puzzle
        // over. `$1` and the like stay: in a skill's shell examples they are the shell's.
        let body = body.replace("$ARGUMENTS", "");
        let body = body.trim();
        if body.is_empty() {
            out.push_str("(This skill has no instructions beyond its description.)\n");
            out.push_str(&skill.description);
        } else {
            out.push_str(body);
        }
        Ok(Envelope::text(out))
    }

    /// `{name, asset}`: the asset's text; a name the skill does not have is a hint with
    /// the nearest names and the inventory.
    async fn asset(&self, skill: &SkillMeta, asset: &str) -> ToolResult {
        match self.source.read_asset(&skill.name, asset).await {
            Ok(text) => Ok(Envelope::text(text)),
            Err(e @ (SkillError::UnknownAsset { .. } | SkillError::InvalidAssetName { .. })) => {
                let assets = self
                    .source
                    .list_assets(&skill.name)
                    .await
                    .map_err(failure)?;
                let names: Vec<&str> = assets.iter().map(|a| a.name.as_str()).collect();
                let alternatives: Vec<Alternative> = did_you_mean(asset, names.iter().copied(), 3)
                    .into_iter()
                    .map(|(label, score)| Alternative::new(label, score))
                    .collect();
                let what = match &e {
                    SkillError::InvalidAssetName { reason, .. } => {
                        format!("`asset` {:?} is not an asset name: {reason}", asset)
                    }
                    _ => format!("skill `{}` has no asset {:?}", skill.name, asset),
                };
                let inventory = match names.len() {
                    0 => format!(
                        "; it has no assets: call skill with {{\"name\": \"{}\"}} alone",
                        skill.name
                    ),
                    n if n <= MAX_LISTED_ASSETS => {
                        format!("; its assets are: {}", names.join(", "))
                    }
                    n => format!(
                        "; its assets include: {}, and {} more",
                        names[..MAX_LISTED_ASSETS].join(", "),
                        n - MAX_LISTED_ASSETS
                    ),
                };
                Err(ToolError::schema_hint(
                    format!("{what}{inventory}"),
                    alternatives,
                ))
            }
            Err(e) => Err(failure(e)),
        }
    }
}

/// A source's failure as the model reads it: an asset refused whole, or a source that
/// could not be read.
fn failure(e: SkillError) -> ToolError {
    match e {
        SkillError::TooLarge { .. } => ToolError::failed(format!(
            "{e}: it is not served, cut or whole (ask the operator to split it into smaller assets)"
        )),
        SkillError::NotText { .. } => {
            ToolError::failed(format!("{e}: only text assets are served"))
        }
        SkillError::Unavailable(why) => ToolError::err(
            ErrKind::NotAvailable,
            format!("the skill could not be read: {why}"),
        ),
        e => ToolError::failed(e.to_string()),
    }
}

#[async_trait]
impl Tool for SkillTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// It returns a skill's text; it never asks the client.
    fn reaches_client(&self) -> bool {
        false
    }

    async fn call(&self, input: Value, _: &CallContext) -> ToolResult {
        // The dispatcher has checked the argument against the schema's enum already; this
        // answers a direct call all the same.
        let name = input.get("name").and_then(Value::as_str).unwrap_or("");
        if name == LIST_ALL && self.meta(name).is_none() {
            let mut out = format!("{} skills:", self.skills.len());
            for s in &self.skills {
                out.push_str(&format!("\n- {}: {}", s.name, s.description));
            }
            return Ok(Envelope::text(out));
        }
        let Some(skill) = self.meta(name) else {
            let names: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
            let alternatives: Vec<Alternative> = did_you_mean(name, names.iter().copied(), 3)
                .into_iter()
                .map(|(label, score)| Alternative::new(label, score))
                .collect();
            return Err(ToolError::schema_hint(
                format!(
                    "no skill named `{name}`; the skills are: {}",
                    names.join(", ")
                ),
                alternatives,
            ));
        };
        match input.get("asset") {
            None | Some(Value::Null) => self.load(skill).await,
            Some(Value::String(asset)) => self.asset(skill, asset).await,
            Some(other) => Err(ToolError::schema_hint(
                format!("`asset` is a string naming one of the skill's assets, not {other}"),
                Vec::new(),
            )),
        }
    }
}
