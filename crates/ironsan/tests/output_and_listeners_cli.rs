//! The CLI as a script or a new user meets it: `ironsan bench URL --json` puts nothing but JSON
//! on stdout; log lines written to a file (or a pipe) carry no colour codes; `ironsan rdma ping
//! --server` outlives a port probe and a client that never sends its MPA Request, and a real
//! ping is served meanwhile without waiting for them. A LUN whose backend cannot be opened
//! stops the target with one line that names its place in the configuration file.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{Proc, LIMIT};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs ironsan to completion (bounded by `timeout`, the coreutils command); returns its output.
fn run(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(env!("CARGO_BIN_EXE_ironsan"))
        .args(args)
        .env_remove("IRONSAN_LOG")
        .output()
        .expect("run ironsan")
}

#[test]
fn a_lun_that_cannot_open_names_its_line_in_the_config() {
    let dir = scratch("bad-lun");
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        "portals = [\"127.0.0.1:0\"]\n\n[[target]]\nname = \"iqn.2026-11.org.ironsan.test:bad\"\n\n\
         [target.lun.0]\nsize = \"1MiB\"\nbackend = \"memory\"\n\n\
         [target.lun.3]\nbackend = { type = \"file\", path = \"/nonexistent/lun.img\" }\n",
    )
    .unwrap();
    let o = run(&["target", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    let want = format!(
        "{}:10: target iqn.2026-11.org.ironsan.test:bad: LUN 3: ",
        config.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert!(stderr.contains("create = true"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_json_on_stdout_is_only_json_and_logs_carry_no_colour() {
    let dir = scratch("bench");
    let log = dir.join("target.log");
    let mut target = Proc::spawn_logging_to(&["target", "--portal", "127.0.0.1:0"], &log);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let url = format!("iscsi://{portal}/iqn.2026-11.org.ironsan:default/0");
    let o = run(&[
        "bench",
        &url,
        "--rw",
        "read,write",
        "--size",
        "4k",
        "--qd",
        "4",
        "--count",
        "200",
        "--verify",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench failed: {stdout}{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"));
    let points = doc["points"].as_array().expect("a points array");
    assert_eq!(points.len(), 2, "{doc}");
    // The table (and the verify line) went to stderr instead.
    assert!(stderr.contains("MB/s"), "the table on stderr: {stderr}");
    assert!(stderr.contains("verified:"), "{stderr}");
    // With the JSON in a file, the table stays on stdout.
    let file = dir.join("r.json");
    let o = run(&[
        "bench",
        &url,
        "--rw",
        "read",
        "--size",
        "4k",
        "--count",
        "50",
        "--json",
        file.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("MB/s"));
    let _: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("JSON in the file");
    // The target logged the logins to its log file, as plain text.
    let _ = target.child.kill();
    let _ = target.child.wait();
    let text = std::fs::read(&log).unwrap();
    assert!(
        String::from_utf8_lossy(&text).contains("login complete"),
        "the target logged: {}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        !text.contains(&0x1b),
        "ANSI escape codes in a log file: {}",
        String::from_utf8_lossy(&text)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ping_server_outlives_a_probe_and_a_silent_client() {
    let dir = scratch("ping");
    let log = dir.join("server.log");
    let mut server = Proc::spawn_logging_to(
        &[
            "rdma",
            "ping",
            "--server",
            "--listen",
            "127.0.0.1:0",
            "--timeout",
            "30",
        ],
        &log,
    );
    let addr = server.wait_line("rdma ping server listening on ", ' ');
    // A port probe, and a client that connects and never sends its MPA Request.
    drop(TcpStream::connect(&addr).unwrap());
    let _silent = TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let o = run(&["rdma", "ping", &addr, "--count", "3", "--timeout", "20"]);
    let took = started.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "ping failed: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("3/3 pings ok"), "{out}");
    // The server reads MPA Requests side by side: the silent client (5 s) delayed nothing.
    assert!(took < Duration::from_secs(4), "the ping took {took:?}");
    assert!(
        server.wait_exit(LIMIT).success(),
        "the server ends well after its client"
    );
    let text = std::fs::read(&log).unwrap();
    let shown = String::from_utf8_lossy(&text);
    assert!(
        shown.contains("MPA connection dropped: closed without sending an MPA Request"),
        "one line for the probe: {shown}"
    );
    assert!(
        !text.contains(&0x1b),
        "ANSI escape codes in the log: {shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
