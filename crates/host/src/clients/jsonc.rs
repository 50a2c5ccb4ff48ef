//! JSON with comments and trailing commas (JSONC, which VS Code's `mcp.json` allows) made
//! plain JSON, every comment and dropped comma replaced by spaces (a newline kept), so
//! serde_json's line and column of an error are the file's.

/// `text` with `//` and `/* */` comments and trailing commas (a `,` before `}` or `]`)
/// blanked out; strings are left as they are.
pub(crate) fn to_json(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    // The last `,` outside strings and comments with only blanks after it so far.
    let mut comma: Option<usize> = None;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                comma = None;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out[i] = b' ';
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |e| i + 2 + e + 2);
                for (j, b) in out.iter_mut().enumerate().take(end).skip(i) {
                    if bytes[j] != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            b',' => {
                comma = Some(i);
                i += 1;
            }
            b'}' | b']' => {
                if let Some(c) = comma.take() {
                    out[c] = b' ';
                }
                i += 1;
            }
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                comma = None;
                i += 1;
            }
        }
    }
    // Only ASCII bytes were replaced, by ASCII spaces, so the text is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::to_json;

    #[test]
    fn comments_and_trailing_commas_become_spaces_and_strings_stay() {
        let text =
            "{\n  // servers\n  \"a\": \"http://x/*y*/\", /* note */\n  \"b\": [1, 2,],\n}\n";
        let plain = to_json(text);
        assert_eq!(plain.len(), text.len());
        assert_eq!(plain.lines().count(), text.lines().count());
        let v: serde_json::Value = serde_json::from_str(&plain).expect(&plain);
        assert_eq!(v["a"], "http://x/*y*/");
        assert_eq!(v["b"], serde_json::json!([1, 2]));
        assert_eq!(to_json("{\"a\": \"//\"}"), "{\"a\": \"//\"}");
    }
}
