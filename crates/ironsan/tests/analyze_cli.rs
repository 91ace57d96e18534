//! `ironsan analyze` end to end on a kept capture: the counts tshark finds, and the JSON
//! members of `--explain` and the phase breakdown.

use std::process::Command;

mod common;

fn fixture(name: &str) -> String {
    format!(
        "{}/../analyze/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn analyze(args: &[&str]) -> String {
    let out = Command::new(common::exe())
        .arg("analyze")
        .args(args)
        .output()
        .expect("run ironsan analyze");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn counts_match_tshark_and_json_carries_the_explanation_and_phases() {
    let capture = fixture("ffp-text-request.pcap");
    let counts = analyze(&["--port", "3992", "--counts", &capture]);
    assert!(counts.contains("0x04 Text Request"), "{counts}");
    assert!(counts.lines().any(|l| l == "total 40"), "{counts}");
    let json = analyze(&["--port", "3992", "--json", "--explain", &capture]);
    let doc: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert!(doc["explain"]["note"].is_string(), "{}", doc["explain"]);
    assert!(doc["phases"]["summary"].is_array());
    assert_eq!(doc["phases"]["commands"].as_array().map(Vec::len), Some(16));
    let series = doc["time_series"].as_array().expect("time_series");
    assert_eq!(series.len(), 2, "two connections carried commands");
    assert!(series[0]["points"][0]["outstanding"].is_number());
    let text = analyze(&["--port", "3992", "--phases", &capture]);
    assert!(text.contains("service"), "{text}");
}

#[test]
fn a_file_that_is_not_a_capture_is_an_error_line() {
    let out = Command::new(common::exe())
        .args([
            "analyze",
            "--explain",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/analyze_cli.rs"),
        ])
        .output()
        .expect("run ironsan analyze");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a pcap"), "{err}");
}
