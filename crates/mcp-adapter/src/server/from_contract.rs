//! Contract types to rmcp types at the server's edge: a tool definition here; a tool result
//! is the floor's conversion ([`call_result`], in `wire.rs`: the client's tests read what a
//! downstream client would see through it too).

use std::sync::Arc;

use quiver_contract::ToolSpec;
use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value};

pub(crate) use crate::wire::call_result;

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
    tool.title = spec.title.clone();
    if let Some(Value::Object(out)) = &spec.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(out.clone()));
    }
    tool
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_becomes_an_mcp_tool() {
        let spec = ToolSpec::new("echo", "Echoes.").read_only();
        let t = serde_json::to_value(tool(&spec)).unwrap();
        assert_eq!(t["name"], "echo");
        assert_eq!(t["inputSchema"]["type"], "object");
        assert_eq!(t["annotations"]["readOnlyHint"], true);
    }
}
