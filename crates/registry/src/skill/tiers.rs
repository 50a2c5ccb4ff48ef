//! [`TieredSkills`]: skill sources stacked by [`SkillTier`], one name one skill.

use std::{collections::HashMap, sync::Arc};

use async_trait::async_trait;

use super::{SkillAsset, SkillError, SkillMeta, SkillSource, SkillTier};

/// A skill left out because a source of a higher tier (or an earlier one of the same
/// tier) holds its name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shadowed {
    /// The name both hold.
    pub name: String,
    /// The tier of the skill served.
    pub kept: SkillTier,
    /// The tier of the skill left out.
    pub dropped: SkillTier,
}

impl Shadowed {
    /// The operator's sentence for it.
    pub fn reason(&self) -> String {
        if self.kept == self.dropped {
            format!(
                "skill `{}` is left out: an earlier {} skill has that name",
                self.name, self.kept
            )
        } else {
            format!(
                "skill `{}` ({} tier) is shadowed by the {} tier's skill of that name, which is served",
                self.name, self.dropped, self.kept
            )
        }
    }
}

/// What [`TieredSkills::build`] left out, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierReport {
    /// Names held by a higher tier (or an earlier source of the same tier).
    pub shadowed: Vec<Shadowed>,
    /// Sources whose list could not be read, with why; their skills are not served.
    pub failed: Vec<(SkillTier, SkillError)>,
    /// Project-tier sources withheld because the workspace is not trusted.
    pub withheld: usize,
}

/// Sources stacked by tier: explicit, project, user, driver (the order of [`SkillTier`]),
/// sources of one tier in the order given. A name goes to the first source holding it;
/// each skill is stamped with the tier of the source that serves it, whatever the source
/// says. Project-tier sources are admitted only when the workspace is trusted
/// ([`TieredSkills::admits`]). The listing is taken once, at [`TieredSkills::build`].
pub struct TieredSkills {
    layers: Vec<(SkillTier, Arc<dyn SkillSource>)>,
    skills: Vec<SkillMeta>,
    owner: HashMap<String, usize>,
}

impl std::fmt::Debug for TieredSkills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredSkills")
            .field("skills", &self.skills)
            .finish_non_exhaustive()
    }
}

impl TieredSkills {
    /// Whether a source of `tier` is admitted: every tier but the project's always; the
    /// project's only when `trust_project` (a cloned repository's skills must not steer the
    /// model before its operator trusts it).
    pub fn admits(tier: SkillTier, trust_project: bool) -> bool {
        tier != SkillTier::Project || trust_project
    }

    /// Lists every admitted source once and stacks them; what was left out is reported.
    pub async fn build(
        sources: Vec<(SkillTier, Arc<dyn SkillSource>)>,
        trust_project: bool,
    ) -> (TieredSkills, TierReport) {
        let mut report = TierReport::default();
        let mut layers: Vec<(SkillTier, Arc<dyn SkillSource>)> = Vec::new();
        for (tier, source) in sources {
            if Self::admits(tier, trust_project) {
                layers.push((tier, source));
            } else {
                report.withheld += 1;
            }
        }
        // Stable: sources of one tier keep their order.
        layers.sort_by_key(|(tier, _)| *tier);
        let mut skills = Vec::new();
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (i, (tier, source)) in layers.iter().enumerate() {
            let listed = match source.list_skills().await {
                Ok(listed) => listed,
                Err(e) => {
                    report.failed.push((*tier, e));
                    continue;
                }
            };
            for meta in listed {
                if let Some(&first) = owner.get(&meta.name) {
                    report.shadowed.push(Shadowed {
                        name: meta.name,
                        kept: layers[first].0,
                        dropped: *tier,
                    });
                    continue;
                }
                owner.insert(meta.name.clone(), i);
                skills.push(SkillMeta {
                    tier: *tier,
                    ..meta
                });
            }
        }
        (
            TieredSkills {
                layers,
                skills,
                owner,
            },
            report,
        )
    }

    fn source(&self, name: &str) -> Result<&Arc<dyn SkillSource>, SkillError> {
        self.owner
            .get(name)
            .map(|&i| &self.layers[i].1)
            .ok_or_else(|| SkillError::UnknownSkill {
                name: name.to_owned(),
            })
    }
}

#[async_trait]
impl SkillSource for TieredSkills {
    async fn list_skills(&self) -> Result<Vec<SkillMeta>, SkillError> {
        Ok(self.skills.clone())
    }

    async fn skill_body(&self, name: &str) -> Result<String, SkillError> {
        self.source(name)?.skill_body(name).await
    }

    async fn list_assets(&self, name: &str) -> Result<Vec<SkillAsset>, SkillError> {
        self.source(name)?.list_assets(name).await
    }

    async fn read_asset(&self, skill: &str, asset: &str) -> Result<String, SkillError> {
        self.source(skill)?.read_asset(skill, asset).await
    }
}
