//! The NBD server of an in-process ironsan target's LUN against real clients (qemu-img,
//! qemu-io, nbdinfo; a test whose tool is missing says so and passes) and against a raw
//! client written here that breaks the protocol on purpose while well-behaved clients go on.

use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iscsi_initiator::{IscsiUrl, Session};
use lun_io::Lun;
use nbd::proto::{self, cmd, errno, opt, rep};
use nbd::server::{Server, Timeouts, MAX_REQUEST};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use test_support::random_bytes;

const IQN: &str = "iqn.2026-11.org.ironsan:nbd";
const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
queue_depth = 64

[[target]]
name = "iqn.2026-11.org.ironsan:nbd"
[target.lun.0]
size = "64MiB"
backend = "memory"
[target.lun.1]
size = "8MiB"
backend = "memory"
block_size = 4096
"#;

/// Every wait of these tests is bounded by this.
const LIMIT: Duration = Duration::from_secs(120);
/// Requests of one client the test servers carry out or answer at once.
const IN_FLIGHT: usize = 32;

struct Fixture {
    nbd: SocketAddr,
    session: Arc<Session>,
    server: Arc<Server>,
}

/// An ironsan target in this process, a session to its LUN `lun`, and the NBD server of
/// that LUN on an ephemeral loopback port.
async fn start(lun: u16) -> Fixture {
    start_over(lun, "iscsi", Timeouts::default()).await
}

/// As [`start`], the server with `timeouts`.
async fn start_with(lun: u16, timeouts: Timeouts) -> Fixture {
    start_over(lun, "iscsi", timeouts).await
}

/// As [`start`], the session over `scheme` (`iscsi` or `iser`: the target then serves
/// iSCSI/TCP and iSER on one port) and the server with `timeouts`.
async fn start_over(lun: u16, scheme: &str, timeouts: Timeouts) -> Fixture {
    start_configured(lun, scheme, |s| s.with_timeouts(timeouts)).await
}

/// As [`start_over`], the server as `configure` makes it.
async fn start_configured(
    lun: u16,
    scheme: &str,
    configure: impl FnOnce(Server) -> Server,
) -> Fixture {
    let config = if scheme == "iser" {
        let port = test_support::target::free_port();
        CONFIG.replace(
            r#"portals = ["127.0.0.1:0"]"#,
            &format!(r#"portals = ["tcp://127.0.0.1:{port}", "iser://127.0.0.1:{port}"]"#),
        )
    } else {
        CONFIG.to_string()
    };
    let target = test_support::start_target(&config).await;
    let url = IscsiUrl::parse_lun(&format!("{scheme}://{target}/{IQN}/{lun}")).unwrap();
    let session = Arc::new(test_support::connect(&url).await.expect("login"));
    let l = Arc::new(Lun::open(session.clone(), lun).await.expect("open the LUN"));
    let server = Arc::new(configure(Server::new(
        l,
        "lun".into(),
        "a test LUN".into(),
        IN_FLIGHT,
    )));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nbd = listener.local_addr().unwrap();
    tokio::spawn(server.clone().serve_tcp(listener));
    Fixture {
        nbd,
        session,
        server,
    }
}

fn uri(a: SocketAddr) -> String {
    format!("nbd://{a}")
}

/// Whether `tool` runs here; if not, says which test is skipped and why.
fn have(tool: &str, test: &str) -> bool {
    let ok = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "SKIPPED {test}: `{tool}` is not installed (scripts/install-deps.sh installs it)"
        );
    }
    ok
}

