/// Ranks `candidates` by similarity to `wanted` and returns up to `limit` of them with a score
/// in 0..=1, best first, ties by name. Used for every "did you mean".
pub fn did_you_mean<'a>(
    wanted: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    limit: usize,
) -> Vec<(String, f64)> {
    // No name is longer than this: nothing to suggest, and comparing kilobytes of input
    // with every name would cost seconds.
    if wanted.len() > quiver_contract::MAX_NAME_BYTES {
        return Vec::new();
    }
    let wanted_l = wanted.to_lowercase();
    let mut scored: Vec<(String, f64)> = candidates
        .into_iter()
        .filter_map(|c| {
            let cl = c.to_lowercase();
            // What the two names share up to a `__` (`mcp__everything__`) is one server, not
            // a likeness: the rest is compared, or every tool of the server would be alike.
            let shared = shared_prefix(&wanted_l, &cl);
            let (a, b) = (&wanted_l[shared..], &cl[shared..]);
            let mut score = strsim::jaro_winkler(a, b);
            // Jaro-Winkler rates names that share a letter or two and little else high
            // (`foo` and `floor_max`: 0.80; `read_cvs` and `write_csv`: 0.75): unless they
            // begin with three characters alike (an abbreviation: `create_pr` for
            // `create_pull_request`), half of the characters must also stay in place.
            let alike = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
            if score >= 0.75 && alike < 3 && strsim::normalized_damerau_levenshtein(a, b) < 0.5 {
                score = score.min(0.7);
            }
            // A leading word both share (`git_` of `git_reset` and `git_create_branch`,
            // `read_` of `read_file` and `read_result`) is a naming scheme, not a likeness:
            // what follows it must be alike too.
            let mut common = alike;
            while !a.is_char_boundary(common) {
                common -= 1;
            }
            let word = a[..common].rfind('_').map_or(0, |i| i + 1);
            if word > 0 && score >= 0.75 {
                let (ra, rb) = (&a[word..], &b[word..]);
                // A slip of a letter or two (`cvs` for `csv`) is still a likeness.
                let slips = strsim::damerau_levenshtein(ra, rb);
                let allowed = (ra.chars().count().min(rb.chars().count()) / 3).max(1);
                if !ra.is_empty()
                    && !rb.is_empty()
                    && strsim::jaro_winkler(ra, rb) < 0.75
                    && slips > allowed
                {
                    score = score.min(0.7);
                }
            }
            // A name that contains the wanted text, or the tail of an MCP name that equals
            // it, is a strong candidate even when the edit distance is large.
            let tail = cl.rsplit("__").next().unwrap_or(&cl);
            if tail == wanted_l {
                score = score.max(0.95);
            } else if wanted_l.len() >= 3 && (cl.contains(&wanted_l) || wanted_l.contains(tail)) {
                score = score.max(0.85);
            }
            (score >= 0.75).then(|| (c.to_owned(), (score * 100.0).round() / 100.0))
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    scored.truncate(limit);
    scored
}

/// `; did you mean `x`?` for the candidate closest to `wanted`, or nothing.
pub fn suggestion<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(wanted, candidates, 1)
        .first()
        .map(|(best, _)| format!("; did you mean `{best}`?"))
        .unwrap_or_default()
}

/// The length of the longest prefix of `a` and `b` that ends with `__`.
fn shared_prefix(a: &str, b: &str) -> usize {
    let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    // On bytes: `common` may fall inside a character both names begin alike.
    a.as_bytes()[..common]
        .windows(2)
        .rposition(|w| w == b"__")
        .map_or(0, |i| i + 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_name_is_not_like_a_long_one_that_begins_alike() {
        assert!(did_you_mean("foo", ["floor_max", "floor_min"], 3).is_empty());
        assert_eq!(
            did_you_mean("flor_max", ["floor_max", "floor_min"], 1)[0].0,
            "floor_max"
        );
        assert_eq!(did_you_mean("stor", ["store", "surface"], 1)[0].0, "store");
        // An abbreviation of a long name is still offered it.
        for (short, long) in [
            ("create_pr", "create_pull_request"),
            ("mcp__github__create_pr", "mcp__github__create_pull_request"),
        ] {
            assert_eq!(did_you_mean(short, [long], 1).len(), 1, "{short}");
        }
        assert!(did_you_mean("read_cvs", ["write_csv", "admin_csv"], 3).is_empty());
        assert_eq!(
            did_you_mean(
                "mcp__liar__preveiw",
                ["mcp__liar__preview", "mcp__liar__err"],
                3
            )
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
            ["mcp__liar__preview"]
        );
    }

    #[test]
    fn a_name_longer_than_any_name_gets_no_suggestion() {
        let long = format!("read_file{}", "x".repeat(300));
        assert!(did_you_mean(&long, ["read_file"], 3).is_empty());
        assert_eq!(did_you_mean("read_fil", ["read_file"], 3).len(), 1);
    }

    #[test]
    fn ranks_close_names_first() {
        let names = [
            "read_file",
            "write_file",
            "list_dir",
            "mcp__fs__read_file",
            "search",
        ];
        let got = did_you_mean("read_fil", names, 3);
        assert_eq!(got[0].0, "read_file");
        assert!(got.iter().any(|(n, _)| n == "mcp__fs__read_file"));
        assert!(did_you_mean("zzzz", names, 3).is_empty());
    }

    /// The prefix two names share (`mcp__everything__`) is not a likeness: a misspelt tool of
    /// a server is offered that tool, not every tool of the server.
    /// A shared leading word is a naming scheme: `git_reset` is not like `git_status`,
    /// `read_file` not like `read_result`, `describe_picture` not like `describe_tool`;
    /// a misspelling after the word still is.
    #[test]
    fn a_shared_leading_word_does_not_make_names_alike() {
        let names = [
            "mcp__git__git_create_branch",
            "mcp__git__git_status",
            "mcp__git__git_show",
            "read_result",
            "describe_tool",
        ];
        for wanted in ["mcp__git__git_reset", "read_file", "describe_picture"] {
            let got = did_you_mean(wanted, names, 3);
            assert!(got.is_empty(), "{wanted}: {got:?}");
        }
        let got = did_you_mean("mcp__git__git_stauts", names, 1);
        assert_eq!(got[0].0, "mcp__git__git_status", "{got:?}");
    }

    #[test]
    fn a_shared_server_prefix_does_not_make_names_alike() {
        let names = [
            "mcp__everything__echo",
            "mcp__everything__add",
            "mcp__everything__printEnv",
            "mcp__everything__sampleLLM",
            "mcp__everything__getTinyImage",
            "mcp__everything__longRunningOperation",
            "mcp__time__get_current_time",
        ];
        let got = did_you_mean("mcp__everything__ecoh", names, 3);
        let labels: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(labels, ["mcp__everything__echo"], "{got:?}");
        let got = did_you_mean("mcp__everything__get_tiny_image", names, 3);
        assert_eq!(got[0].0, "mcp__everything__getTinyImage", "{got:?}");
        assert_eq!(got.len(), 1, "{got:?}");
        // Names that begin with the same byte of different characters (é and è) do not
        // split a character.
        assert_eq!(did_you_mean("é__echo", ["è__echo"], 3).len(), 1);
        // A misspelt server still finds its tool.
        let got = did_you_mean("mcp__everythin__echo", names, 3);
        assert_eq!(got[0].0, "mcp__everything__echo", "{got:?}");
    }
}
