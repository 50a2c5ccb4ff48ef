//! Asset names and asset text: the rules every [`SkillSource`](super::SkillSource) applies,
//! so an asset read through any source is a relative logical name and bounded text.

use super::SkillError;

/// The largest asset a source serves, in bytes: a larger one is refused whole (a cut
/// reference file would read as complete). The result limit then bounds what one call
/// returns.
pub const MAX_ASSET_BYTES: u64 = 256 * 1024;

/// The longest asset name, in bytes.
pub const MAX_ASSET_NAME_BYTES: usize = 512;

/// The file that holds a skill's body: never one of its assets.
const SKILL_FILE: &str = "SKILL.md";

/// Checks `name` as an asset name: slash-separated segments relative to the skill (such as
/// `references/api.md`). Refused: an empty name or segment, a `.` or `..` segment, a leading
/// `/`, a `\`, NUL, a control character, a line or paragraph separator (U+0085, U+2028,
/// U+2029), characters that hide text (bidi controls, tag characters), `SKILL.md` itself
/// (the skill's body), and names longer than [`MAX_ASSET_NAME_BYTES`]. The error says which
/// rule, for the model.
pub fn validate_asset_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".to_owned());
    }
    if name.len() > MAX_ASSET_NAME_BYTES {
        return Err(format!(
            "it is {} bytes long; at most {MAX_ASSET_NAME_BYTES}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|&c| forbidden(c)) {
        let what = match c {
            '\0' => "a NUL".to_owned(),
            '\\' => "a `\\` (segments are separated by `/`)".to_owned(),
            '\u{85}' | '\u{2028}' | '\u{2029}' => format!("a line separator (U+{:04X})", c as u32),
            c if c.is_control() => format!("a control character (U+{:04X})", c as u32),
            c => format!("a character that hides text (U+{:04X})", c as u32),
        };
        return Err(format!("it holds {what}"));
    }
    if name.starts_with('/') {
        return Err("it starts with `/`: an asset name is relative to the skill".to_owned());
    }
    for segment in name.split('/') {
        match segment {
            "" => {
                return Err(
                    "it has an empty segment (`//`, or a `/` at the end): name a file".to_owned(),
                );
            }
            "." | ".." => {
                return Err(format!(
                    "it has a `{segment}` segment: an asset name stays inside the skill"
                ));
            }
            _ => {}
        }
    }
    if name == SKILL_FILE {
        return Err(format!(
            "{SKILL_FILE} is the skill's body, not an asset: call the skill tool with the skill's name alone"
        ));
    }
    Ok(())
}

/// Characters no asset name holds.
fn forbidden(c: char) -> bool {
    matches!(c, '\\' | '\u{85}' | '\u{2028}' | '\u{2029}')
        || c.is_control()
        || quiver_contract::is_hidden_in_text(c)
}

/// The text of asset `asset` from its bytes: refused whole when longer than
/// [`MAX_ASSET_BYTES`], when it holds a NUL byte, or when it is not UTF-8 (saying at which
/// byte).
pub fn asset_text(asset: &str, bytes: Vec<u8>) -> Result<String, SkillError> {
    let size = bytes.len() as u64;
    if size > MAX_ASSET_BYTES {
        return Err(SkillError::TooLarge {
            asset: asset.to_owned(),
            bytes: size,
            cap: MAX_ASSET_BYTES,
        });
    }
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(SkillError::NotText {
            asset: asset.to_owned(),
            reason: format!("it holds a NUL byte (at byte {at})"),
        });
    }
    String::from_utf8(bytes).map_err(|e| SkillError::NotText {
        asset: asset.to_owned(),
        reason: format!(
            "it is not UTF-8 (an invalid sequence at byte {})",
            e.utf8_error().valid_up_to()
        ),
    })
}
