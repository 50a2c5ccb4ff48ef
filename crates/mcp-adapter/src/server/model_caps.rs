//! The model capabilities a client declares for its own requests: the request's
//! `_meta["quiver/model_capabilities"]` (an array of names), else the
//! `Quiver-Model-Capabilities` header (names separated by commas). They add to what the
//! caller's token declares (`model_capabilities` of `[[auth.tokens]]` or of an OIDC rule): a
//! tool that `requires` a capability is offered only when the token or the client declares
//! it. A declaration is a statement about the model, not a permission: a client that claims
//! a capability its model lacks only gets tools its model cannot use.

use rmcp::ErrorData;

/// The request `_meta` field that declares the model's capabilities.
pub const MODEL_CAPABILITIES_META: &str = "quiver/model_capabilities";
/// The HTTP header that declares them when `_meta` does not.
pub const MODEL_CAPABILITIES_HEADER: &str = "quiver-model-capabilities";

const MAX_NAMES: usize = 32;
const MAX_NAME_BYTES: usize = 64;

fn invalid(what: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "{what}: declare your model's capabilities as up to {MAX_NAMES} names of 1 to {MAX_NAME_BYTES} letters, digits, `_`, `-`, `.` or `:`, as `_meta[\"{MODEL_CAPABILITIES_META}\"]: [\"vision\"]` or the header `Quiver-Model-Capabilities: vision, audio`"
        ),
        None,
    )
}

fn checked(name: &str, source: &str) -> Result<String, ErrorData> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if ok {
        Ok(name.to_owned())
    } else {
        Err(invalid(&format!(
            "{source} holds {name:?}, which is not a capability name"
        )))
    }
}

/// The capabilities a request declares, or an invalid-params error naming what is wrong.
pub(crate) fn declared(
    meta: Option<&serde_json::Value>,
    header: Option<&str>,
) -> Result<Vec<String>, ErrorData> {
    let source = format!("`_meta[\"{MODEL_CAPABILITIES_META}\"]`");
    let names: Vec<String> = match (meta, header) {
        (Some(serde_json::Value::Array(items)), _) => items
            .iter()
            .map(|v| match v {
                serde_json::Value::String(s) => checked(s, &source),
                other => Err(invalid(&format!("{source} holds {other}, not a string"))),
            })
            .collect::<Result<_, _>>()?,
        (Some(other), _) => {
            return Err(invalid(&format!("{source} is {other}, not an array")));
        }
        (None, Some(h)) => h
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| checked(s, "the `Quiver-Model-Capabilities` header"))
            .collect::<Result<_, _>>()?,
        (None, None) => Vec::new(),
    };
    if names.len() > MAX_NAMES {
        return Err(invalid(&format!(
            "{} capabilities are declared, more than {MAX_NAMES}",
            names.len()
        )));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn meta_wins_over_the_header_and_names_are_checked() {
        assert_eq!(
            declared(Some(&json!(["vision", "audio"])), Some("web_search")).unwrap(),
            ["vision", "audio"]
        );
        assert_eq!(
            declared(None, Some(" vision , audio,")).unwrap(),
            ["vision", "audio"]
        );
        assert!(declared(None, None).unwrap().is_empty());
        for (meta, header, says) in [
            (Some(json!("vision")), None, "not an array"),
            (Some(json!([1])), None, "not a string"),
            (Some(json!(["vi sion"])), None, "not a capability name"),
            (
                None,
                Some("vision;audio"),
                "the `Quiver-Model-Capabilities` header",
            ),
        ] {
            let e = declared(meta.as_ref(), header).unwrap_err();
            assert!(e.message.contains(says), "{says}: {}", e.message);
            assert!(e.message.contains("declare your model's capabilities"));
        }
        let many: Vec<String> = (0..33).map(|i| format!("c{i}")).collect();
        let e = declared(Some(&json!(many)), None).unwrap_err();
        assert!(e.message.contains("33 capabilities"), "{}", e.message);
    }
}
