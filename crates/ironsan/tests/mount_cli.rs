//! `ironsan mount` as a user runs it, against `ironsan target` (a child process with RAM
//! LUNs on an ephemeral port): the LUNs appear as files of their sizes; unaligned reads
//! and writes through a file agree with what another session (`ironsan read`/`write`)
//! sees, also with sixteen writers sharing blocks at once; `losetup --direct-io=on` on a
//! file → `mkfs.ext4` → mount → a tree of files with known CRCs → unmount, detach,
//! attach again, mount, verify, fsck → fio random read/write with crc32c verify on the
//! loop device (when fio is installed); Ctrl-C unmounts and logs out. A kill -9 of the
//! target makes pending and new I/O fail with EIO within `--io-timeout`, and `umount DIR`
//! still ends the mount. Without `--foreground` the command returns once mounted.
//!
//! Needs /dev/fuse and root (this suite's machines run as root); the loop device parts
//! need losetup and mkfs.ext4. Missing pieces print a SKIPPED line. Every mount, loop
//! device and child is released by a guard even when an assertion fails, and every wait
//! is bounded.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{exe, Proc, LIMIT};
const IQN: &str = "iqn.2026-11.org.ironsan:mnt";
const LUN0_SIZE: u64 = 256 << 20;
const LUN1_SIZE: u64 = 8 << 20;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Whether FUSE mounts can run here; prints the SKIPPED line when not.
fn fuse_usable(test: &str) -> bool {
    if !Path::new("/dev/fuse").exists() {
        println!("SKIPPED {test}: /dev/fuse is missing");
        return false;
    }
    if !is_root() && !have("fusermount3") && !have("fusermount") {
        println!(
            "SKIPPED {test}: not root and no fusermount3 (scripts/install-deps.sh installs fuse3)"
        );
        return false;
    }
    true
}

/// Runs a command to completion, bounded by coreutils `timeout`.
fn run(cmd: &str, args: &[&str]) -> Output {
    let o = Command::new("timeout")
        .args(["-k", "5", "120", cmd])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    if o.status.code() == Some(124) {
        panic!("{cmd} {args:?} did not finish within 120 s");
    }
    o
}

fn run_ok(cmd: &str, args: &[&str]) -> String {
    let o = run(cmd, args);
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn is_mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let d = dir.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(&*d))
}

/// Waits (bounded) until `cond` holds.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A scratch directory, removed when dropped (after the guards below are gone).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("ironsan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn dir(&self, name: &str) -> PathBuf {
        let d = self.0.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Something mounted on `0`: unmounted when dropped (lazily if it is busy).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let d = self.0.to_str().unwrap();
            if !run("umount", &[d]).status.success() {
                let _ = run("umount", &["-l", d]);
            }
        }
    }
}

/// A loop device, detached when dropped.
struct Loop(String);

impl Loop {
    fn attach(file: &Path, direct: bool) -> Loop {
        let dio = if direct {
            "--direct-io=on"
        } else {
            "--direct-io=off"
        };
        let dev = run_ok(
            "losetup",
            &[dio, "--find", "--show", file.to_str().unwrap()],
        );
        Loop(dev.trim().to_string())
    }

    fn direct_io(&self) -> bool {
        let name = self.0.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"))
            .map(|s| s.trim() == "1")
            .unwrap_or(false)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", &self.0]);
    }
}

/// `ironsan target` with two RAM LUNs (512-byte and 4096-byte blocks), iSCSI/TCP and iSER on
/// one port; its portal.
fn start_target(scratch: &Scratch) -> (Proc, String) {
    let cfg = scratch.0.join("target.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"tcp://127.0.0.1:0\", \"iser://127.0.0.1:0\"]\n\
             [[target]]\nname = \"{IQN}\"\n\
             [target.lun.0]\nsize = \"{LUN0_SIZE}\"\nbackend = \"memory\"\n\
             [target.lun.1]\nsize = \"{LUN1_SIZE}\"\nblock_size = 4096\nbackend = \"memory\"\n"
        ),
    )
    .unwrap();
    let mut target = Proc::spawn(&["target", "--config", cfg.to_str().unwrap()]);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    (target, portal)
}

