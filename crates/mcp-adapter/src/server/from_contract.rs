//! Contract types to rmcp types: the one place the server converts at its edge.

use std::sync::Arc;

use quiver_contract::{Envelope, Part, RenderOptions, ToolSpec, render};
use rmcp::model::{CallToolResult, ContentBlock as Content, Tool, ToolAnnotations};
use serde_json::{Map, Value};

/// A tool definition as MCP lists it.
pub(crate) fn tool(spec: &ToolSpec) -> Tool {
    let schema = match &spec.input_schema {
        Value::Object(map) => map.clone(),
        _ => {
            let mut m = Map::new();
            m.insert("type".into(), Value::String("object".into()));
            m
        }
    };
    let a = &spec.annotations;
    let annotations = ToolAnnotations::from_raw(
        None,
        Some(a.read_only),
        Some(a.destructive),
        Some(a.idempotent),
        Some(a.open_world),
    );
    let mut tool = Tool::new(
        spec.name.clone(),
        spec.description.clone(),
        Arc::new(schema),
    )
    .with_annotations(annotations);
    if let Some(Value::Object(out)) = &spec.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(out.clone()));
    }
    tool
}

/// A tool result: the rendered envelope as text, the data as structured content when it is
/// a JSON object or array, non-text parts as their own blocks, and `isError` for an Err
/// (a Hint is a normal result the model reads and acts on).
pub(crate) fn call_result(envelope: &Envelope, opts: &RenderOptions) -> CallToolResult {
    let mut content = vec![Content::text(render(envelope, opts))];
    let mut structured = None;
    if let Envelope::Ok { data, parts, .. } = envelope {
        if matches!(data, Value::Object(_) | Value::Array(_)) {
            structured = Some(data.clone());
        }
        for part in parts {
            match part {
                Part::Image { mime_type, data } => {
                    content.push(Content::image(data.clone(), mime_type.clone()))
                }
                Part::Audio { mime_type, data } => {
                    content.push(Content::audio(data.clone(), mime_type.clone()))
                }
                Part::Resource {
                    uri,
                    text: Some(text),
                    ..
                } => content.push(Content::embedded_text(uri.clone(), text.clone())),
                _ => {}
            }
        }
    }
    let mut result = if envelope.is_err() {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = structured;
    result
}

#[cfg(test)]
mod tests {
    use quiver_contract::{ErrKind, HintKind};
    use serde_json::json;

    use super::*;

    #[test]
    fn envelopes_become_results() {
        let opts = RenderOptions::default();
        let ok = call_result(&Envelope::ok(json!({"a": 1})), &opts);
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(ok.structured_content, Some(json!({"a": 1})));
        let text = call_result(&Envelope::ok(json!("hello")), &opts);
        assert_eq!(text.structured_content, None);
        let hint = call_result(&Envelope::hint(HintKind::Schema, "fix it", vec![]), &opts);
        assert_eq!(hint.is_error, Some(false));
        let err = call_result(&Envelope::err(ErrKind::ToolFailed, "boom"), &opts);
        assert_eq!(err.is_error, Some(true));
        let v = serde_json::to_value(&err).unwrap();
        assert!(v["content"][0]["text"].as_str().unwrap().contains("boom"));
    }

    #[test]
    fn a_spec_becomes_an_mcp_tool() {
        let spec = ToolSpec::new("echo", "Echoes.").read_only();
        let t = serde_json::to_value(tool(&spec)).unwrap();
        assert_eq!(t["name"], "echo");
        assert_eq!(t["inputSchema"]["type"], "object");
        assert_eq!(t["annotations"]["readOnlyHint"], true);
    }
}
