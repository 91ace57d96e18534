//! What the CLI tests share: the ironsan binary run as a child process whose stdout lines are
//! read on a thread, with bounded waits for a line, for its exit and after a signal.

// Each test file uses a part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Every wait of the CLI tests is bounded by this.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The ironsan binary under test.
pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ironsan")
}

/// A running ironsan; killed (and reaped) when dropped.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `ironsan ARGS`: a target's log is dropped, another command's goes to the
    /// test's stderr.
    pub fn spawn(args: &[&str]) -> Proc {
        let stderr = if args[0] == "target" {
            Stdio::null()
        } else {
            Stdio::inherit()
        };
        let mut cmd = Command::new(exe());
        cmd.args(args).stderr(stderr);
        Proc::start(cmd)
    }

    /// Starts `ironsan ARGS` at the default log level with its stderr in the file `log`.
    pub fn spawn_logging_to(args: &[&str], log: &Path) -> Proc {
        let mut cmd = Command::new(exe());
        cmd.args(args)
            .env_remove("IRONSAN_LOG")
            .stderr(std::fs::File::create(log).expect("log file"));
        Proc::start(cmd)
    }

    /// Starts `ironsan ARGS` at the default log level with `env` added to its environment
    /// and its stderr in the file `log`.
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)], log: &Path) -> Proc {
        let mut cmd = Command::new(exe());
        cmd.args(args)
            .env_remove("IRONSAN_LOG")
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(log).expect("log file"));
        Proc::start(cmd)
    }

    /// Another program's child (e.g. tgtd), killed with the guard; it has no lines.
    pub fn adopt(child: Child) -> Proc {
        let (_tx, lines) = mpsc::channel();
        Proc { child, lines }
    }

    fn start(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start ironsan");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    /// The text after `prefix` on the first line starting with it, up to `end`.
    pub fn wait_line(&mut self, prefix: &str, end: char) -> String {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("ironsan exited ({st}) before printing {prefix:?}");
            }
            assert!(
                start.elapsed() < LIMIT,
                "no line starting {prefix:?} within {LIMIT:?}"
            );
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.split(end).next().unwrap().trim().to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
            }
        }
    }

    /// Sends `signal` (e.g. "-INT") to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Waits (bounded) for the process to exit; its status.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "ironsan did not end within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` and waits (bounded) for a successful exit.
    pub fn stop(mut self, signal: &str) {
        self.signal(signal);
        let st = self.wait_exit(LIMIT);
        assert!(st.success(), "ironsan exited with {st} after {signal}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
