//! What `tool_search` and `describe_tool` do to a session: find tools in its mode and page
//! them into its working set, reporting what the next round will list.

use std::collections::HashSet;

use quiver_contract::{Capabilities, ToolSpec};

use crate::{
    FailReason, FailedTool, FoundTool, PageIn, SearchOutcome, Surface,
    compose::{Walk, paged_bytes},
    sync::lock,
};

fn cut_description(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or_default();
    const MAX: usize = 160;
    if line.len() <= MAX {
        return line.to_owned();
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", line[..end].trim_end())
}

impl Surface {
    /// What `tool_search` does: searches in the session's mode and pages the hits into its
    /// working set at once. `limit` defaults to `search_default_limit` and is capped by the
    /// working set's `max_tools`.
    pub fn tool_search(
        &self,
        session: &str,
        query: &str,
        limit: Option<usize>,
        capabilities: &Capabilities,
    ) -> SearchOutcome {
        let mode = self.session_mode(session);
        let limit = limit
            .unwrap_or(self.config().search_default_limit)
            .min(crate::config::MAX_SEARCH_LIMIT)
            .min(self.config().working_set.max_tools.max(1))
            .max(1);
        let hits = self.search(query, limit, mode, capabilities);
        let mut out = SearchOutcome::default();
        let mut page: Vec<(String, usize)> = Vec::new();
        let loaded: HashSet<String> = lock(&self.sessions)
            .get(session)
            .map(|s| s.loaded.clone())
            .unwrap_or_default();
        for hit in hits {
            let Some(entry) = self.catalog.lookup(&hit.name) else {
                out.failed.push(FailedTool {
                    name: hit.name.clone(),
                    reason: FailReason::LoadFailed,
                });
                continue;
            };
            out.hits.push(FoundTool {
                name: hit.name.clone(),
                description: cut_description(&entry.spec.description),
                score: (hit.score * 100.0).round() / 100.0,
            });
            let bytes = paged_bytes(&entry, loaded.contains(&hit.name));
            page.push((hit.name, bytes));
        }
        // What the round lists before the hits come in, to tell which tools they push off.
        let before: Vec<String> = if page.is_empty() {
            Vec::new()
        } else {
            self.walk(session, mode, capabilities, Walk::Place { until: None })
                .map(|(_, placed)| placed)
                .unwrap_or_default()
        };
        let paged = self.page_in_sized(session, &page, false);
        out.failed
            .extend(paged.over_budget.into_iter().map(|name| FailedTool {
                name,
                reason: FailReason::OverBudget,
            }));
        // This call's round evicted idle tools before the search ran: they left the list
        // too.
        out.evicted = lock(&self.sessions)
            .get_mut(session)
            .map(|s| std::mem::take(&mut s.round_evicted))
            .unwrap_or_default();
        for name in paged.evicted {
            if !out.evicted.contains(&name) {
                out.evicted.push(name);
            }
        }
        // Only what the next round will list counts as exposed: a hit the round's budget
        // cuts stays in the working set (listed once there is room) but is reported failed.
        out.exposed = paged.exposed;
        if !out.exposed.is_empty() {
            match self.walk(session, mode, capabilities, Walk::Place { until: None }) {
                Ok((_, placed)) => {
                    let listed: HashSet<&str> = placed.iter().map(String::as_str).collect();
                    let (fit, cut): (Vec<String>, Vec<String>) = std::mem::take(&mut out.exposed)
                        .into_iter()
                        .partition(|n| listed.contains(n.as_str()));
                    out.exposed = fit;
                    out.failed.extend(cut.into_iter().map(|name| FailedTool {
                        name,
                        reason: FailReason::OverBudget,
                    }));
                    // Listed before, not now, and not reported otherwise: the round's budget
                    // made room for the hits by cutting them (still callable by name).
                    out.displaced = before
                        .into_iter()
                        .filter(|n| {
                            !listed.contains(n.as_str())
                                && !out.evicted.contains(n)
                                && !out.failed.iter().any(|f| &f.name == n)
                        })
                        .collect();
                }
                Err(e) => {
                    // The next round fails as a whole: nothing found is listed.
                    tracing::warn!(session, error = %e, "tool_search could not compose the next round");
                    out.failed
                        .extend(std::mem::take(&mut out.exposed).into_iter().map(|name| {
                            FailedTool {
                                name,
                                reason: FailReason::OverBudget,
                            }
                        }));
                }
            }
        }
        out
    }

    /// What `describe_tool` does: the full spec of a visible tool, paged into the working
    /// set and marked loaded (its full spec is advertised from now on). `None` when the
    /// tool is not visible to this caller in the session's mode (including the mode's
    /// exclusion lists).
    pub fn describe(
        &self,
        session: &str,
        name: &str,
        capabilities: &Capabilities,
    ) -> Option<(ToolSpec, PageIn)> {
        let mode = self.session_mode(session);
        let entry = self.catalog.lookup(name)?;
        if !entry.spec.listed_in(mode)
            || !capabilities.offers(name)
            || !capabilities.satisfies(&entry.spec.requires)
            || self.mode_excluded(mode, name)
            || self.unoffered(name)
        {
            return None;
        }
        if self.system_tools().iter().any(|s| s == name) {
            // Always resident: paging it in would only take a working-set slot. Its full spec
            // is advertised from now on all the same.
            // Only a progressive tool's listing changes with it (summary to full spec).
            if self.with_session(session, |s| s.loaded.insert(name.to_owned()))
                && entry.spec.progressive
            {
                self.notify(session);
            }
            let paged = PageIn {
                exposed: vec![name.to_owned()],
                ..PageIn::default()
            };
            return Some((entry.spec.clone(), paged));
        }
        let mut paged = self.page_in_sized(
            session,
            &[(name.to_owned(), entry.spec.definition_bytes())],
            true,
        );
        // Loaded only if the next round lists it, measured as `tool_search` measures its
        // hits (the advertised form): a tool whose definition fits the working set but not
        // the round stays in the set and is reported over budget, not loaded.
        if paged.exposed.iter().any(|n| n == name) {
            let hits: HashSet<&str> = HashSet::from([name]);
            let listed = self
                .walk(
                    session,
                    mode,
                    capabilities,
                    Walk::Place { until: Some(hits) },
                )
                .is_ok_and(|(_, placed)| placed.iter().any(|p| p == name));
            if !listed {
                paged.exposed.retain(|n| n != name);
                paged.over_budget.push(name.to_owned());
            }
        }
        Some((entry.spec.clone(), paged))
    }
}
