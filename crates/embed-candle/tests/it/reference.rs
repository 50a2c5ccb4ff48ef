//! The model's vectors against reference vectors computed without candle: `tests/data/
//! reference.py` reimplements the forward pass, mean pooling and normalisation in numpy
//! (float64) from the same weights, and wrote `tests/data/reference.json`.

use quiver_embed_candle::{DIMENSIONS, Embedder};
use serde_json::Value;

struct Case {
    text: String,
    vector: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let data: Value =
        serde_json::from_str(include_str!("../data/reference.json")).expect("reference JSON");
    data.as_array()
        .expect("a list")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_owned(),
            vector: c["vector"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
        })
        .collect()
}

/// The largest difference of one coordinate.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vector lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(texts: &[&str], want: &[&Case]) {
    let got = crate::model().embed(texts).expect("embeds");
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), DIMENSIONS);
        let d = max_diff(g, &w.vector);
        assert!(d <= 1e-4, "{:?}: off by {d}", w.text);
    }
}

#[test]
fn each_sentence_embeds_to_its_reference_vector() {
    for case in cases() {
        check(&[&case.text], &[&case]);
    }
}

#[test]
fn a_batch_of_mixed_lengths_embeds_each_text_as_alone() {
    // Padding to the longest text of a batch must not move the shorter texts' vectors, and
    // the vectors come back in the order given (the embedder sorts by length inside).
    let cases = cases();
    let mut order: Vec<&Case> = cases.iter().collect();
    order.reverse();
    let texts: Vec<&str> = order.iter().map(|c| c.text.as_str()).collect();
    check(&texts, &order);
}

#[test]
fn vectors_are_unit_length_and_the_identity_names_the_model() {
    let v = crate::model()
        .embed(&["unit length"])
        .unwrap()
        .pop()
        .unwrap();
    let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    assert!(
        crate::model().model_id().starts_with("all-MiniLM-L6-v2@"),
        "{}",
        crate::model().model_id()
    );
    assert!(crate::model().embed(&[]).unwrap().is_empty());
}
