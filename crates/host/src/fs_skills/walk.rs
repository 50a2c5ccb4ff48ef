//! A skill's assets on disk: the inventory walk, and reading one asset by the same rules.
//!
//! Links are invisible: the walk neither lists nor enters one, and a read refuses a path
//! with a link anywhere under the skill's directory, checked before and after the file is
//! opened (so a file swapped for a link meanwhile is not read). Hidden entries (`.name`),
//! anything that is not a regular file (a FIFO would block the read), the skill's own
//! `SKILL.md`, and names the registry's `validate_asset_name` refuses are not assets.

use std::{
    fs::{File, OpenOptions},
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use quiver_registry::skill::{
    MAX_ASSET_BYTES, SkillAsset, SkillError, asset_text, validate_asset_name,
};

use super::SKILL_FILE;

/// How deep under a skill's directory assets are found.
const MAX_DEPTH: usize = 4;
/// The most assets one skill serves; the files past them are counted.
pub(super) const MAX_ASSETS: usize = 1000;
/// The most entries one walk looks at (so a huge tree is not walked in full).
const MAX_WALKED: usize = 100_000;

/// The assets under `root`, sorted by name (at most [`MAX_ASSETS`]), and how many more
/// files the walk found past them.
pub(super) fn inventory(root: &Path) -> (Vec<SkillAsset>, usize) {
    let mut found = Vec::new();
    let mut walked = 0;
    walk(root, root, 0, &mut found, &mut walked);
    found.sort_by(|a: &SkillAsset, b| a.name.cmp(&b.name));
    let more = found.len().saturating_sub(MAX_ASSETS);
    found.truncate(MAX_ASSETS);
    (found, more)
}

fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<SkillAsset>, walked: &mut usize) {
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
        *walked += 1;
        if *walked > MAX_WALKED {
            return;
        }
        // `symlink_metadata`: a link is seen as a link, never followed.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                walk(root, &path, depth + 1, out, walked);
            }
            continue;
        }
        if !meta.is_file() {
            continue;
        }
        let Some(name) = path
            .strip_prefix(root)
            .ok()
            .and_then(Path::to_str)
            .map(str::to_owned)
        else {
            continue;
        };
        if name == SKILL_FILE || validate_asset_name(&name).is_err() {
            continue;
        }
        out.push(SkillAsset::new(name, meta.len()));
    }
}

/// Reads asset `name` (already validated and in the inventory) of skill `skill` under
/// `root`.
pub(super) fn read_asset(root: &Path, skill: &str, name: &str) -> Result<String, SkillError> {
    let gone = || SkillError::UnknownAsset {
        skill: skill.to_owned(),
        asset: name.to_owned(),
    };
    let unreadable = |e: std::io::Error| {
        SkillError::Unavailable(format!(
            "asset `{name}` of skill `{skill}` cannot be read: {e}"
        ))
    };
    let path = no_links(root, name).ok_or_else(gone)?;
    // No link followed at the last step, and no wait on a FIFO put there meanwhile.
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => gone(),
            _ => unreadable(e),
        })?;
    let opened = file.metadata().map_err(unreadable)?;
    // The path still leads, link-free, to the file opened.
    let now = no_links(root, name).ok_or_else(gone)?;
    let there = std::fs::symlink_metadata(&now).map_err(unreadable)?;
    if !opened.is_file() || (opened.dev(), opened.ino()) != (there.dev(), there.ino()) {
        return Err(gone());
    }
    if opened.len() > MAX_ASSET_BYTES {
        return Err(SkillError::TooLarge {
            asset: name.to_owned(),
            bytes: opened.len(),
            cap: MAX_ASSET_BYTES,
        });
    }
    let mut bytes = Vec::with_capacity(opened.len() as usize);
    // One byte past the cap: a file that grew since its size was read is refused whole too.
    file.take(MAX_ASSET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    asset_text(name, bytes)
}

/// `root` joined with `name`, when no step of it under `root` is a link and it ends at a
/// regular file.
fn no_links(root: &Path, name: &str) -> Option<PathBuf> {
    let mut path = root.to_path_buf();
    let segments: Vec<&str> = name.split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        path.push(segment);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        let last = i + 1 == segments.len();
        if meta.file_type().is_symlink() || (last && !meta.is_file()) || (!last && !meta.is_dir()) {
            return None;
        }
    }
    Some(path)
}
