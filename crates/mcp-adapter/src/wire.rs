//! Small conversions between MCP's wire types (rmcp's) and Quiver's contract that both sides
//! use: log levels, and a tool result as a downstream client receives it. Below the client
//! and the server, it imports neither.

// Logging is deprecated by SEP-2577; 2025-era peers still use it.
#![allow(deprecated)]

use quiver_contract::{Envelope, LogLevel, Part, RenderOptions, render};
use rmcp::model::{
    Annotations, AudioContent, CallToolResult, ContentBlock as Content, EmbeddedResource,
    ImageContent, LoggingLevel, Resource, ResourceContents, TextContent,
};
use serde_json::Value;

/// A contract log level as MCP's (a level the contract adds later is sent as the most
/// severe).
pub(crate) fn to_mcp_level(level: LogLevel) -> LoggingLevel {
    match level {
        LogLevel::Debug => LoggingLevel::Debug,
        LogLevel::Info => LoggingLevel::Info,
        LogLevel::Notice => LoggingLevel::Notice,
        LogLevel::Warning => LoggingLevel::Warning,
        LogLevel::Error => LoggingLevel::Error,
        LogLevel::Critical => LoggingLevel::Critical,
        LogLevel::Alert => LoggingLevel::Alert,
        _ => LoggingLevel::Emergency,
    }
}

/// An MCP log level as the contract's.
pub(crate) fn from_mcp_level(level: LoggingLevel) -> LogLevel {
    match level {
        LoggingLevel::Debug => LogLevel::Debug,
        LoggingLevel::Info => LogLevel::Info,
        LoggingLevel::Notice => LogLevel::Notice,
        LoggingLevel::Warning => LogLevel::Warning,
        LoggingLevel::Error => LogLevel::Error,
        LoggingLevel::Critical => LogLevel::Critical,
        LoggingLevel::Alert => LogLevel::Alert,
        LoggingLevel::Emergency => LogLevel::Emergency,
    }
}

/// What a typed tool's success without structured content says first (see [`call_result`]).
pub(crate) const UNSTRUCTURED_SUCCESS: &str = "Note: this call succeeded. Its result comes as text, not as the structured result the tool's output schema describes (it was too large for the result limit, or the tool answered in text), so it is marked as an error for MCP clients. Do not repeat the call for that reason.";

