//! The content source's answers (resources, prompts, completions) as rmcp's results: its
//! lists in pages, its wire JSON typed, its errors as JSON-RPC errors.

use rmcp::{ErrorData, model::PaginatedRequestParams};
use serde_json::Value;

use super::content::ContentError;

/// Entries per page of `resources/list`, `resources/templates/list` and `prompts/list`.
const PAGE: usize = 1000;

/// One page of an aggregated list; the cursor is the offset of the next page.
pub(super) fn paged<T: serde::de::DeserializeOwned>(
    field: &str,
    all: Vec<Value>,
    request: Option<PaginatedRequestParams>,
) -> Result<T, ErrorData> {
    let total = all.len();
    let start = match request.and_then(|r| r.cursor) {
        None => 0,
        // A cursor this server never gave (beyond the list, or not a number) is invalid.
        Some(c) => c
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= total)
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    format!("invalid cursor {c:?}: pass the nextCursor of the previous page"),
                    None,
                )
            })?,
    };
    let page: Vec<Value> = all.into_iter().skip(start).take(PAGE).collect();
    let mut out = serde_json::Map::new();
    out.insert(field.to_owned(), Value::Array(page));
    let next = start + PAGE;
    if next < total {
        out.insert("nextCursor".into(), Value::String(next.to_string()));
    }
    typed(Value::Object(out), field)
}

/// Parses the wire JSON a source returned into rmcp's type, marked `resultType: complete`
/// when it has no type (a 2025-era upstream's answer; a 2026-07-28 client requires the
/// field, and rmcp drops it again for older clients).
pub(super) fn typed<T: serde::de::DeserializeOwned>(
    mut wire: Value,
    what: &str,
) -> Result<T, ErrorData> {
    if let Value::Object(m) = &mut wire {
        m.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
    }
    serde_json::from_value(wire).map_err(|e| {
        tracing::warn!(error = %e, "{what}: the content source returned a malformed result");
        ErrorData::internal_error(
            format!("{what}: the upstream answer is malformed ({e})"),
            None,
        )
    })
}

/// `e` as the JSON-RPC error; `resource` says the request was about resources, and names the
/// URI it was about, if one (SEP-2164: a resource not found carries `data.uri`).
pub(super) fn content_error(e: ContentError, resource: Option<Option<&str>>) -> ErrorData {
    let mut error = content_error_of(e, resource.is_some());
    // An upstream's own "not found" gets the URI too.
    if let Some(uri) = resource.flatten()
        && error.code == rmcp::model::ErrorCode::RESOURCE_NOT_FOUND
        && error.data.is_none()
    {
        error.data = Some(serde_json::json!({"uri": uri}));
    }
    error
}

pub(super) fn content_error_of(e: ContentError, resource: bool) -> ErrorData {
    match e {
        ContentError::NotFound(m) if resource => ErrorData::resource_not_found(m, None),
        ContentError::NotFound(m) | ContentError::InvalidParams(m) => {
            ErrorData::invalid_params(m, None)
        }
        ContentError::Upstream { code, message } => {
            ErrorData::new(rmcp::model::ErrorCode(code), message, None)
        }
        ContentError::Unavailable(m) => ErrorData::internal_error(m, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(cursor: Option<&str>) -> Result<Value, ErrorData> {
        let all: Vec<Value> = (0..PAGE + 5).map(|i| serde_json::json!({"n": i})).collect();
        let request =
            cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c.to_owned())));
        paged("prompts", all, request)
    }

    #[test]
    fn list_pages_follow_their_cursors_and_refuse_others() {
        let first = page(None).unwrap();
        assert_eq!(first["prompts"].as_array().unwrap().len(), PAGE);
        let next = first["nextCursor"].as_str().unwrap().to_owned();
        let second = page(Some(&next)).unwrap();
        assert_eq!(second["prompts"].as_array().unwrap().len(), 5);
        assert!(second.get("nextCursor").is_none());
        for bad in ["18446744073709551615", "-1", "x", &(PAGE + 6).to_string()] {
            let e = page(Some(bad)).unwrap_err();
            assert!(e.message.contains("invalid cursor"), "{bad}: {}", e.message);
        }
    }
}
