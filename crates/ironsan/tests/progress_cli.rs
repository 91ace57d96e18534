//! Progress bars are for terminals: with stderr redirected (a file, a pipe, as here), whole-LUN
//! `read` and `write` and a bench sweep write no progress bytes (no carriage return, no escape
//! codes) and `read` puts exactly the LUN's bytes on stdout.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{Proc, LIMIT};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs ironsan to completion (bounded by `timeout`), stdout and stderr captured.
fn run(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(env!("CARGO_BIN_EXE_ironsan"))
        .args(args)
        .env_remove("IRONSAN_LOG")
        .output()
        .expect("run ironsan")
}

/// No byte of a progress bar: a carriage return or an escape code.
fn assert_no_progress(what: &str, bytes: &[u8]) {
    assert!(
        !bytes.contains(&b'\r') && !bytes.contains(&0x1b),
        "{what} carries progress bytes: {:?}",
        String::from_utf8_lossy(bytes)
    );
}

#[test]
fn redirected_output_carries_no_progress_bar() {
    let dir = scratch("progress");
    let log = dir.join("target.log");
    let mut target = Proc::spawn_logging_to(&["target", "--portal", "127.0.0.1:0"], &log);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let url = format!("iscsi://{portal}/iqn.2026-11.org.ironsan:default/0");
    let data: Vec<u8> = (0..(4u32 << 20))
        .map(|i| (i * 13 + (i >> 12)) as u8)
        .collect();
    let input = dir.join("in.bin");
    std::fs::write(&input, &data).unwrap();

    let o = run(&["write", &url, "--input", input.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_no_progress("write's stderr", &o.stderr);
    assert_no_progress("write's stdout", &o.stdout);

    let o = run(&["read", &url, "--length", "4MiB"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_no_progress("read's stderr", &o.stderr);
    assert!(
        o.stdout == data,
        "read's stdout is not exactly the bytes written"
    );

    let o = run(&[
        "bench", &url, "--rw", "read", "--size", "4k..8k", "--count", "50",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_no_progress("bench's stderr", &o.stderr);
    assert_no_progress("bench's stdout", &o.stdout);
    assert!(String::from_utf8_lossy(&o.stdout).contains("MB/s"));

    let _ = target.child.kill();
    let _ = target.child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
