//! `ironsan nbd` as a user runs it: against `ironsan target`, both on ephemeral ports; the
//! export answers the NBD greeting (and `qemu-img info` where qemu-img is installed), and
//! SIGINT (Ctrl-C) ends it cleanly, removing its Unix socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ironsan"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(if args[0] == "target" {
                Stdio::null()
            } else {
                Stdio::inherit()
            })
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
    fn wait_line(&self, prefix: &str, end: char) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(LIMIT)
                .unwrap_or_else(|_| panic!("no line starting {prefix:?} within {LIMIT:?}"));
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.split(end).next().unwrap().trim().to_string();
            }
        }
    }

    /// Sends `signal` and waits (bounded) for a successful exit.
    fn stop(mut self, signal: &str) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(ok.success());
        let start = std::time::Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "ironsan exited with {st} after {signal}");
                return;
            }
            if start.elapsed() > LIMIT {
                let _ = self.child.kill();
                panic!("ironsan did not end within {LIMIT:?} of {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the NBD greeting from `s`: NBDMAGIC, IHAVEOPT, fixed newstyle.
fn greeted(mut s: impl Read) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).expect("greeting");
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(g[17] & 1, 1, "fixed newstyle");
}

#[test]
fn nbd_command_serves_and_ends_on_ctrl_c() {
    let target = Proc::spawn(&["target", "--portal", "127.0.0.1:0"]);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let url = format!("iscsi://{portal}/iqn.2026-11.org.ironsan:default/0");

    let nbd = Proc::spawn(&["nbd", &url, "--listen", "127.0.0.1:0"]);
    let addr = nbd.wait_line("ironsan: serving NBD on ", ';');
    let s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    greeted(&s);
    let mut s = s;
    // Abort politely: client flags, NBD_OPT_ABORT.
    let mut abort = 1u32.to_be_bytes().to_vec();
    abort.extend_from_slice(b"IHAVEOPT");
    abort.extend_from_slice(&2u32.to_be_bytes());
    abort.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&abort).unwrap();
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        u32::from_be_bytes(reply[12..16].try_into().unwrap()),
        1,
        "ACK"
    );
    let qemu = Command::new("qemu-img").arg("--version").output().is_ok();
    if qemu {
        let o = Command::new("timeout")
            .args(["60", "qemu-img", "info", &format!("nbd://{addr}")])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("1073741824 bytes"), "{out}");
    } else {
        eprintln!("(qemu-img is not installed: the qemu-img info step is skipped)");
    }
    nbd.stop("-INT");

    // The Unix socket variant; Ctrl-C removes the socket.
    let dir = std::env::temp_dir().join(format!("ironsan-nbd-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nbd.sock");
    let nbd = Proc::spawn(&["nbd", &url, "--socket", sock.to_str().unwrap()]);
    let shown = nbd.wait_line("ironsan: serving NBD on ", ';');
    assert_eq!(shown, sock.display().to_string());
    let s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    greeted(&s);
    drop(s);
    nbd.stop("-INT");
    assert!(!sock.exists(), "the socket is removed on exit");
    let _ = std::fs::remove_dir_all(&dir);
    target.stop("-TERM");
}
