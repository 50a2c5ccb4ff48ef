//! rmcp holds a sampling request's `temperature` and model priorities as `f32`: written out
//! again they read `0.699999988079071` where the server sent `0.7`. What a relayed request
//! carries is put back to the shortest decimal that gives the same `f32`, which is what
//! the sender wrote for any value an `f32` holds exactly enough to round-trip.

use serde_json::Value;

/// Puts `temperature` and `modelPreferences`' priorities of a `sampling/createMessage`'s
/// params back to their decimals.
pub(crate) fn decimal_sampling_floats(params: &mut Value) {
    decimal(params.get_mut("temperature"));
    if let Some(preferences) = params.get_mut("modelPreferences") {
        for key in ["costPriority", "speedPriority", "intelligencePriority"] {
            decimal(preferences.get_mut(key));
        }
    }
}

/// A number that is an `f32` widened to `f64`, as its `f32`'s shortest decimal.
fn decimal(value: Option<&mut Value>) {
    let Some(value) = value else { return };
    let Some(wide) = value.as_f64() else { return };
    let narrow = wide as f32;
    if f64::from(narrow) != wide {
        // Not an `f32`'s widening: a number the sender wrote as it stands.
        return;
    }
    if let Ok(shortest) = narrow.to_string().parse::<f64>()
        && let Some(number) = serde_json::Number::from_f64(shortest)
    {
        *value = Value::Number(number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn widened_f32s_get_their_decimals_back() {
        let mut params = json!({
            "maxTokens": 20,
            "temperature": f64::from(0.7f32),
            "modelPreferences": {"costPriority": f64::from(0.1f32), "speedPriority": 0.3,
                                 "intelligencePriority": 1},
        });
        decimal_sampling_floats(&mut params);
        assert_eq!(params["temperature"], json!(0.7));
        assert_eq!(params["modelPreferences"]["costPriority"], json!(0.1));
        // Already a decimal, or a whole number: kept as it reads.
        assert_eq!(params["modelPreferences"]["speedPriority"], json!(0.3));
        assert_eq!(
            params["modelPreferences"]["intelligencePriority"],
            json!(1.0)
        );
        assert_eq!(params["maxTokens"], json!(20));
    }
}
