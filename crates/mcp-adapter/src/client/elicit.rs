//! SEP-1034: a client that accepts an elicitation without a value for a field that has a
//! default in the requested schema means that default. Quiver relays elicitations to
//! downstream clients that may not apply defaults themselves, so it fills them in before the
//! answer goes upstream.

use serde_json::{Map, Value};

/// Adds, to an accepted elicitation `result`, the schema default of every requested field the
/// answer left out. Declined or cancelled answers, and fields without defaults, are untouched.
pub(crate) fn apply_defaults(params: &Value, result: &mut Value) {
    if result.get("action").and_then(Value::as_str) != Some("accept") {
        return;
    }
    let Some(props) = params
        .pointer("/requestedSchema/properties")
        .and_then(Value::as_object)
    else {
        return;
    };
    let Some(obj) = result.as_object_mut() else {
        return;
    };
    let content = obj
        .entry("content")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(content) = content.as_object_mut() else {
        return;
    };
    for (name, prop) in props {
        if let Some(default) = prop.get("default")
            && !content.contains_key(name)
        {
            content.insert(name.clone(), default.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::apply_defaults;

    fn params() -> serde_json::Value {
        json!({"message": "m", "requestedSchema": {"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "email": {"type": "string"}
        }}})
    }

    #[test]
    fn accepted_answers_get_the_missing_defaults() {
        let mut r = json!({"action": "accept", "content": {"name": "Ada"}});
        apply_defaults(&params(), &mut r);
        assert_eq!(
            r,
            json!({"action": "accept", "content": {"name": "Ada", "age": 30}})
        );
        let mut r = json!({"action": "accept"});
        apply_defaults(&params(), &mut r);
        assert_eq!(
            r,
            json!({"action": "accept", "content": {"name": "John Doe", "age": 30}})
        );
    }

    #[test]
    fn other_answers_are_untouched() {
        for action in ["decline", "cancel"] {
            let mut r = json!({"action": action});
            apply_defaults(&params(), &mut r);
            assert_eq!(r, json!({"action": action}));
        }
    }
}