/// `ironsan mount URL DIR --foreground EXTRA...`, waited for until mounted.
fn start_mount(url: &str, dir: &Path, extra: &[&str]) -> (Proc, Mounted) {
    let mut args = vec!["mount", url, dir.to_str().unwrap(), "--foreground"];
    args.extend_from_slice(extra);
    let mut p = Proc::spawn(&args);
    let guard = Mounted(dir.to_path_buf());
    p.wait_line("ironsan: mounted ", ' ');
    assert!(
        is_mounted(dir),
        "{} is not in /proc/self/mounts",
        dir.display()
    );
    (p, guard)
}

/// `n` bytes of a pattern of `seed`.
fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `ironsan read` of the range, through a session of its own.
fn session_read(url: &str, offset: u64, length: u64) -> Vec<u8> {
    let o = run(
        exe(),
        &[
            "read",
            url,
            "--offset",
            &offset.to_string(),
            "--length",
            &length.to_string(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

fn open_direct(path: &Path) -> std::fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", path.display()))
}

#[test]
fn luns_as_files_unaligned_io_ext4_on_a_loop_device_and_fio() {
    let test = "luns_as_files_unaligned_io_ext4_on_a_loop_device_and_fio";
    if !fuse_usable(test) {
        return;
    }
    let scratch = Scratch::new("mount");
    let (_target, portal) = start_target(&scratch);
    let dir = scratch.dir("luns");
    let url0 = format!("iscsi://{portal}/{IQN}/0");
    let url1 = format!("iscsi://{portal}/{IQN}/1");
    // The URL names no LUN: every LUN of the target is a file.
    let (mut mount, fuse_guard) = start_mount(&format!("iscsi://{portal}/{IQN}"), &dir, &[]);

    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["lun0", "lun1"]);
    let lun0 = dir.join("lun0");
    let lun1 = dir.join("lun1");
    assert_eq!(std::fs::metadata(&lun0).unwrap().len(), LUN0_SIZE);
    assert_eq!(std::fs::metadata(&lun1).unwrap().len(), LUN1_SIZE);

    // Unaligned writes through the page cache (write-through) and with O_DIRECT; the
    // other session sees exactly them, and the file reads them back.
    let mut model = vec![0u8; 64 << 10];
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lun0)
        .unwrap();
    let a = pattern(1, 10_000);
    f.write_all_at(&a, 1000).unwrap();
    model[1000..11_000].copy_from_slice(&a);
    let d = open_direct(&lun0);
    let b = pattern(2, 3);
    d.write_all_at(&b, 4095).unwrap();
    model[4095..4098].copy_from_slice(&b);
    let c = pattern(3, 70_000 - 40_000);
    d.write_all_at(&c[..20_000], 40_001).unwrap();
    model[40_001..60_001].copy_from_slice(&c[..20_000]);
    f.sync_all().expect("fsync (SYNCHRONIZE CACHE)");
    assert_eq!(
        session_read(&url0, 0, 64 << 10),
        model,
        "another session's view"
    );
    let mut back = vec![0u8; 50_007];
    d.read_exact_at(&mut back, 3).unwrap();
    assert_eq!(
        back,
        model[3..50_010],
        "O_DIRECT read at an unaligned offset"
    );
    // A fresh open drops cached pages (the O_DIRECT writes went around them).
    let mut back = vec![0u8; 64 << 10];
    std::fs::File::open(&lun0)
        .unwrap()
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert_eq!(back, model, "buffered read");

    // What the other session writes, the file reads (O_DIRECT: no cached copy).
    let img = scratch.0.join("img");
    let w = pattern(4, 8192);
    std::fs::write(&img, &w).unwrap();
    run_ok(
        exe(),
        &[
            "write",
            &url1,
            "--offset",
            "12288",
            "--input",
            img.to_str().unwrap(),
        ],
    );
    let d1 = open_direct(&lun1);
    let mut back = vec![0u8; 8192 + 100];
    d1.read_exact_at(&mut back, 12288 - 50).unwrap();
    assert_eq!(&back[50..8242], &w[..], "ironsan write seen through lun1");
    assert!(back[..50].iter().all(|&x| x == 0));

    // Sixteen writers at once, each an unaligned range sharing 4 KiB blocks with its
    // neighbours: none loses another's bytes (the read-modify-write range lock).
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let d1 = &d1;
            s.spawn(move || {
                let bytes = vec![i as u8 + 1; 1500];
                d1.write_all_at(&bytes, 100 + i * 1500).unwrap();
            });
        }
    });
    let mut back = vec![0u8; 16 * 1500];
    d1.read_exact_at(&mut back, 100).unwrap();
    for i in 0..16 {
        assert!(
            back[i * 1500..(i + 1) * 1500]
                .iter()
                .all(|&x| x == i as u8 + 1),
            "writer {i}'s bytes"
        );
    }
    assert_eq!(
        session_read(&url1, 0, 32 << 10)[100..100 + 16 * 1500],
        back[..]
    );

    // The end of the LUN: reads stop there, writes past it fail, the size is fixed.
    let mut tail = vec![0u8; 100];
    assert_eq!(d1.read_at(&mut tail, LUN1_SIZE - 10).unwrap(), 10);
    assert_eq!(d1.read_at(&mut tail, LUN1_SIZE).unwrap(), 0);
    let e = d1.write_at(&[1, 2, 3], LUN1_SIZE).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(d1.set_len(0).is_err(), "truncating a LUN");
    assert_eq!(std::fs::metadata(&lun1).unwrap().len(), LUN1_SIZE);
    drop((f, d, d1));

    if !is_root() || !have("losetup") || !have("mkfs.ext4") {
        println!("SKIPPED {test} (loop device part): needs root, losetup and mkfs.ext4");
    } else {
        ext4_on_loop(&scratch, &lun0, &url0, 32);
    }

    // Ctrl-C: unmounted, logged out, exit 0.
    mount.signal("-INT");
    let st = mount.wait_exit(LIMIT);
    assert!(st.success(), "ironsan mount exited with {st} after SIGINT");
    assert!(!is_mounted(&dir), "Ctrl-C unmounts");
    drop(fuse_guard);
}

