//! `ironsan nbd` as a user runs it: against `ironsan target`, both on ephemeral ports; the
//! export answers the NBD greeting (and `qemu-img info` where qemu-img is installed), and
//! SIGINT (Ctrl-C) ends it cleanly, removing its Unix socket.

use std::io::{Read, Write};
use std::process::Command;

mod common;
use common::{Proc, LIMIT};

/// Reads the NBD greeting from `s`: NBDMAGIC, IHAVEOPT, fixed newstyle.
fn greeted(mut s: impl Read) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).expect("greeting");
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(g[17] & 1, 1, "fixed newstyle");
}

#[test]
fn nbd_command_serves_and_ends_on_ctrl_c() {
    let mut target = Proc::spawn(&["target", "--portal", "127.0.0.1:0"]);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let url = format!("iscsi://{portal}/iqn.2026-11.org.ironsan:default/0");

    let mut nbd = Proc::spawn(&["nbd", &url, "--listen", "127.0.0.1:0"]);
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
    let mut nbd = Proc::spawn(&["nbd", &url, "--socket", sock.to_str().unwrap()]);
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
