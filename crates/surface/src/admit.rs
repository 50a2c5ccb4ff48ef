//! What a caller may see and call: the mode's lists, the caller's capabilities and the
//! policies that offer no tool, applied before a call runs ([`Surface::admit`]).

use quiver_contract::{Capabilities, Mode, pattern_matches};

use crate::{Surface, surface::Settings, sync::lock};

pub(crate) fn any_match(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| pattern_matches(p, name))
}

impl Settings {
    /// Whether `name` is never offered (see
    /// [`SurfaceConfig::unoffered`](crate::SurfaceConfig::unoffered)). Never a system tool.
    pub(crate) fn unoffered(&self, name: &str) -> bool {
        !self.config.unoffered.is_empty()
            && !self.system.iter().any(|s| s == name)
            && any_match(&self.config.unoffered, name)
    }

    /// Whether the mode's lists keep `name` off. Never a system tool: the system set is
    /// resident in every mode, whatever pattern of `agentic_only` or `delegate_excluded`
    /// matches it.
    pub(crate) fn mode_excluded(&self, mode: Mode, name: &str) -> bool {
        if self.system.iter().any(|s| s == name) {
            return false;
        }
        match mode {
            Mode::Agentic => false,
            Mode::Delegate => {
                any_match(&self.config.agentic_only, name)
                    || any_match(&self.config.delegate_excluded, name)
            }
            _ => any_match(&self.config.agentic_only, name),
        }
    }
}

impl Surface {
    /// Whether `name` is never offered (see [`Settings::unoffered`]).
    pub(crate) fn unoffered(&self, name: &str) -> bool {
        self.settings().unoffered(name)
    }

    /// Whether the mode's lists keep `name` off (see [`Settings::mode_excluded`]).
    pub(crate) fn mode_excluded(&self, mode: Mode, name: &str) -> bool {
        self.settings().mode_excluded(mode, name)
    }

    /// A call of the session begins: in `quiver serve` (and `quiver call` / `quiver
    /// search`), where the surface sees no model turns, every call counts as one round of
    /// its session. Sets the session's mode first (`tool_search` and `describe_tool` filter
    /// by it, so a plan-mode caller that searches before it lists never finds a tool its mode
    /// hides) and starts a round, evicting the working-set tools idle for more than
    /// `idle_rounds`. The called `tool` is refreshed first, so a call never evicts its own
    /// tool. Returns the evicted names; one lock either way.
    pub fn begin_call(&self, session: &str, mode: Mode, tool: &str) -> Vec<String> {
        let evicted = {
            let mut sessions = lock(&self.sessions);
            match sessions.get_mut(session) {
                Some(s) => {
                    s.mode = mode;
                    s.touch(tool);
                    let evicted = s.next_round(self.config().idle_rounds);
                    s.round_evicted.clone_from(&evicted);
                    evicted
                }
                None => {
                    if mode != Mode::default() {
                        self.entry(&mut sessions, session).mode = mode;
                    }
                    Vec::new()
                }
            }
        };
        if evicted.is_empty() {
            self.round_moved(session);
        }
        self.evicted(session, evicted)
    }

    /// The mode of the session's latest composition or call (chat before the first).
    pub fn session_mode(&self, session: &str) -> Mode {
        lock(&self.sessions)
            .get(session)
            .map(|s| s.mode)
            .unwrap_or_default()
    }

    /// Whether the model of `mode` with `capabilities` may use `name` at all: live, listed
    /// in the mode, allowed to the caller, and not kept off by the mode's lists (an
    /// `agentic_only` tool outside agentic mode, a `delegate_excluded` one in delegate).
    /// `quiver serve` refuses a call of a tool that is not visible.
    pub fn visible(&self, name: &str, mode: Mode, capabilities: &Capabilities) -> bool {
        self.catalog.lookup(name).is_some_and(|e| {
            e.spec.listed_in(mode)
                && capabilities.allows(name)
                && capabilities.satisfies(&e.spec.requires)
                && !self.mode_excluded(mode, name)
        })
    }