/// losetup --direct-io=on → mkfs.ext4 → a tree with known CRCs → unmount, detach, attach,
/// mount, verify, fsck → fio with crc32c verify on the loop device.
fn ext4_on_loop(scratch: &Scratch, lun0: &Path, url0: &str, fio_mib: u32) {
    let mnt = scratch.dir("ext4");
    let lo = Loop::attach(lun0, true);
    assert!(lo.direct_io(), "{}: direct I/O is on", lo.0);
    run_ok("mkfs.ext4", &["-q", "-F", &lo.0]);
    run_ok("mount", &[&lo.0, mnt.to_str().unwrap()]);
    let ext4 = Mounted(mnt.clone());
    let mut tree = Vec::new();
    for i in 0..24u64 {
        let rel = format!("d{}/s{}/f{i}", i % 3, i % 5);
        let size = (pattern(100 + i, 4)
            .iter()
            .fold(0usize, |a, &b| a * 256 + b as usize)
            % (700 << 10))
            + i as usize;
        let data = pattern(1000 + i, size);
        let p = mnt.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &data).unwrap();
        tree.push((rel, size, digest::crc32c(&data)));
    }
    run_ok("sync", &[]);
    drop(ext4);
    assert!(!is_mounted(&mnt));
    drop(lo);

    // Anew, through a fresh loop device: everything is there.
    let lo = Loop::attach(lun0, true);
    run_ok("fsck.ext4", &["-fn", &lo.0]);
    run_ok("mount", &[&lo.0, mnt.to_str().unwrap()]);
    let ext4 = Mounted(mnt.clone());
    for (rel, size, crc) in &tree {
        let data = std::fs::read(mnt.join(rel)).unwrap();
        assert_eq!(data.len(), *size, "{rel}");
        assert_eq!(digest::crc32c(&data), *crc, "{rel}");
    }
    drop(ext4);

    // The file system's superblock as the other session reads it: ext4's magic.
    let sb = session_read(url0, 1024, 1024);
    assert_eq!(
        &sb[0x38..0x3a],
        &[0x53, 0xef],
        "ext4 magic seen by another session"
    );

    if !have("fio") {
        println!("SKIPPED fio verify through the loop device: fio is not installed");
        return;
    }
    let out = run_ok(
        "fio",
        &[
            "--name=verify",
            &format!("--filename={}", lo.0),
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=16",
            "--rw=randrw",
            "--bs=4k",
            &format!("--size={fio_mib}m"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=terse",
        ],
    );
    // fio exits non-zero on any verify or I/O error (checked above); terse v3 has the
    // error number in field 5 and the KiB read in field 6.
    let fields: Vec<&str> = out.trim().lines().last().unwrap().split(';').collect();
    assert!(fields.len() > 50, "fio terse output: {out}");
    assert_eq!(fields[4], "0", "fio error: {out}");
    let read_kib: u64 = fields[5].parse().unwrap();
    assert!(read_kib > 0, "fio read something: {out}");
}

