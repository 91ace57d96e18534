//! `ironsan target` as a service: its metrics count exactly the reads and writes `ironsan
//! bench` reports for a run; under systemd's readiness protocol (a fake NOTIFY_SOCKET here)
//! READY=1 comes once the portal takes connections and STOPPING=1 on SIGTERM; with stderr
//! being the journal (JOURNAL_STREAM naming it) log lines carry no timestamp of their own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

mod common;
use common::{Proc, LIMIT};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-svc-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The metrics endpoint's answer to GET /metrics (body only).
fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample `name{labels}` in a scrape.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn metrics_count_the_reads_and_writes_bench_reports() {
    let dir = scratch("metrics");
    let log = dir.join("target.log");
    let args = [
        "target",
        "--portal",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ];
    let mut target = Proc::spawn_logging_to(&args, &log);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let metrics = target.wait_line("ironsan: metrics on http://", '/');
    let iqn = "iqn.2026-11.org.ironsan:default";
    let url = format!("iscsi://{portal}/{iqn}/0");
    let o = Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(common::exe())
        .args([
            "bench", &url, "--rw", "mixed", "--mix", "60", "--size", "4k,64k", "--qd", "8",
            "--count", "400", "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "bench: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let (mut reads, mut writes, mut read_bytes, mut write_bytes) = (0, 0, 0, 0);
    for p in doc["points"].as_array().unwrap() {
        let (r, w, size) = (
            p["reads"].as_u64().unwrap(),
            p["writes"].as_u64().unwrap(),
            p["size"].as_u64().unwrap(),
        );
        assert_eq!(p["bytes"].as_u64().unwrap(), (r + w) * size, "{p}");
        (reads, writes) = (reads + r, writes + w);
        (read_bytes, write_bytes) = (read_bytes + r * size, write_bytes + w * size);
    }
    assert_eq!(reads + writes, 800, "{doc}");
    assert!(reads > 0 && writes > 0, "{doc}");
    let text = scrape(&metrics);
    let lun = format!("{{target=\"{iqn}\",lun=\"0\"}}");
    assert_eq!(
        sample(&text, &format!("ironsan_lun_read_ops_total{lun}")),
        reads
    );
    assert_eq!(
        sample(&text, &format!("ironsan_lun_write_ops_total{lun}")),
        writes
    );
    assert_eq!(
        sample(&text, &format!("ironsan_lun_read_bytes_total{lun}")),
        read_bytes
    );
    assert_eq!(
        sample(&text, &format!("ironsan_lun_write_bytes_total{lun}")),
        write_bytes
    );
    let latencies = sample(
        &text,
        &format!("ironsan_lun_write_latency_seconds_count{lun}"),
    );
    assert_eq!(latencies, writes);
    // INQUIRY, READ CAPACITY and the like count apart.
    assert!(sample(&text, &format!("ironsan_lun_other_ops_total{lun}")) > 0);
    assert_eq!(sample(&text, &format!("ironsan_lun_queue_depth{lun}")), 0);
    assert!(sample(&text, "ironsan_iscsi_logins_accepted_total") >= 1);
    target.stop("-TERM");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The next datagram on `sock`, as text.
fn notice(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = sock
        .recv(&mut buf)
        .expect("a notification within the limit");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn ready_comes_once_the_portal_listens_and_stopping_on_sigterm() {
    let dir = scratch("notify");
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(LIMIT)).unwrap();
    let log = dir.join("target.log");
    std::fs::File::create(&log).unwrap();
    let meta = std::fs::metadata(&log).unwrap();
    let journal = format!("{}:{}", meta.dev(), meta.ino());
    let env = [
        ("NOTIFY_SOCKET", path.to_str().unwrap()),
        ("JOURNAL_STREAM", journal.as_str()),
    ];
    // A port known before the start, so the portal is tried the moment READY=1 arrives
    // (a READY sent before the portal listens would be refused here).
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = free.local_addr().unwrap();
    drop(free);
    let arg = portal.to_string();
    let mut target = Proc::spawn_with_env(&["target", "--portal", &arg], &env, &log);
    assert_eq!(notice(&sock).trim_end(), "READY=1");
    TcpStream::connect_timeout(&portal, Duration::from_secs(5))
        .expect("the portal takes connections once READY=1 came");
    assert_eq!(target.wait_line("ironsan: serving iSCSI on ", ' '), arg);
    target.signal("-TERM");
    assert_eq!(notice(&sock).trim_end(), "STOPPING=1");
    assert!(target.wait_exit(LIMIT).success());
    // stderr was "the journal": no timestamps and no colour codes of our own.
    let text = std::fs::read_to_string(&log).unwrap();
    let first = text.lines().next().expect("a log line");
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(
        !first.starts_with(|c: char| c.is_ascii_digit()),
        "a timestamp in the journal: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