    /// What `quiver serve` and `quiver call` do before a call of `name` runs in `session`
    /// and `mode` for the caller of `ctx`: the refusal to record instead of running it, or
    /// `None` to run it. A tool the mode does not offer is refused ([`Surface::mode_refusal`]);
    /// otherwise the call is a round of the session ([`Surface::begin_call`]), and a tool the
    /// catalog does not serve, or the caller may not use, gets the dispatcher's answer with
    /// look-alikes this caller is [offered](Surface::offered) in this mode: hidden and absent
    /// names are answered alike.
    pub fn admit(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        session: &str,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        if let Some(refusal) = self.refused_in_mode(dispatcher, name, mode, ctx) {
            return Some(refusal);
        }
        // `tool_search` and `describe_tool` filter by the session's mode: this call's.
        self.begin_call(session, mode, name);
        self.unserved(dispatcher, name, mode, ctx)
    }

    /// [`Surface::admit`]'s refusals for a call that is no round of its session (`quiver
    /// call` with arguments that do not parse): the mode's, then the one for a tool the
    /// caller cannot call, with look-alikes of this mode (the dispatcher's own answer knows
    /// no mode, and would steer a plan-mode caller to a tool that changes things).
    pub fn refusal(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        self.refused_in_mode(dispatcher, name, mode, ctx)
            .or_else(|| self.unserved(dispatcher, name, mode, ctx))
    }

    /// The `forbidden` answer to a call of a tool `mode` does not offer.
    fn refused_in_mode(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        let caps = &ctx.capabilities;
        let why = self.mode_refusal(name, mode, caps, dispatcher.offers_search(caps))?;
        Some(quiver_contract::Envelope::err(
            quiver_contract::ErrKind::Forbidden,
            why,
        ))
    }

    /// The answer to a call of `name` the catalog does not serve or the caller may not
    /// use, with look-alikes this caller is offered in `mode`; `None` for a tool it may call.
    fn unserved(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        let caps = &ctx.capabilities;
        // A tool the caller may not use gets the same answer as one nobody serves.
        // So does one that needs a model capability the caller's model does not declare.
        if !caps.allows(name)
            || !self
                .catalog
                .lookup(name)
                .is_some_and(|e| e.spec.is_live() && caps.satisfies(&e.spec.requires))
        {
            return Some(dispatcher.undefined(name, ctx, &|n| self.offered(n, mode, caps)));
        }
        None
    }

    /// Why a call of `name` in `mode` is refused although the tool exists and the caller
    /// may use it: its mode does not list it (plan mode and a tool that can change things,
    /// an internal tool) or keeps it off. `None` when the call may go ahead (or is the
    /// dispatcher's to answer: an unknown tool, one the caller may not use). `can_search`:
    /// whether the caller has `tool_search` to turn to. `quiver serve` and `quiver call`
    /// give this refusal (as `forbidden`).
    pub fn mode_refusal(
        &self,
        name: &str,
        mode: Mode,
        capabilities: &Capabilities,
        can_search: bool,
    ) -> Option<String> {
        if !self
            .catalog
            .lookup(name)
            .is_some_and(|e| capabilities.satisfies(&e.spec.requires))
            || !capabilities.allows(name)
            || self.visible(name, mode, capabilities)
        {
            return None;
        }
        // Searching cannot bring it into this mode: say what can.
        let why = match mode {
            Mode::Plan => " Plan mode offers read-only tools only, and this one can change things: find a read-only tool that gives what the plan needs, or leave this step for when the plan is carried out.".to_owned(),
            _ => format!(
                " This mode's lists leave it out; use another tool of your tool list, or tell the user it needs another mode.{}",
                if can_search {
                    " tool_search finds the tools this mode offers."
                } else {
                    ""
                }
            ),
        };
        Some(format!(
            "`{name}` is not available in {} mode.{why}",
            mode.as_str()
        ))
    }

    /// Whether `name` is [`visible`](Self::visible) and also offered: no policy refuses it to
    /// this caller (or to everyone) whatever it sends. What a did-you-mean may name.
    pub fn offered(&self, name: &str, mode: Mode, capabilities: &Capabilities) -> bool {
        self.visible(name, mode, capabilities) && capabilities.offers(name) && !self.unoffered(name)
    }

    /// Visible names for a did-you-mean.
    pub(crate) fn visible_names(&self, mode: Mode, capabilities: &Capabilities) -> Vec<String> {
        let settings = self.settings();
        self.catalog
            .available(mode)
            .into_iter()
            .filter(|e| {
                capabilities.offers(e.name())
                    && capabilities.satisfies(&e.spec.requires)
                    && !settings.mode_excluded(mode, e.name())
                    && !settings.unoffered(e.name())
            })
            .map(|e| e.spec.name.clone())
            .collect()
    }
}
