//! [`MemorySkills`]: the in-memory [`SkillSource`], for tests and for embedders that hold
//! their skills as data.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::{
    SkillAsset, SkillError, SkillMeta, SkillSource, SkillTier, asset_text, validate_asset_name,
};

/// Skills held in memory, in the order they were added; each asset's bytes are checked
/// as any source's are ([`asset_text`]) when it is read.
#[derive(Debug, Clone, Default)]
pub struct MemorySkills {
    skills: Vec<Held>,
}

/// One skill: its metadata, body and assets by name.
type Held = (SkillMeta, String, BTreeMap<String, Vec<u8>>);

impl MemorySkills {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds skill `name` of `tier` with its description and body.
    pub fn with_skill(
        mut self,
        tier: SkillTier,
        name: &str,
        description: &str,
        body: &str,
    ) -> Self {
        self.skills.push((
            SkillMeta::new(name, description, tier),
            body.to_owned(),
            BTreeMap::new(),
        ));
        self
    }

    /// Adds asset `asset` to the last skill added of that name.
    ///
    /// # Panics
    /// When no skill `skill` was added: a test's setup mistake.
    pub fn with_asset(mut self, skill: &str, asset: &str, bytes: impl Into<Vec<u8>>) -> Self {
        let (_, _, assets) = self
            .skills
            .iter_mut()
            .rev()
            .find(|(m, _, _)| m.name == skill)
            .unwrap_or_else(|| panic!("no skill `{skill}` to add an asset to"));
        assets.insert(asset.to_owned(), bytes.into());
        self
    }

    fn find(&self, name: &str) -> Result<&Held, SkillError> {
        self.skills
            .iter()
            .find(|(m, _, _)| m.name == name)
            .ok_or_else(|| SkillError::UnknownSkill {
                name: name.to_owned(),
            })
    }
}

#[async_trait]
impl SkillSource for MemorySkills {
    async fn list_skills(&self) -> Result<Vec<SkillMeta>, SkillError> {
        Ok(self.skills.iter().map(|(m, _, _)| m.clone()).collect())
    }

    async fn skill_body(&self, name: &str) -> Result<String, SkillError> {
        Ok(self.find(name)?.1.clone())
    }

    async fn list_assets(&self, name: &str) -> Result<Vec<SkillAsset>, SkillError> {
        Ok(self
            .find(name)?
            .2
            .iter()
            .map(|(n, b)| SkillAsset::new(n, b.len() as u64))
            .collect())
    }

    async fn read_asset(&self, skill: &str, asset: &str) -> Result<String, SkillError> {
        let (_, _, assets) = self.find(skill)?;
        validate_asset_name(asset).map_err(|reason| SkillError::InvalidAssetName {
            asset: asset.escape_debug().to_string(),
            reason,
        })?;
        let bytes = assets.get(asset).ok_or_else(|| SkillError::UnknownAsset {
            skill: skill.to_owned(),
            asset: asset.to_owned(),
        })?;
        asset_text(asset, bytes.clone())
    }
}
