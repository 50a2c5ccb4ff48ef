use crate::{Envelope, ErrKind, HintKind};

/// Coerces a legacy result, plain text plus an error flag (what MCP servers and custom tools
/// produce), into an envelope. An error beginning `schema hint:` or `fetch hint:` becomes a
/// Hint of that kind; any other error becomes `Err(kind = legacy)`; success becomes an Ok
/// carrying the text.
pub fn coerce_legacy(text: &str, is_error: bool) -> Envelope {
    if !is_error {
        return Envelope::text(text);
    }
    let trimmed = text.trim_start();
    for (prefix, kind) in [
        ("schema hint:", HintKind::Schema),
        ("fetch hint:", HintKind::Fetch),
    ] {
        if trimmed.len() >= prefix.len() && trimmed[..prefix.len()].eq_ignore_ascii_case(prefix) {
            return Envelope::hint(kind, trimmed[prefix.len()..].trim(), Vec::new());
        }
    }
    let message = if text.trim().is_empty() {
        "the tool reported an error without a message"
    } else {
        text.trim()
    };
    Envelope::err(ErrKind::Legacy, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_results_coerce() {
        assert_eq!(coerce_legacy("fine", false), Envelope::text("fine"));
        assert_eq!(
            coerce_legacy("Schema hint: no column `nme`", true),
            Envelope::hint(HintKind::Schema, "no column `nme`", vec![])
        );
        assert_eq!(
            coerce_legacy("fetch hint: add a date filter", true),
            Envelope::hint(HintKind::Fetch, "add a date filter", vec![])
        );
        assert_eq!(
            coerce_legacy("disk full", true),
            Envelope::err(ErrKind::Legacy, "disk full")
        );
        assert_eq!(coerce_legacy("  ", true).err_kind(), Some(&ErrKind::Legacy));
    }
}