/// A tool result: the rendered envelope as text, the data as structured content when it is
/// a JSON object or array, non-text parts as their own blocks, and `isError` for an Err and
/// a schema Hint (arguments to correct); other Hints are normal results the model reads and
/// acts on.
///
/// A tool that declares an object output schema (`typed`, asked only for a result that is
/// not an Err and carries no object) must answer a success with structured content (clients'
/// SDKs refuse the result otherwise), so for it a result without a JSON object (a Hint, or
/// data the result cap turned into text) goes out with `isError`: the model still reads the
/// rendered text, after a first text block saying that a success was only marked so.
pub(crate) fn call_result(
    envelope: &Envelope,
    opts: &RenderOptions,
    typed: impl FnOnce() -> bool,
) -> CallToolResult {
    // Text parts go out as their own blocks, in their places, so the render leaves them
    // out.
    let mut opts = *opts;
    opts.inline_text_parts = false;
    let mut content = vec![Content::text(render(envelope, &opts))];
    let mut structured = None;
    if let Envelope::Ok { data, parts, .. } = envelope {
        if matches!(data, Value::Object(_) | Value::Array(_)) {
            structured = Some(data.clone());
        }
        for part in parts {
            let note = annotations(part.annotations());
            match part {
                Part::Text { text, .. } => {
                    let mut block = TextContent::new(text.clone());
                    block.annotations = note;
                    content.push(Content::Text(block));
                }
                Part::Image {
                    mime_type, data, ..
                } => {
                    let mut block = ImageContent::new(data.clone(), mime_type.clone());
                    block.annotations = note;
                    content.push(Content::Image(block));
                }
                Part::Audio {
                    mime_type, data, ..
                } => {
                    let mut block = AudioContent::new(data.clone(), mime_type.clone());
                    block.annotations = note;
                    content.push(Content::Audio(block));
                }
                Part::Resource {
                    uri,
                    mime_type,
                    text,
                    blob,
                    ..
                } => {
                    let resource = match (text, blob) {
                        (Some(text), _) => ResourceContents::TextResourceContents {
                            uri: uri.clone(),
                            mime_type: mime_type.clone(),
                            text: text.clone(),
                            meta: None,
                        },
                        (None, Some(blob)) => ResourceContents::BlobResourceContents {
                            uri: uri.clone(),
                            mime_type: mime_type.clone(),
                            blob: blob.clone(),
                            meta: None,
                        },
                        // Neither: the rendered text already names it.
                        (None, None) => continue,
                    };
                    let mut block = EmbeddedResource::new(resource);
                    block.annotations = note;
                    content.push(Content::Resource(block));
                }
                Part::ResourceLink {
                    uri,
                    name,
                    mime_type,
                    title,
                    description,
                    size,
                    ..
                } => {
                    let mut link = Resource::new(uri.clone(), name.clone());
                    link.mime_type = mime_type.clone();
                    link.title = title.clone();
                    link.description = description.clone();
                    link.size = *size;
                    link.annotations = note;
                    content.push(Content::resource_link(link));
                }
                // `Part` grows with the protocol: a kind this edge does not know yet is
                // still described in the rendered text.
                _ => {}
            }
        }
    }
    let untyped = !envelope.is_err() && !matches!(structured, Some(Value::Object(_))) && typed();
    if untyped && envelope.is_ok() {
        // Marked as an error only for the clients' sake: the model must not take it for a
        // failed call (and repeat a call that did what it was asked).
        content.insert(0, Content::text(UNSTRUCTURED_SUCCESS));
    }
    // Arguments that do not fit the tool's schema are an error result the model reads and
    // corrects (MCP 2025-11-25, SEP-1303: input validation errors are tool execution
    // errors); other hints (narrow a query, pick one) are normal results.
    let bad_arguments = envelope.hint_kind() == Some(quiver_contract::HintKind::Schema);
    let mut result = if envelope.is_err() || untyped || bad_arguments {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = if untyped { None } else { structured };
    result
}

/// For a client before 2026-07-28, which takes only an object as `structuredContent`: a
/// list's is left out. rmcp would move it into a first text block as compact JSON, and the
/// model would read every item twice (the rendered text carries the list whole).
pub(crate) fn no_list_copy(result: &mut CallToolResult) {
    result.structured_content.take_if(|v| !v.is_object());
}

/// A part's annotations as rmcp's type (they were checked against it when they came in; a
/// part built elsewhere with annotations MCP does not define goes out without them).
fn annotations(raw: Option<&Value>) -> Option<Annotations> {
    serde_json::from_value(raw?.clone()).ok()
}

#[cfg(test)]
mod tests {
    use quiver_contract::{ErrKind, HintKind};
    use serde_json::json;

    use super::*;

    /// The server's text block holds every item of a long list, as the model reads it.
    #[test]
    fn a_long_list_is_sent_whole_in_the_text() {
        let opts = crate::server::ServerOptions::default().render;
        let items: Vec<_> = (0..500).map(|i| format!("entry {i}")).collect();
        let r = call_result(&Envelope::ok(json!(items)), &opts, || false);
        let v = serde_json::to_value(&r).unwrap();
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("- \"entry 499\"") && !text.contains("more"),
            "{text}"
        );
    }

    #[test]
    fn envelopes_become_results() {
        let opts = RenderOptions::default();
        let ok = call_result(&Envelope::ok(json!({"a": 1})), &opts, || false);
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(ok.structured_content, Some(json!({"a": 1})));
        let text = call_result(&Envelope::ok(json!("hello")), &opts, || false);
        assert_eq!(text.structured_content, None);
        let hint = call_result(
            &Envelope::hint(HintKind::Schema, "fix it", vec![]),
            &opts,
            || false,
        );
        assert_eq!(hint.is_error, Some(true));
        let narrow = call_result(
            &Envelope::hint(HintKind::Fetch, "narrow it", vec![]),
            &opts,
            || false,
        );
        assert_eq!(narrow.is_error, Some(false));
        let err = call_result(&Envelope::err(ErrKind::ToolFailed, "boom"), &opts, || false);
        assert_eq!(err.is_error, Some(true));
        let v = serde_json::to_value(&err).unwrap();
        assert!(v["content"][0]["text"].as_str().unwrap().contains("boom"));
        // A tool with an output schema: a success carries an object, anything else is an
        // error result (never a success without structured content).
        let typed_ok = call_result(&Envelope::ok(json!({"a": 1})), &opts, || true);
        assert_eq!(typed_ok.is_error, Some(false));
        assert_eq!(typed_ok.structured_content, Some(json!({"a": 1})));
        for e in [
            Envelope::hint(HintKind::Schema, "fix it", vec![]),
            Envelope::ok(json!("{\"a\": 1…[result truncated]")),
            Envelope::ok(json!([1, 2])),
        ] {
            let r = call_result(&e, &opts, || true);
            assert_eq!(r.is_error, Some(true), "{e:?}");
            assert_eq!(r.structured_content, None, "{e:?}");
            // A success says first that it is one; a hint does not.
            let first = serde_json::to_value(&r).unwrap()["content"][0]["text"].clone();
            assert_eq!(
                first == json!(UNSTRUCTURED_SUCCESS),
                e.is_ok(),
                "{e:?}: {first}"
            );
        }
    }

    #[test]
    fn resources_and_links_keep_their_content() {
        let e = Envelope::ok(json!("three parts"))
            .with_part(Part::resource_blob(
                "demo://blob/1",
                Some("application/octet-stream".into()),
                "AAEC",
            ))
            .with_part(Part::resource_text(
                "demo://text/1",
                Some("text/markdown".into()),
                "# hi",
            ))
            .with_part(Part::link(
                "demo://text/2",
                "second",
                Some("text/plain".into()),
            ));
        let v = serde_json::to_value(call_result(&e, &RenderOptions::default(), || false)).unwrap();
        let c = &v["content"];
        assert_eq!(c[1]["type"], "resource");
        assert_eq!(c[1]["resource"]["blob"], "AAEC");
        assert_eq!(c[1]["resource"]["mimeType"], "application/octet-stream");
        assert_eq!(c[2]["resource"]["text"], "# hi");
        assert_eq!(c[2]["resource"]["mimeType"], "text/markdown");
        assert_eq!(c[3]["type"], "resource_link");
        assert_eq!(c[3]["uri"], "demo://text/2");
        assert_eq!(c[3]["name"], "second");
        assert_eq!(c.as_array().unwrap().len(), 4);
    }
}