/// `tgtd` (Debian's tgt) on a free port with LUN 1 on a file of `bytes`; killed when dropped.
fn start_tgtd(scratch: &Scratch, bytes: u64) -> Option<(Proc, String)> {
    let sbin = |t: &str| {
        ["/usr/sbin", "/sbin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(t))
            .find(|p| p.is_file())
    };
    let (tgtd, tgtadm) = (sbin("tgtd")?, sbin("tgtadm")?);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // tgtd's control "port" names its management socket and must be small.
    let ctl = (100 + port % 10_000).to_string();
    let img = scratch.0.join("tgtd.img");
    std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
    let child = Command::new(&tgtd)
        .args([
            "-f",
            "-C",
            &ctl,
            "--iscsi",
            &format!("portal=127.0.0.1:{port}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let p = Proc::adopt(child);
    wait_for("tgtd listens", LIMIT, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let img = img.to_str().unwrap();
    let iqn = "iqn.2026-11.org.ironsan.test:tgtd";
    for step in [
        vec!["--op", "new", "--mode", "target", "--tid", "1", "-T", iqn],
        vec![
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            img,
        ],
        vec![
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ],
    ] {
        let mut args = vec!["-C", &ctl, "--lld", "iscsi"];
        args.extend(step);
        run_ok(tgtadm.to_str().unwrap(), &args);
    }
    Some((p, format!("iscsi://127.0.0.1:{port}/{iqn}")))
}

#[test]
fn a_tgtd_lun_mounted_carries_ext4_on_a_loop_device() {
    let test = "a_tgtd_lun_mounted_carries_ext4_on_a_loop_device";
    if !fuse_usable(test) {
        return;
    }
    if !is_root() || !have("losetup") || !have("mkfs.ext4") {
        println!("SKIPPED {test}: needs root, losetup and mkfs.ext4");
        return;
    }
    let scratch = Scratch::new("mount-tgtd");
    let Some((_tgtd, url)) = start_tgtd(&scratch, 128 << 20) else {
        println!("SKIPPED {test}: tgtd is not installed (scripts/install-deps.sh installs tgt)");
        return;
    };
    let dir = scratch.dir("luns");
    // No LUN in the URL: tgtd's LUN 0 is its controller (not a disk) and is left out.
    let (mut mount, _guard) = start_mount(&url, &dir, &[]);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["lun1"]);
    let lun1 = dir.join("lun1");
    assert_eq!(std::fs::metadata(&lun1).unwrap().len(), 128 << 20);
    ext4_on_loop(&scratch, &lun1, &format!("{url}/1"), 16);
    mount.signal("-TERM");
    assert!(mount.wait_exit(LIMIT).success());
    assert!(!is_mounted(&dir));
}

#[test]
fn killed_target_fails_io_with_eio_within_the_timeout_and_umount_still_works() {
    let test = "killed_target_fails_io_with_eio_within_the_timeout_and_umount_still_works";
    if !fuse_usable(test) {
        return;
    }
    let scratch = Scratch::new("mount-kill");
    let (mut target, portal) = start_target(&scratch);
    let dir = scratch.dir("luns");
    let timeout = 3;
    let (mut mount, _guard) = start_mount(
        &format!("iscsi://{portal}/{IQN}/0"),
        &dir,
        &["--reconnect", "--io-timeout", &timeout.to_string()],
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["lun0"], "the URL names one LUN");
    let lun0 = dir.join("lun0");

    // A writer keeps I/O pending; it reports its first error and when it came.
    let (tx, rx) = mpsc::channel();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let lun0 = lun0.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let f = open_direct(&lun0);
            let data = pattern(7, 64 << 10);
            let mut at = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Err(e) = f.write_all_at(&data, at % (LUN0_SIZE - (64 << 10))) {
                    let _ = tx.send((e.raw_os_error(), Instant::now()));
                    return;
                }
                at += 64 << 10;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    target.signal("-KILL");
    let killed = Instant::now();
    target.wait_exit(LIMIT);
    let bound = Duration::from_secs(timeout + 3);
    let (errno, when) = rx
        .recv_timeout(bound + LIMIT)
        .expect("the pending write fails");
    assert_eq!(errno, Some(libc::EIO));
    assert!(
        when - killed <= bound,
        "pending write failed {:?} after the kill (--io-timeout {timeout})",
        when - killed
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();

    // New I/O fails the same way, within the timeout, never hangs.
    let start = Instant::now();
    let d = open_direct(&lun0);
    let mut buf = vec![0u8; 4096];
    let e = d.read_exact_at(&mut buf, 1 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        start.elapsed() <= bound,
        "read failed after {:?}",
        start.elapsed()
    );
    drop(d);

    // umount DIR ends it.
    run_ok("umount", &[dir.to_str().unwrap()]);
    let st = mount.wait_exit(LIMIT);
    assert!(st.success(), "ironsan mount exited with {st} after umount");
    assert!(!is_mounted(&dir));
}

#[test]
fn a_lun_mounted_over_iser_reads_and_writes_what_another_session_sees() {
    let test = "a_lun_mounted_over_iser_reads_and_writes_what_another_session_sees";
    if !fuse_usable(test) {
        return;
    }
    let scratch = Scratch::new("mount-iser");
    let (_target, portal) = start_target(&scratch);
    let dir = scratch.dir("luns");
    let (mut mount, fuse_guard) = start_mount(&format!("iser://{portal}/{IQN}/0"), &dir, &[]);
    let lun0 = dir.join("lun0");
    assert_eq!(std::fs::metadata(&lun0).unwrap().len(), LUN0_SIZE);
    // Unaligned and O_DIRECT writes over iSER; a session over iSCSI/TCP sees them.
    let mut model = vec![0u8; 1 << 20];
    let d = open_direct(&lun0);
    let a = pattern(7, 300_000);
    d.write_all_at(&a, 70_001).unwrap();
    model[70_001..370_001].copy_from_slice(&a);
    let b = pattern(8, 5);
    d.write_all_at(&b, 511).unwrap();
    model[511..516].copy_from_slice(&b);
    d.sync_all().expect("fsync (SYNCHRONIZE CACHE)");
    let url = format!("iscsi://{portal}/{IQN}/0");
    assert_eq!(
        session_read(&url, 0, 1 << 20),
        model,
        "the TCP session's view"
    );
    let mut back = vec![0u8; 400_000];
    d.read_exact_at(&mut back, 3).unwrap();
    assert_eq!(back, model[3..400_003], "read back over iSER");
    drop(d);
    mount.signal("-INT");
    let st = mount.wait_exit(LIMIT);
    assert!(st.success(), "ironsan mount exited with {st} after SIGINT");
    assert!(!is_mounted(&dir));
    drop(fuse_guard);
}

#[test]
fn without_foreground_it_returns_once_mounted_and_umount_ends_it() {
    let test = "without_foreground_it_returns_once_mounted_and_umount_ends_it";
    if !fuse_usable(test) {
        return;
    }
    let scratch = Scratch::new("mount-bg");
    let (_target, portal) = start_target(&scratch);
    let dir = scratch.dir("luns");
    let guard = Mounted(dir.clone());
    let out = run_ok(
        exe(),
        &[
            "mount",
            &format!("iscsi://{portal}/{IQN}/1"),
            dir.to_str().unwrap(),
        ],
    );
    assert!(is_mounted(&dir), "{out}");
    let pid: u32 = out
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {out:?}"));
    assert_eq!(
        std::fs::metadata(dir.join("lun1")).unwrap().len(),
        LUN1_SIZE
    );
    let alive = || Path::new(&format!("/proc/{pid}")).exists();
    assert!(alive());
    run_ok("umount", &[dir.to_str().unwrap()]);
    // The background process is not our child: it goes away (init reaps it).
    wait_for("the background mount ends", LIMIT, || {
        !alive()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
    });
    drop(guard);
}