async fn run(tool: &str, args: &[&str]) -> Output {
    let child = tokio::process::Command::new(tool)
        .args(args)
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(LIMIT, child).await {
        Ok(r) => r.unwrap_or_else(|e| panic!("running {tool}: {e}")),
        Err(_) => panic!("{tool} {args:?} did not finish within {LIMIT:?}"),
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs qemu-io with `cmds` on the export and checks every command succeeded and every
/// pattern matched.
async fn qemu_io(target: &str, cmds: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(target);
    let o = run("qemu-io", &args).await;
    let out = text(&o);
    assert!(o.status.success(), "qemu-io failed:\n{out}");
    for bad in ["Pattern verification failed", "failed", "error", "Error"] {
        assert!(!out.contains(bad), "qemu-io reported {bad:?}:\n{out}");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_convert_then_compare() {
    if !have("qemu-img", "qemu_img_convert_then_compare") {
        return;
    }
    let f = start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("random.raw");
    let data = random_bytes(64 << 20, 0x5eed);
    std::fs::write(&src, &data).unwrap();
    let src = src.to_str().unwrap();
    let dst = uri(f.nbd);
    let t = Instant::now();
    let o = run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", src, &dst],
    )
    .await;
    let secs = t.elapsed().as_secs_f64();
    assert!(o.status.success(), "qemu-img convert:\n{}", text(&o));
    eprintln!(
        "qemu-img convert of 64 MiB into the export: {:.0} MB/s",
        64.0 * 1.048576 / secs
    );
    let o = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", src, &dst],
    )
    .await;
    assert!(o.status.success(), "qemu-img compare:\n{}", text(&o));
    assert!(text(&o).contains("Images are identical"), "{}", text(&o));
    // The bytes are on the LUN itself, read without NBD.
    let back = f
        .session
        .read(0, (40 << 20) / 512, 2048, 512)
        .await
        .unwrap();
    assert_eq!(&back[..], &data[40 << 20..(40 << 20) + (1 << 20)]);
    // And compare does see a difference.
    let mut changed = data.to_vec();
    changed[12345] ^= 1;
    let other = dir.path().join("changed.raw");
    std::fs::write(&other, &changed).unwrap();
    let o = run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            other.to_str().unwrap(),
            &dst,
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // (qemu-img names the start of the chunk it compared: 12345 lies in 12288..16384)
    assert!(
        text(&o).contains("Content mismatch at offset 12288"),
        "{}",
        text(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_unaligned_writes_and_reads() {
    if !have("qemu-io", "qemu_io_unaligned_writes_and_reads") {
        return;
    }
    // 4096-byte blocks: every write below read-modify-writes at least one of them.
    let f = start(1).await;
    let dst = uri(f.nbd);
    qemu_io(
        &dst,
        &[
            "write -P 0xab 1000 3000",
            "read -P 0xab 1000 3000",
            "read -P 0 0 1000",
            "read -P 0 4000 4192",
            // Across four blocks, partial at both ends.
            "write -P 0xcd 4090 8200",
            "read -P 0xcd 4090 8200",
            "read -P 0xab 1000 3000",
            "read -P 0 4000 90",
            "read -P 0 12290 100",
            // FUA, zeroes inside a written range (WRITE SAME + partial blocks), flush, trim.
            "write -f -P 0x77 40000 100",
            "read -P 0x77 40000 100",
            "write -P 0x5a 16384 12288",
            "write -z 20000 5000",
            "read -P 0x5a 16384 3616",
            "read -P 0 20000 5000",
            "read -P 0x5a 25000 3672",
            "write -z 65536 16384",
            "read -P 0 65536 16384",
            "flush",
            "discard 131072 65536",
        ],
    )
    .await;
    // Eight writers into one block at once (qemu-io keeps them all in flight): none loses
    // another's bytes.
    let mut cmds = Vec::new();
    for i in 0..8u32 {
        cmds.push(format!(
            "aio_write -P 0x{:x} {} 100",
            0x11 * (i + 1),
            81920 + i * 100
        ));
    }
    cmds.push("aio_flush".into());
    for i in 0..8u32 {
        cmds.push(format!(
            "read -P 0x{:x} {} 100",
            0x11 * (i + 1),
            81920 + i * 100
        ));
    }
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(&dst, &cmds).await;
    // The same bytes read straight from the LUN.
    let block = f.session.read(1, 1000 / 4096, 1, 4096).await.unwrap();
    assert!(block[..1000].iter().all(|&b| b == 0));
    assert!(block[1000..4000].iter().all(|&b| b == 0xab));
}

/// The same clients over a session on iSER (the software RNIC in this process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_iser() {
    if !have("qemu-img", "over_iser") || !have("qemu-io", "over_iser") {
        return;
    }
    let f = start_over(1, "iser", Timeouts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("random.raw");
    std::fs::write(&src, random_bytes(8 << 20, 0x15e7)).unwrap();
    let src = src.to_str().unwrap();
    let dst = uri(f.nbd);
    let o = run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", src, &dst],
    )
    .await;
    assert!(o.status.success(), "qemu-img convert:\n{}", text(&o));
    let o = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", src, &dst],
    )
    .await;
    assert!(text(&o).contains("Images are identical"), "{}", text(&o));
    qemu_io(
        &dst,
        &[
            "write -P 0xab 1000 3000",
            "read -P 0xab 1000 3000",
            "write -z 5000 10000",
            "read -P 0 5000 10000",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_lists_the_export_and_its_size() {
    if !have("nbdinfo", "nbdinfo_lists_the_export_and_its_size") {
        return;
    }
    let f = start(0).await;
    let o = run("nbdinfo", &["--size", &uri(f.nbd)]).await;
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (64u64 << 20).to_string()
    );
    let o = run("nbdinfo", &["--list", &uri(f.nbd)]).await;
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("export=\"lun\""), "{out}");
    assert!(out.contains("a test LUN"), "{out}");
    assert!(out.contains("block_size_minimum: 1"), "{out}");
    assert_eq!(f.server.export().size, 64 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket() {
    if !have("qemu-io", "unix_socket") {
        return;
    }
    let f = start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(f.server.clone().serve_unix(listener));
    let target = format!("nbd+unix:///?socket={}", path.display());
    qemu_io(
        &target,
        &["write -P 0x42 1048576 65536", "read -P 0x42 1048576 65536"],
    )
    .await;
}

// ------------------------------------------------------------- a raw client written here

/// Reads exactly `n` bytes (bounded wait).
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    tokio::time::timeout(LIMIT, s.read_exact(&mut b))
        .await
        .expect("server answers in time")
        .expect("read");
    b
}

async fn send_option(s: &mut TcpStream, code: u32, data: &[u8]) {
    let mut v = proto::IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&code.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v).await.unwrap();
}

/// (option, reply type, payload)
async fn option_reply(s: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let h = read_n(s, 20).await;
    assert_eq!(
        u64::from_be_bytes(h[0..8].try_into().unwrap()),
        proto::OPTION_REPLY_MAGIC
    );
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    (
        u32::from_be_bytes(h[8..12].try_into().unwrap()),
        u32::from_be_bytes(h[12..16].try_into().unwrap()),
        read_n(s, len).await,
    )
}

/// Greeting and client flags.
async fn connect(a: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(a).await.unwrap();
    let g = read_n(&mut s, 18).await;
    assert_eq!(&g[0..8], b"NBDMAGIC");
    s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
        .await
        .unwrap();
    s
}

/// Connects and enters transmission with NBD_OPT_GO (optionally structured replies).
async fn client(a: SocketAddr, structured: bool) -> TcpStream {
    let mut s = connect(a).await;
    if structured {
        send_option(&mut s, opt::STRUCTURED_REPLY, &[]).await;
        assert_eq!(option_reply(&mut s).await.1, rep::ACK);
    }
    send_option(&mut s, opt::GO, &[0, 0, 0, 0, 0, 0]).await;
    loop {
        let (_, kind, _) = option_reply(&mut s).await;
        if kind == rep::ACK {
            return s;
        }
        assert_eq!(kind, rep::INFO);
    }
}

async fn request(s: &mut TcpStream, kind: u16, handle: u64, offset: u64, len: u32, data: &[u8]) {
    let mut v = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&handle.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v).await.unwrap();
}

/// A simple reply: (error, handle).
async fn simple_reply(s: &mut TcpStream) -> (u32, u64) {
    let h = read_n(s, 16).await;
    assert_eq!(
        u32::from_be_bytes(h[0..4].try_into().unwrap()),
        proto::SIMPLE_REPLY_MAGIC
    );
    (
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

/// One structured chunk: (flags, type, handle, payload).
async fn chunk(s: &mut TcpStream) -> (u16, u16, u64, Vec<u8>) {
    let h = read_n(s, 20).await;
    assert_eq!(
        u32::from_be_bytes(h[0..4].try_into().unwrap()),
        proto::STRUCTURED_REPLY_MAGIC
    );
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    (
        u16::from_be_bytes([h[4], h[5]]),
        u16::from_be_bytes([h[6], h[7]]),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
        read_n(s, len).await,
    )
}

/// The server closes `s` (reads end) within the limit.
async fn closed_by_server(s: &mut TcpStream) {
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(LIMIT, s.read(&mut b)).await {
            Err(_) => panic!("the server kept the connection open"),
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_get_protocol_errors_and_others_carry_on() {
    let f = start(0).await;
    let size = 64u64 << 20;
    // A well-behaved client that stays connected throughout.
    let mut good = client(f.nbd, false).await;

    // An unknown option: NBD_REP_ERR_UNSUP, and the same client then lists and goes on.
    let mut a = connect(f.nbd).await;
    send_option(&mut a, 0x4242, b"?").await;
    let (o, kind, msg) = option_reply(&mut a).await;
    assert_eq!((o, kind), (0x4242, rep::ERR_UNSUP));
    assert!(!msg.is_empty());
    send_option(&mut a, opt::LIST, &[]).await;
    let (_, kind, payload) = option_reply(&mut a).await;
    assert_eq!(kind, rep::SERVER);
    assert_eq!(&payload[4..7], b"lun");
    assert_eq!(option_reply(&mut a).await.1, rep::ACK);
    // GO for an export that does not exist: an error, not a hang-up.
    let mut go = 5u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"other");
    go.extend_from_slice(&[0, 0]);
    send_option(&mut a, opt::GO, &go).await;
    assert_eq!(option_reply(&mut a).await.1, rep::ERR_UNKNOWN);
    send_option(&mut a, opt::ABORT, &[]).await;
    assert_eq!(option_reply(&mut a).await.1, rep::ACK);
    closed_by_server(&mut a).await;

    // Out-of-range requests, simple replies: EINVAL for a read (no data follows), ENOSPC
    // for a write; the connection carries on.
    request(&mut good, cmd::READ, 1, size, 512, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (errno::EINVAL, 1));
    request(&mut good, cmd::READ, 2, u64::MAX - 10, 512, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (errno::EINVAL, 2));
    request(&mut good, cmd::WRITE, 3, size - 2, 4, &[1, 2, 3, 4]).await;
    assert_eq!(simple_reply(&mut good).await, (errno::ENOSPC, 3));
    request(&mut good, cmd::WRITE_ZEROES, 4, size, 1, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (errno::ENOSPC, 4));
    request(&mut good, 42, 5, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (errno::EINVAL, 5));
    request(&mut good, cmd::FLUSH, 6, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (0, 6));

    // The same with structured replies: an error chunk with a message, then data chunks.
    let mut st = client(f.nbd, true).await;
    request(&mut st, cmd::READ, 7, size - 100, 200, &[]).await;
    let (flags, kind, handle, payload) = chunk(&mut st).await;
    assert_eq!(
        (flags, kind, handle),
        (proto::REPLY_FLAG_DONE, proto::REPLY_TYPE_ERROR, 7)
    );
    assert_eq!(
        u32::from_be_bytes(payload[0..4].try_into().unwrap()),
        errno::EINVAL
    );
    assert!(String::from_utf8_lossy(&payload[6..]).contains("past the end"));
    request(&mut st, cmd::WRITE, 8, 777, 5, b"hello").await;
    assert_eq!(simple_reply(&mut st).await, (0, 8));
    request(&mut st, cmd::READ, 9, 777, 5, &[]).await;
    let (flags, kind, handle, payload) = chunk(&mut st).await;
    assert_eq!(
        (flags, kind, handle),
        (proto::REPLY_FLAG_DONE, proto::REPLY_TYPE_OFFSET_DATA, 9)
    );
    assert_eq!(u64::from_be_bytes(payload[0..8].try_into().unwrap()), 777);
    assert_eq!(&payload[8..], b"hello");

    // A client that vanishes in the middle of a 1 MiB write: nothing of it lands.
    let mut v = client(f.nbd, false).await;
    request(&mut v, cmd::WRITE, 10, 8 << 20, 1 << 20, &[0xee; 1000]).await;
    drop(v);
    // Bad request magic, and bad client flags: the server hangs up on those two.
    let mut m = client(f.nbd, false).await;
    m.write_all(&[0xde; 28]).await.unwrap();
    closed_by_server(&mut m).await;
    let mut c = TcpStream::connect(f.nbd).await.unwrap();
    read_n(&mut c, 18).await;
    c.write_all(&0x80u32.to_be_bytes()).await.unwrap();
    closed_by_server(&mut c).await;

    // Meanwhile the first client is served as before.
    request(&mut good, cmd::READ, 11, 8 << 20, 4096, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (0, 11));
    let data = read_n(&mut good, 4096).await;
    assert!(
        data.iter().all(|&b| b == 0),
        "the vanished client's write did not land"
    );
    request(&mut good, cmd::READ, 12, 777, 5, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (0, 12));
    assert_eq!(read_n(&mut good, 5).await, b"hello");
    request(&mut good, cmd::DISC, 13, 0, 0, &[]).await;
    closed_by_server(&mut good).await;

    // And so is a new one, with a real client where there is one.
    if have("qemu-io", "the qemu-io part of bad_clients_...") {
        qemu_io(
            &uri(f.nbd),
            &["read -P 0 8388608 65536", "read -P 0x68 777 1"],
        )
        .await;
    }
}

/// Two connections each keep 64 unaligned writes in flight, interleaved 4 bytes apart in
/// the same few 4 KiB blocks: every write is a read-modify-write of a block another is
/// patching at the same time, and no byte may be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unaligned_writers_lose_nothing() {
    let f = start(1).await;
    let base = 1u64 << 20;
    let mut tasks = Vec::new();
    for who in 0..2u64 {
        let addr = f.nbd;
        tasks.push(tokio::spawn(async move {
            let mut s = client(addr, false).await;
            let (mut rd, mut wr) = s.split();
            let send = async {
                for i in 0..64u64 {
                    let off = base + i * 8 + who * 4;
                    let byte = (1 + who * 64 + i) as u8;
                    let mut v = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
                    v.extend_from_slice(&0u16.to_be_bytes());
                    v.extend_from_slice(&cmd::WRITE.to_be_bytes());
                    v.extend_from_slice(&i.to_be_bytes());
                    v.extend_from_slice(&off.to_be_bytes());
                    v.extend_from_slice(&4u32.to_be_bytes());
                    v.extend_from_slice(&[byte; 4]);
                    wr.write_all(&v).await.unwrap();
                }
            };
            let recv = async {
                let mut seen = [false; 64];
                for _ in 0..64 {
                    let mut h = [0u8; 16];
                    tokio::time::timeout(LIMIT, rd.read_exact(&mut h))
                        .await
                        .expect("replies in time")
                        .unwrap();
                    assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
                    let handle = u64::from_be_bytes(h[8..16].try_into().unwrap()) as usize;
                    assert!(!seen[handle], "one reply per request");
                    seen[handle] = true;
                }
            };
            tokio::join!(send, recv);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let back = f.session.read(1, base / 4096, 1, 4096).await.unwrap();
    for i in 0..64usize {
        for who in 0..2usize {
            let at = i * 8 + who * 4;
            let want = (1 + who * 64 + i) as u8;
            assert_eq!(
                &back[at..at + 4],
                &[want; 4],
                "bytes {at}..{} of writer {who}",
                at + 4
            );
        }
    }
}

// ------------------------------------------------------------ hostile clients, bounded

/// The request bytes of a READ.
fn read_request(handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut v = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&cmd::READ.to_be_bytes());
    v.extend_from_slice(&handle.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

/// Polls `f` every 10 ms until it holds, for at most `within`.
async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

/// A client sends 10,000 reads of 1 MiB and never reads a reply: the server holds at most
/// `IN_FLIGHT` replies of it (it stops taking its requests), and another client is served
/// meanwhile with the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_holds_at_most_in_flight_replies() {
    const MIB: u64 = 1 << 20;
    let bound = IN_FLIGHT as u64 * MIB;
    let f = start_with(
        0,
        Timeouts {
            write_stall: LIMIT,
            ..Timeouts::default()
        },
    )
    .await;
    let hog = client(f.nbd, false).await;
    let (hog_rd, mut hog_wr) = hog.into_split();
    let sender = tokio::spawn(async move {
        for i in 0..10_000u64 {
            let req = read_request(i, (i % 64) * MIB, MIB as u32);
            if hog_wr.write_all(&req).await.is_err() {
                return;
            }
        }
        // Kept open: the server must not take the end of the requests as a reason to go.
        std::future::pending::<()>().await;
    });
    // The slots fill with replies the hog does not read; the bytes held never pass them.
    let replies = f.server.reply_bytes();
    let filled = eventually(Duration::from_secs(60), || {
        let now = replies.now();
        assert!(
            now <= bound,
            "{now} bytes held for a client that does not read"
        );
        now == bound
    })
    .await;
    assert!(
        filled,
        "the hog's slots never filled: {} bytes held",
        replies.now()
    );
    // It stays there: for a second, never more than the slots hold.
    let watch_until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < watch_until {
        let now = replies.now();
        assert!(now <= bound, "{now} bytes held, bound {bound}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Another client writes and reads 1 MiB meanwhile and gets its bytes back.
    let mut good = client(f.nbd, false).await;
    let data = random_bytes(MIB as usize, 0xbad5eed);
    request(&mut good, cmd::WRITE, 1, 3 * MIB + 5, MIB as u32, &data).await;
    assert_eq!(simple_reply(&mut good).await, (0, 1));
    request(&mut good, cmd::READ, 2, 3 * MIB + 5, MIB as u32, &[]).await;
    assert_eq!(simple_reply(&mut good).await, (0, 2));
    assert!(
        read_n(&mut good, MIB as usize).await == data,
        "the bytes read back differ"
    );
    assert!(replies.peak() <= bound + MIB, "peak {}", replies.peak());

    // The hog goes: everything it held is let go.
    sender.abort();
    let _ = sender.await;
    drop(hog_rd);
    assert!(
        eventually(LIMIT, || replies.now() == 0).await,
        "{} bytes still held after the hog left",
        replies.now()
    );
}

/// A client that stops reading its replies is dropped once the server's writes make no
/// progress for the stall timeout, and what it held is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped() {
    let requested = 200u64 << 20;
    let f = start_with(
        0,
        Timeouts {
            write_stall: Duration::from_millis(500),
            ..Timeouts::default()
        },
    )
    .await;
    let mut s = client(f.nbd, false).await;
    let mut reqs = Vec::new();
    for i in 0..200u64 {
        reqs.extend(read_request(i, (i % 63) << 20, 1 << 20));
    }
    // Sent without reading; the server stops reading requests once its slots are taken,
    // so the sending is bounded in time as well.
    let _ = tokio::time::timeout(Duration::from_secs(5), s.write_all(&reqs)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Now read: what the kernel buffered, then the end (or a reset), well short of all.
    let mut got = 0u64;
    let mut b = vec![0u8; 1 << 16];
    let deadline = Instant::now() + LIMIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "the server kept the connection open"
        );
        match tokio::time::timeout(LIMIT, s.read(&mut b)).await {
            Err(_) => panic!("the server kept the connection open"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got += n as u64,
        }
    }
    assert!(
        got < requested,
        "all {got} bytes were sent: the client was not dropped"
    );
    let replies = f.server.reply_bytes();
    assert!(
        eventually(LIMIT, || replies.now() == 0).await,
        "{} bytes still held after the client was dropped",
        replies.now()
    );
}

/// Idle clients are closed after the idle timeout, busy ones are not; a handshake that
/// drags on is cut at the handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_and_slow_handshakes_are_closed() {
    let idle = Duration::from_millis(300);
    let handshake = Duration::from_millis(500);
    let f = start_with(
        0,
        Timeouts {
            handshake,
            idle: Some(idle),
            write_stall: LIMIT,
        },
    )
    .await;
    // Silent from the start of transmission.
    let mut quiet = client(f.nbd, false).await;
    let t = Instant::now();
    closed_by_server(&mut quiet).await;
    let waited = t.elapsed();
    assert!(
        waited >= idle && waited < 20 * idle,
        "closed after {waited:?}"
    );
    // Busy for three idle periods (a request every 100 ms, each answered), then silent.
    let mut busy = client(f.nbd, false).await;
    let t = Instant::now();
    for h in 0..9u64 {
        request(&mut busy, cmd::FLUSH, h, 0, 0, &[]).await;
        assert_eq!(simple_reply(&mut busy).await, (0, h));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let busy_for = t.elapsed();
    assert!(busy_for > 2 * idle);
    let t = Instant::now();
    closed_by_server(&mut busy).await;
    assert!(t.elapsed() < 20 * idle, "closed after {:?}", t.elapsed());
    // Client flags sent, then nothing: the handshake is cut.
    let mut slow = connect(f.nbd).await;
    let t = Instant::now();
    closed_by_server(&mut slow).await;
    let waited = t.elapsed();
    assert!(
        waited + Duration::from_millis(50) >= handshake && waited < 20 * handshake,
        "handshake cut after {waited:?}"
    );
}

/// A write longer than the advertised maximum gets EINVAL, one past the end ENOSPC, both
/// as soon as their header is in (the payload is not buffered: the reply comes before it
/// is sent); the payload is then skipped and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_are_answered_at_the_header_and_skipped() {
    let f = start(0).await;
    let size = f.server.export().size;
    let mut s = client(f.nbd, false).await;
    request(&mut s, cmd::WRITE, 1, 0, 4096, &[0x5a; 4096]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 1));
    let chunk = vec![0xeeu8; 1 << 20];
    for (handle, offset, len, err) in [
        (2u64, 0u64, MAX_REQUEST + 1, errno::EINVAL),
        (3, size - 10, 16 << 20, errno::ENOSPC),
    ] {
        request(&mut s, cmd::WRITE, handle, offset, len, &[]).await;
        assert_eq!(simple_reply(&mut s).await, (err, handle));
        let mut left = len as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n]).await.unwrap();
            left -= n;
        }
    }
    request(&mut s, cmd::READ, 4, 0, 4096, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 4));
    assert!(
        read_n(&mut s, 4096).await.iter().all(|&b| b == 0x5a),
        "a refused write landed"
    );
    request(&mut s, cmd::READ, 5, size - 10, 10, &[]).await;
    assert_eq!(simple_reply(&mut s).await, (0, 5));
    assert_eq!(read_n(&mut s, 10).await, [0; 10]);
}

/// Connects and asks for the export with NBD_OPT_GO: the connection in transmission, or,
/// when the server refuses the client, the refusal's message (the client then aborts, as
/// qemu and libnbd do, and the server closes).
async fn client_or_refusal(a: SocketAddr) -> Result<TcpStream, String> {
    let mut s = connect(a).await;
    send_option(&mut s, opt::GO, &[0, 0, 0, 0, 0, 0]).await;
    loop {
        let (option, kind, payload) = option_reply(&mut s).await;
        assert_eq!(option, opt::GO);
        match kind {
            rep::ACK => return Ok(s),
            rep::INFO => {}
            rep::ERR_POLICY => {
                send_option(&mut s, opt::ABORT, &[]).await;
                assert_eq!(option_reply(&mut s).await.1, rep::ACK);
                closed_by_server(&mut s).await;
                return Err(String::from_utf8_lossy(&payload).into_owned());
            }
            other => panic!("reply type {other:#x} to NBD_OPT_GO"),
        }
    }
}

/// With `max_clients` served, one more is refused in the handshake with a reason (and one
/// choosing its export with NBD_OPT_EXPORT_NAME, which has no error reply, is closed); the
/// served clients carry on, and once one of them goes a new client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_max_clients_is_refused_until_one_goes() {
    const MAX: usize = 3;
    let f = start_configured(0, "iscsi", |s| s.with_max_clients(MAX)).await;
    assert_eq!(f.server.max_clients(), MAX);
    let mut served = Vec::new();
    for _ in 0..MAX {
        served.push(client_or_refusal(f.nbd).await.expect("under the limit"));
    }
    let why = client_or_refusal(f.nbd)
        .await
        .expect_err("one over the limit is refused");
    if have(
        "nbdinfo",
        "a_client_over_max_clients_is_refused_until_one_goes (nbdinfo)",
    ) {
        let o = run("nbdinfo", &["--size", &uri(f.nbd)]).await;
        assert!(!o.status.success(), "{}", text(&o));
        // libnbd names the refusal, not the server's message.
        assert!(
            text(&o).contains("server policy prevents NBD_OPT_GO"),
            "{}",
            text(&o)
        );
    }
    assert!(
        why.contains("too many clients") && why.contains("at most 3"),
        "{why}"
    );
    let mut by_name = connect(f.nbd).await;
    send_option(&mut by_name, opt::EXPORT_NAME, b"").await;
    closed_by_server(&mut by_name).await;
    for (i, s) in served.iter_mut().enumerate() {
        let data = random_bytes(4096, i as u64);
        request(s, cmd::WRITE, 2 * i as u64, 4096 * i as u64, 4096, &data).await;
        assert_eq!(simple_reply(s).await, (0, 2 * i as u64));
        request(s, cmd::READ, 2 * i as u64 + 1, 4096 * i as u64, 4096, &[]).await;
        assert_eq!(simple_reply(s).await, (0, 2 * i as u64 + 1));
        assert_eq!(read_n(s, 4096).await, data);
    }
    let mut leaving = served.pop().expect("served");
    request(&mut leaving, cmd::DISC, 0, 0, 0, &[]).await;
    closed_by_server(&mut leaving).await;
    // The slot is given back when the server's task for that client ends, just after the
    // close: a client in between may still be refused.
    let t = Instant::now();
    let mut newcomer = loop {
        match client_or_refusal(f.nbd).await {
            Ok(s) => break s,
            Err(why) => {
                assert!(t.elapsed() < LIMIT, "still refused: {why}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    request(&mut newcomer, cmd::FLUSH, 7, 0, 0, &[]).await;
    assert_eq!(simple_reply(&mut newcomer).await, (0, 7));
    assert!(
        client_or_refusal(f.nbd).await.is_err(),
        "the limit holds again"
    );
}
