//! Captures kept as fixtures, decoded as tshark decodes them.

use std::path::PathBuf;

use analyze::{analyze_file, Analysis, Options};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// ffp-text-request.pcap, decoded with its port and content detection.
fn text_request_capture() -> Analysis {
    let opts = Options {
        ports: vec![3992],
        detect_by_content: true,
    };
    analyze_file(&fixture("ffp-text-request.pcap"), &opts).expect("capture reads")
}

/// libiscsi against an ironsan target on port 3992: tshark finds 40 iSCSI PDUs, the last the
/// initiator sends on its second connection an immediate Text Request (frame 52) whose data
/// digest could only be detected from bytes that never follow it; the login's settled
/// `DataDigest=None` (and, without it, the end of the stream) frames it.
#[test]
fn an_immediate_text_request_at_the_end_of_a_stream_is_decoded() {
    let a = text_request_capture();
    assert_eq!(a.pdus.len(), 40, "tshark -Y iscsi finds 40 PDUs");
    let text: Vec<_> = a.pdus.iter().filter(|p| p.opcode == 0x04).collect();
    assert_eq!(text.len(), 1);
    assert_eq!(text[0].frame, 52);
    assert!(text[0].immediate && text[0].final_);
    assert_eq!(
        text[0].text.as_deref(),
        Some(&["SendTargetsPlease=All".to_string()][..])
    );
    let listing = analyze::listing::text(&a);
    assert!(
        listing
            .lines()
            .any(|l| l.contains("Text Request") && l.contains("SendTargetsPlease=All")),
        "{listing}"
    );
    let conn = &a.connections[text[0].conn];
    assert!(conn.negotiated.login_complete);
    assert_eq!(conn.negotiated.data_digest, Some(false));
}

/// The same capture has no READ or WRITE: the explanation says so instead of ranking limits.
#[test]
fn a_capture_without_reads_or_writes_has_nothing_to_explain() {
    let a = text_request_capture();
    let d = analyze::explain::explain(&a, &analyze::stats::StatsOptions::default());
    assert!(d.findings.is_empty());
    assert!(analyze::explain::text(&d).contains("no completed READ or WRITE"));
}
