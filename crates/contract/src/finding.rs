//! What `quiver check` reports: one line per finding, each computed by the crate that owns
//! the rule it checks, and a severity that says whether it fails the check and which count
//! of the summary it adds to.

use std::fmt;

use crate::{BreakingChange, LintFinding, printable};

/// How a finding weighs. Every severity but [`Severity::Note`] fails the check; each adds
/// to its own count of the summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Severity {
    /// A fault in a definition, the configuration or an upstream: counted as a finding.
    Error,
    /// A tool the catalog refused, so it is missing from every surface.
    NotRegistered,
    /// A configured name that matches nothing it could refer to (most likely a typo).
    Unmatched,
    /// A change to a stored tool definition that breaks its callers.
    Breaking,
    /// Told, not counted: the check passes with it.
    Note,
}

impl Severity {
    /// Whether a finding of this severity fails the check.
    pub fn fails(self) -> bool {
        self != Severity::Note
    }
}

/// One finding: its severity and the line that says it (`subject: [label] what to do`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// How it weighs.
    pub severity: Severity,
    /// The line, as `quiver check` prints it.
    pub text: String,
}

impl Finding {
    /// A finding of `severity`.
    pub fn new(severity: Severity, text: impl Into<String>) -> Self {
        Finding {
            severity,
            text: text.into(),
        }
    }

    /// A fault ([`Severity::Error`]).
    pub fn error(text: impl Into<String>) -> Self {
        Finding::new(Severity::Error, text)
    }

    /// A note ([`Severity::Note`]).
    pub fn note(text: impl Into<String>) -> Self {
        Finding::new(Severity::Note, text)
    }

    /// A name that matches nothing ([`Severity::Unmatched`]).
    pub fn unmatched(text: impl Into<String>) -> Self {
        Finding::new(Severity::Unmatched, text)
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<&LintFinding> for Finding {
    fn from(l: &LintFinding) -> Self {
        let at = if l.path.is_empty() {
            String::new()
        } else {
            format!(" at {}", l.path)
        };
        Finding::error(format!("{}{at}: [{}] {}", l.tool, l.rule, l.message))
    }
}

impl From<&BreakingChange> for Finding {
    /// The tool and the message are escaped: they come from stored definitions, which an
    /// upstream wrote.
    fn from(b: &BreakingChange) -> Self {
        Finding::new(
            Severity::Breaking,
            format!(
                "{}: [breaking: {}] {}",
                printable(&b.tool),
                b.kind,
                printable(&b.message)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_notes_pass() {
        assert!(!Severity::Note.fails());
        for s in [
            Severity::Error,
            Severity::NotRegistered,
            Severity::Unmatched,
            Severity::Breaking,
        ] {
            assert!(s.fails(), "{s:?}");
        }
        assert_eq!(Finding::note("x: [note] y").to_string(), "x: [note] y");
    }
}
