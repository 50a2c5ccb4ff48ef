use serde_json::Value;
use sha2::{Digest, Sha256};

/// Serializes a JSON value with object keys sorted at every depth, so equal arguments hash
/// equally whatever order the model wrote them in.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(64);
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 and the punctuation added here is ASCII.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            out.push(b'{');
            if map.len() == 1 {
                if let Some((key, item)) = map.iter().next() {
                    write_entry(key, item, out);
                }
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_entry(key, item, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        // Writing into a Vec cannot fail, and scalars always serialize.
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

fn write_entry(key: &str, item: &Value, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
    write_canonical(item, out);
}

/// A stable 16-hex-character fingerprint of a call: SHA-256 over the tool name and the
/// canonical (sorted-key) JSON of its arguments. Used for repeat and loop detection.
pub fn args_hash(name: &str, args: &Value) -> String {
    args_hash_canonical(name, &canonical_json(args))
}

/// [`args_hash`] over arguments already in canonical form (see [`canonical_json`]).
pub fn args_hash_canonical(name: &str, canonical_args: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update([0u8]);
    hasher.update(canonical_args.as_bytes());
    let digest = hasher.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(16);
    for byte in &digest[..8] {
        hex.push(HEX[(byte >> 4) as usize] as char);
        hex.push(HEX[(byte & 0xf) as usize] as char);
    }
    hex
}

/// A fingerprint of a secret (an admin token): SHA-256 over a fixed prefix and the
/// secret, 64 hex characters. What a login keeps in place of the token, so a store several
/// replicas share holds no secret; a token is long and random, so its fingerprint cannot be
/// turned back into it.
pub fn secret_fingerprint(secret: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"quiver secret fingerprint\0");
    hasher.update(secret.as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a = json!({"b": 1, "a": {"y": [1, {"q": 2, "p": 1}], "x": null}});
        let b = json!({"a": {"x": null, "y": [1, {"p": 1, "q": 2}]}, "b": 1});
        assert_eq!(args_hash("t", &a), args_hash("t", &b));
        assert_eq!(args_hash("t", &a).len(), 16);
        // SHA-256 over `t`, a NUL, and the canonical JSON, as 16 lower-case hex characters.
        assert_eq!(args_hash("t", &json!({"a": 1})), "916fd2169e5f45d0");
        assert_ne!(args_hash("t", &a), args_hash("u", &a));
        assert_ne!(
            args_hash("t", &json!({"b": 2})),
            args_hash("t", &json!({"b": 1}))
        );
        assert_eq!(
            canonical_json(&json!({"b": "x", "a": 1})),
            r#"{"a":1,"b":"x"}"#
        );
        // Escapes and numbers are written exactly as serde_json writes them.
        assert_eq!(
            canonical_json(&json!({"q\"é\n": [1.5, -0.0, null, true], "": {}})),
            r#"{"":{},"q\"é\n":[1.5,-0.0,null,true]}"#
        );
    }
}
