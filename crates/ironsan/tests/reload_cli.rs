//! `ironsan target --config FILE` reads FILE again on SIGHUP: a LUN added to the file is
//! then listed by REPORT LUNS (`ironsan ls`), a portal added to it is bound, a file that does not parse is refused whole
//! with one log line naming its line, and the target keeps what it runs.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{Proc, LIMIT};

const NAME: &str = "iqn.2026-11.org.ironsan.test:reload";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `ironsan ls PORTAL`'s LUN numbers.
fn listed_luns(portal: &str) -> Vec<u64> {
    let out = Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(common::exe())
        .args(["ls", portal])
        .env_remove("IRONSAN_LOG")
        .output()
        .expect("run ironsan ls");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Lun: "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Waits (bounded) until `log` has a line containing `text`.
fn wait_log(log: &std::path::Path, text: &str) -> String {
    let start = Instant::now();
    loop {
        let now = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = now.lines().find(|l| l.contains(text)) {
            return l.to_string();
        }
        assert!(start.elapsed() < LIMIT, "no log line with {text:?}:\n{now}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_applies_a_lun_added_to_the_file_and_refuses_a_broken_file() {
    let dir = scratch("reload");
    let config = dir.join("target.toml");
    let lun = |n: u32| format!("[target.lun.{n}]\nsize = \"1MiB\"\nbackend = \"memory\"\n");
    let head = format!("portals = [\"127.0.0.1:0\"]\n\n[[target]]\nname = \"{NAME}\"\n");
    std::fs::write(&config, format!("{head}{}", lun(0))).unwrap();
    let log = dir.join("target.log");
    let mut target =
        Proc::spawn_logging_to(&["target", "--config", config.to_str().unwrap()], &log);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    assert_eq!(listed_luns(&portal), vec![0]);

    std::fs::write(&config, format!("{head}{}{}", lun(0), lun(5))).unwrap();
    target.signal("-HUP");
    wait_log(&log, &format!("reload: target {NAME} LUN 5: added"));
    assert_eq!(listed_luns(&portal), vec![0, 5]);

    // A portal added to the file is bound, and serves the same target.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let second = free.local_addr().unwrap().to_string();
    drop(free);
    let both = head.replace(
        "portals = [\"127.0.0.1:0\"]",
        &format!("portals = [\"127.0.0.1:0\", \"{second}\"]"),
    );
    std::fs::write(&config, format!("{both}{}{}", lun(0), lun(5))).unwrap();
    target.signal("-HUP");
    wait_log(&log, &format!("reload: portal tcp://{second}: added"));
    assert_eq!(listed_luns(&second), vec![0, 5]);

    std::fs::write(&config, format!("{head}{}queue_depht = 3\n", lun(0))).unwrap();
    target.signal("-HUP");
    let line = wait_log(&log, "reload refused");
    assert!(
        line.contains(&format!("{}:8:", config.display())) && line.contains("queue_depht"),
        "{line}"
    );
    assert_eq!(listed_luns(&portal), vec![0, 5], "nothing changed");
    target.stop("-TERM");
    let _ = std::fs::remove_dir_all(&dir);
}
