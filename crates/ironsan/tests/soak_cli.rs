//! `ironsan soak`: a short run against the target is clean (data verified, the target's memory
//! and descriptors sampled), and two soaks writing over each other's data are caught by the
//! verification and fail.

use std::process::{Command, Output};

mod common;
use common::{Proc, LIMIT};

fn soak(url: &str, extra: &[&str]) -> Output {
    Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(common::exe())
        .arg("soak")
        .arg(url)
        .args(extra)
        .env_remove("IRONSAN_LOG")
        .output()
        .expect("run ironsan soak")
}

fn summary_value(doc: &serde_json::Value, measure: &str) -> serde_json::Value {
    doc["summary"]
        .as_array()
        .expect("summary rows")
        .iter()
        .find(|r| r["measure"] == measure)
        .unwrap_or_else(|| panic!("no {measure:?} in {doc}"))["value"]
        .clone()
}

fn target() -> (Proc, String) {
    let mut t = Proc::spawn(&["target", "--portal", "127.0.0.1:0"]);
    let portal = t.wait_line("ironsan: serving iSCSI on ", ' ');
    (
        t,
        format!("iscsi://{portal}/iqn.2026-11.org.ironsan:default/0"),
    )
}

#[test]
fn a_short_soak_is_clean_and_samples_the_target() {
    let (t, url) = target();
    let dir = std::env::temp_dir().join(format!("ironsan-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("soak.json");
    let pid = t.child.id().to_string();
    let o = soak(
        &url,
        &[
            "--sessions",
            "4",
            "--qd",
            "4",
            "--duration",
            "3",
            "--span",
            "64M",
            "--target-pid",
            &pid,
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(summary_value(&doc, "errors"), 0);
    assert_eq!(summary_value(&doc, "verify mismatches"), 0);
    assert!(summary_value(&doc, "units verified").as_i64().unwrap() > 100);
    let samples = doc["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{doc}");
    assert!(samples
        .iter()
        .all(|s| s["target RSS MiB"].as_f64().unwrap() > 1.0
            && s["target fds"].as_u64().unwrap() >= 4));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two soaks on the same blocks, with different data: each reads back what the other wrote,
/// and says so.
#[test]
fn data_overwritten_behind_a_soaks_back_is_caught() {
    let (_t, url) = target();
    let args = |seed: &'static str| -> Vec<&'static str> {
        vec![
            "--sessions",
            "2",
            "--qd",
            "2",
            "--duration",
            "3",
            "--span",
            "1M",
            "--max-size",
            "16k",
            "--mix",
            "50",
            "--seed",
            seed,
        ]
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| soak(&url, &args("1")));
        let b = s.spawn(|| soak(&url, &args("2")));
        (a.join().unwrap(), b.join().unwrap())
    });
    let failed: Vec<String> = [a, b]
        .iter()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert!(
        !failed.is_empty(),
        "neither soak noticed the other's writes"
    );
    for stderr in failed {
        assert!(
            stderr.contains("verify mismatches") && !stderr.contains(" 0 verify mismatches"),
            "{stderr}"
        );
    }
}
