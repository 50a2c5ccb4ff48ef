//! URI templates (RFC 6570) as the passthrough matches them: whether a URI is an expansion
//! of a server's template, for routing a read no listing named.

/// Whether `uri` is an expansion of the RFC 6570 `template`: each `{var}` matches one or
/// more characters other than `/` (`{+var}` and `{#var}` any), `{?..}` and `{&..}` the rest.
///
/// The pieces are matched left to right over the set of URI positions the pieces so far can
/// end at, so the work is at most (pieces x URI length) however many variables stand side by
/// side (a backtracking match is exponential in them, and this runs under a lock on the
/// runtime, for a URI a client chose).
pub(super) fn template_matches(template: &str, uri: &str) -> bool {
    enum Piece<'a> {
        Lit(&'a str),
        Var { slash: bool, rest: bool },
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Lit(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let expr = &rest[open + 1..open + close];
        let op = expr.chars().next().unwrap_or(' ');
        pieces.push(Piece::Var {
            slash: matches!(op, '+' | '#'),
            rest: matches!(op, '?' | '&'),
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Lit(rest));
    }
    let bytes = uri.as_bytes();
    let n = bytes.len();
    // `at[p]`: the pieces so far can match `uri[..p]` (always at a character boundary).
    let mut at = vec![false; n + 1];
    at[0] = true;
    for (i, piece) in pieces.iter().enumerate() {
        let mut next = vec![false; n + 1];
        match piece {
            Piece::Lit(l) => {
                for p in (0..=n).filter(|&p| at[p]) {
                    if bytes[p..].starts_with(l.as_bytes()) {
                        next[p + l.len()] = true;
                    }
                }
            }
            Piece::Var { rest: true, .. } => {
                return i + 1 == pieces.len() && at.contains(&true);
            }
            Piece::Var { slash, .. } => {
                // Whether a match of the pieces so far ends before `q` with no `/` since.
                let mut open = false;
                for q in 0..=n {
                    if q > 0 && !slash && bytes[q - 1] == b'/' {
                        open = false;
                    }
                    if open && uri.is_char_boundary(q) {
                        next[q] = true;
                    }
                    if at[q] {
                        open = true;
                    }
                }
            }
        }
        if !next.contains(&true) {
            return false;
        }
        at = next;
    }
    at[n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_their_expansions_only() {
        assert!(template_matches(
            "test://template/{id}/data",
            "test://template/123/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template/1/2/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template//data"
        ));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(template_matches(
            "db://{table}{?limit}",
            "db://users?limit=5"
        ));
        assert!(!template_matches("db://{table}", "other://users"));
        assert!(template_matches("x://fixed", "x://fixed"));
        assert!(template_matches("x://{a}{b}", "x://ab"));
        assert!(!template_matches("x://{a}{b}", "x://a"));
        assert!(template_matches("x://{a}/{b}", "x://é/ü"));
        assert!(!template_matches("x://{a}", "x://"));
    }

    /// Many variables side by side against a URI that almost matches: backtracking tried
    /// every split (minutes for 8 variables and 56 characters); this answers at once. The
    /// thread and its generous wait are only a hang guard.
    #[test]
    fn adjacent_variables_do_not_explode() {
        let cases = [
            ("x://{+a}{+b}{+c}{+d}{+e}{+f}{+g}{+h}#".to_owned(), 56),
            (format!("x://{}#", "{+v}".repeat(40)), 4000),
            (format!("x://{}/#", "{v}".repeat(40)), 4000),
        ];
        for (template, len) in cases {
            let (tx, rx) = std::sync::mpsc::channel();
            let t = template.clone();
            std::thread::spawn(move || {
                let uri = format!("x://{}", "a".repeat(len));
                let miss = template_matches(&t, &uri);
                let hit = template_matches(&t, &format!("{uri}/#"));
                let _ = tx.send((miss, hit));
            });
            let (miss, hit) = rx
                .recv_timeout(std::time::Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("{template} against {len} characters did not finish"));
            assert!(!miss, "{template} matched a URI without its last literal");
            assert!(hit, "{template} did not match its expansion");
        }
    }
}
