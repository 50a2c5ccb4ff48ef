//! The one call entry point of the core: [`Surface::call`]. Every way a tool is called from
//! outside (each MCP transport, `quiver call`, `quiver search`) goes through it, so a call is
//! admitted, refused and recorded, or dispatched, the same way whichever way it came in.

use quiver_contract::{CallContext, Envelope, Mode};
use quiver_registry::Dispatcher;
use serde_json::Value;

use crate::{SessionKey, Surface};

impl Surface {
    /// Calls `name` with `input` as a round of `session` in `mode`, for the caller of `ctx`,
    /// and returns the answer.
    ///
    /// A tool the mode does not offer is refused (`forbidden`, naming the mode); a tool the
    /// catalog does not serve, or the caller may not use, gets the dispatcher's answer with
    /// look-alikes this caller is offered in this mode (hidden and absent names are answered
    /// alike). Both are recorded in the execution log like every call. Otherwise the call is
    /// a round of its session ([`Surface::admit`]) and goes through the dispatcher's
    /// pipeline. `ctx.session` is set to `session`.
    pub async fn call(
        &self,
        dispatcher: &Dispatcher,
        session: &SessionKey,
        mode: Mode,
        name: &str,
        input: Value,
        mut ctx: CallContext,
    ) -> Envelope {
        ctx.session = Some(session.as_arc().clone());
        match self.admit(dispatcher, session.as_str(), name, mode, &ctx) {
            Some(refusal) => dispatcher.refuse(name, input, ctx, refusal).await,
            None => dispatcher.call(name, input, ctx).await,
        }
    }

    /// [`Surface::call`] with the arguments as JSON text (`quiver call NAME JSON`): empty
    /// text is `{}`. Text that is not JSON is the dispatcher's to explain and is no round
    /// of the session, but a tool the mode refuses, or a name the caller cannot call, is
    /// still answered as such first; such a refusal is recorded with the text as sent.
    pub async fn call_text(
        &self,
        dispatcher: &Dispatcher,
        session: &SessionKey,
        mode: Mode,
        name: &str,
        text: &str,
        mut ctx: CallContext,
    ) -> Envelope {
        ctx.session = Some(session.as_arc().clone());
        let parsed = if text.trim().is_empty() {
            Ok(Value::Object(serde_json::Map::new()))
        } else {
            serde_json::from_str::<Value>(text)
        };
        let refusal = match &parsed {
            Ok(_) => self.admit(dispatcher, session.as_str(), name, mode, &ctx),
            Err(_) => self.refusal(dispatcher, name, mode, &ctx),
        };
        match refusal {
            Some(refusal) => {
                let input = parsed.unwrap_or_else(|_| Value::String(text.to_owned()));
                dispatcher.refuse(name, input, ctx, refusal).await
            }
            None => dispatcher.call_json(name, text, ctx).await,
        }
    }
}
