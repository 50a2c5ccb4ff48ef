//! What a custom tool is made of before it is stored: its test cases ([`TestCase`],
//! [`Expect`]), a draft to add ([`CustomDraft`]), and the next version of an approved tool
//! while it is reviewed ([`PendingVersion`]).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::sandbox::SandboxError;

/// The kinds `expect_error` takes, as a message lists them.
fn case_kinds() -> String {
    SandboxError::CASE_KINDS
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one test case expects of a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// The result must equal this JSON.
    Value(Value),
    /// The run must fail with this error kind: one of
    /// [`SandboxError::CASE_KINDS`] such as `exception` or `timeout`.
    Error(String),
}

/// One test case: `{"inputs": {...}, "expect": <JSON>}` or
/// `{"inputs": {...}, "expect_error": "<kind>"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct TestCase {
    /// The arguments.
    pub inputs: Value,
    /// What the run must give.
    pub expect: Expect,
}

impl TestCase {
    /// The test cases of a JSON array, or what is wrong with it, naming the case.
    pub fn parse_all(value: &Value) -> Result<Vec<TestCase>, String> {
        let Value::Array(items) = value else {
            return Err("the test cases must be a JSON array (an empty one is allowed)".into());
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let at = |why: &str| format!("test case {} (index {i}): {why}", i + 1);
                let Value::Object(case) = item else {
                    return Err(at(
                        "must be an object with `inputs` and `expect` or `expect_error`",
                    ));
                };
                if let Some(other) = case
                    .keys()
                    .find(|k| !matches!(k.as_str(), "inputs" | "expect" | "expect_error"))
                {
                    return Err(at(&format!(
                        "unknown key `{other}` (the keys are `inputs`, `expect`, `expect_error`)"
                    )));
                }
                let inputs = match case.get("inputs") {
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(_) => return Err(at("`inputs` must be an object")),
                    None => return Err(at("`inputs` is missing")),
                };
                let expect = match (case.get("expect"), case.get("expect_error")) {
                    (Some(v), None) => Expect::Value(v.clone()),
                    (None, Some(Value::String(kind)))
                        if SandboxError::CASE_KINDS.contains(&kind.as_str()) =>
                    {
                        Expect::Error(kind.clone())
                    }
                    (None, Some(Value::String(kind))) => {
                        return Err(at(&format!(
                            "`expect_error` is `{kind}`, which is not an error kind a run can end in; the kinds are {}",
                            case_kinds()
                        )));
                    }
                    (None, Some(_)) => {
                        return Err(at(&format!(
                            "`expect_error` must be an error kind (a string): {}",
                            case_kinds()
                        )));
                    }
                    (Some(_), Some(_)) => {
                        return Err(at("give `expect` or `expect_error`, not both"));
                    }
                    (None, None) => {
                        return Err(at("give `expect` (a JSON value) or `expect_error`"));
                    }
                };
                Ok(TestCase { inputs, expect })
            })
            .collect()
    }

    /// The JSON form [`TestCase::parse_all`] reads.
    pub fn to_json(&self) -> Value {
        match &self.expect {
            Expect::Value(v) => json!({"inputs": self.inputs, "expect": v}),
            Expect::Error(kind) => json!({"inputs": self.inputs, "expect_error": kind}),
        }
    }
}

/// A custom tool to add, or a new version of one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CustomDraft {
    /// The tool's name (the native name rules: lower-case snake_case, optionally dotted).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub input_schema: Value,
    /// `async function main(inputs) { ... }`.
    pub source: String,
    /// Its test cases.
    pub tests: Vec<TestCase>,
    /// Who wrote it (an operator, or the token of the session that proposed it).
    pub created_by: Option<String>,
}

impl CustomDraft {
    /// A draft with no test cases and no author.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        source: impl Into<String>,
    ) -> Self {
        CustomDraft {
            name: name.into(),
            description: description.into(),
            input_schema,
            source: source.into(),
            tests: Vec::new(),
            created_by: None,
        }
    }

    /// Sets the test cases.
    pub fn with_tests(mut self, tests: Vec<TestCase>) -> Self {
        self.tests = tests;
        self
    }

    /// Sets the author.
    pub fn with_author(mut self, by: impl Into<String>) -> Self {
        self.created_by = Some(by.into());
        self
    }
}

/// The next version of an approved tool while it is reviewed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingVersion {
    /// Its version number (one more than the live one).
    pub version: u32,
    /// Its description.
    pub description: String,
    /// Its argument schema.
    pub input_schema: Value,
    /// Its source.
    pub source: String,
    /// Its test cases (JSON).
    pub test_cases: Value,
    /// Where its review is.
    pub status: String,
    /// Its last audit's results.
    pub test_results: Option<Value>,
    /// Why it was turned down.
    pub rejection_reason: Option<String>,
}
