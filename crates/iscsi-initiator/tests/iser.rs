//! The initiator over iSER (`iser://`) against the ironsan target's iSER portal, both on the
//! software iWARP RNIC in this process: login in iSER mode, verified data both ways in the
//! shapes that take each path (immediate, unsolicited and solicited write data; reads placed
//! by RDMA Writes), many commands in flight, and the same port serving iSCSI/TCP.

use std::net::SocketAddr;
use std::time::Duration;

use iscsi_initiator::{IscsiUrl, Session, SessionConfig};

mod common;
use common::random_bytes;

/// iSCSI/TCP and iSER on one port (told apart by the first bytes).
const CONFIG: &str = r#"
portals = ["tcp://127.0.0.1:PORT", "iser://127.0.0.1:PORT"]
queue_depth = 32

[[target]]
name = "iqn.2026-11.org.ironsan:iser"
[target.lun.0]
size = "64MiB"
backend = "memory"
"#;

fn url(addr: SocketAddr, scheme: &str) -> IscsiUrl {
    IscsiUrl::parse_lun(&format!("{scheme}://{addr}/iqn.2026-11.org.ironsan:iser/0")).expect("url")
}

/// The in-process target, serving iSCSI/TCP and iSER on a free port.
async fn start() -> SocketAddr {
    start_with("").await
}

/// [`start`] with `settings` (top-level config lines) added.
async fn start_with(settings: &str) -> SocketAddr {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!("{settings}\n{}", CONFIG.replace("PORT", &port.to_string()));
    common::start_target(&config).await
}

/// Whether a thread of this process is named `name` within 2 s (a new thread names itself
/// once it runs).
async fn thread_named(name: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let found = std::fs::read_dir("/proc/self/task").unwrap().any(|t| {
            std::fs::read_to_string(t.unwrap().path().join("comm")).is_ok_and(|c| c.trim() == name)
        });
        if found || std::time::Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The target's two ways of running iSER on the software RNIC serve the same data: its
/// connections on the RNIC's reactor thread (the default), or on the target's runtime with
/// the engine on a thread of its own (`iser_reactor = false`).
/// (The thread check tells the two apart only for the engine thread: the other tests of this
/// binary, running alongside, start reactors of their own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iser_connections_on_the_reactor_or_the_targets_runtime_carry_verified_data() {
    tokio::time::timeout(Duration::from_secs(60), async {
        for (settings, thread) in [
            ("", "iser-reactor"),
            ("iser_reactor = false", "rnic-progress"),
        ] {
            let addr = start_with(settings).await;
            assert!(
                thread_named(thread).await,
                "{settings:?}: a thread named {thread}"
            );
            let s = std::sync::Arc::new(iser_session(addr).await);
            let mut tasks = Vec::new();
            for k in 0..8u64 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    write_read_verify(&s, k * 1024, (4 << 10) << (k % 6), 300 + k).await;
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let s = std::sync::Arc::try_unwrap(s).ok().unwrap();
            s.logout().await.unwrap();
        }
    })
    .await
    .expect("in time");
}

/// A session over iSER to the target at `addr`, with the URL's default settings.
async fn iser_session(addr: SocketAddr) -> Session {
    let u = url(addr, "iser");
    Session::connect(&u, SessionConfig::from_url(&u))
        .await
        .expect("iSER login")
}

async fn write_read_verify(s: &Session, lba: u64, len: usize, seed: u64) {
    let data = random_bytes(len, seed);
    s.write(0, lba, 512, data.clone()).await.expect("write");
    let back = s.read(0, lba, (len / 512) as u32, 512).await.expect("read");
    assert!(back == data, "{len} bytes at LBA {lba}: read back differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iser_login_and_verified_data_both_ways() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let addr = start().await;
        let s = std::sync::Arc::new(iser_session(addr).await);
        let cap = s.read_capacity16(0).await.unwrap();
        assert_eq!((cap.bytes(), cap.block_size), (64 << 20, 512));
        assert_eq!(s.inquiry(0).await.unwrap().device_type, 0);
        // One block (immediate data), 200 KiB (immediate + unsolicited + RDMA Reads), 3 MiB
        // (several bursts of RDMA Reads), and a 16 MiB read.
        let from_image = datamover_iser::datamover::writes_from_lun_images();
        write_read_verify(&s, 0, 512, 1).await;
        write_read_verify(&s, 100, 200 * 1024, 2).await;
        write_read_verify(&s, 5000, 3 << 20, 3).await;
        write_read_verify(&s, 20000, 16 << 20, 4).await;
        // The RAM LUN's image is registered with the RNIC: read data left straight from it.
        assert!(
            datamover_iser::datamover::writes_from_lun_images() >= from_image + 4,
            "reads were sent from the registered LUN image"
        );
        // Many in flight at once, each verified.
        let mut tasks = Vec::new();
        for k in 0..24u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                write_read_verify(&s, 60000 + k * 256, 128 * 1024, 100 + k).await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        s.synchronize_cache(0).await.unwrap();
        s.ping().await.unwrap();
        let s = std::sync::Arc::try_unwrap(s).ok().unwrap();
        s.logout().await.unwrap();
        // The same port serves iSCSI/TCP: the data written over iSER reads back over TCP.
        let t = url(addr, "iscsi");
        let s = Session::connect(&t, SessionConfig::from_url(&t))
            .await
            .unwrap();
        let back = s.read(0, 5000, 6144, 512).await.unwrap();
        assert!(
            back == random_bytes(3 << 20, 3),
            "iSER's write read back over TCP"
        );
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

/// The login shapes a user can ask for: no unsolicited data at all (InitialR2T=Yes, no
/// immediate data: every byte by RDMA Read), a 64 KiB first burst sent as negotiated
/// (immediate data, then unsolicited Data-Out in Sends), and remote invalidation
/// refused in the CM word (the target answers with plain Sends, the initiator invalidates its
/// own STags): each writes and reads verified data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iser_login_variants_carry_verified_data() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let addr = start().await;
        let u = url(addr, "iser");
        type Variant = (&'static str, fn(&mut SessionConfig));
        let variants: [Variant; 3] = [
            ("InitialR2T=Yes, no immediate data", |c| {
                c.initial_r2t = true;
                c.immediate_data = false;
            }),
            (
                "FirstBurstLength 64 KiB, unsolicited Data-Out in Sends",
                |c| {
                    c.initial_r2t = false;
                    c.first_burst_length = 65536;
                    c.iser_unsolicited_only_whole = false;
                },
            ),
            ("no remote invalidation", |c| {
                c.iser_remote_invalidation = false
            }),
        ];
        for (k, (what, set)) in variants.into_iter().enumerate() {
            let mut cfg = SessionConfig::from_url(&u);
            set(&mut cfg);
            let s = Session::connect(&u, cfg).await.expect(what);
            let seed = 10 * k as u64;
            write_read_verify(&s, 0, 512, seed).await;
            write_read_verify(&s, 100, 200 * 1024, seed + 1).await;
            write_read_verify(&s, 5000, 3 << 20, seed + 2).await;
            s.logout().await.unwrap();
        }
    })
    .await
    .expect("in time");
}

/// Zero-copy writes: the target's RDMA Reads take the caller's bytes where they lie, and
/// bytes written again (one buffer to many blocks, with many commands in flight, each under
/// an STag of its own) take the registrations made earlier. Slices of one buffer are other
/// bytes: each is registered and written right. Every write reads back verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recurring_write_buffers_hit_the_registration_cache() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let addr = start().await;
        let s = std::sync::Arc::new(iser_session(addr).await);
        let one = random_bytes(1 << 20, 7);
        for round in 0..3u64 {
            let mut tasks = Vec::new();
            for k in 0..8u64 {
                let (s, data) = (s.clone(), one.clone());
                tasks.push(tokio::spawn(async move {
                    s.write(0, (round * 8 + k) * 2048, 512, data)
                        .await
                        .expect("write")
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
        let regs = s.write_registrations();
        assert!(
            regs.misses <= 8 && regs.hits + regs.misses == 24 && regs.hits >= 16,
            "8 in flight at most need 8 registrations; the rest are hits: {regs:?}"
        );
        for lba in (0..24u64).map(|i| i * 2048) {
            let back = s.read(0, lba, 2048, 512).await.unwrap();
            assert!(back == one, "the buffer written at LBA {lba} reads back");
        }
        let big = random_bytes(4 << 20, 8);
        for (i, part) in big.chunks(1 << 20).enumerate() {
            let slice = big.slice_ref(part);
            s.write(0, 100_000 + i as u64 * 2048, 512, slice)
                .await
                .unwrap();
        }
        let back = s.read(0, 100_000, 8192, 512).await.unwrap();
        assert!(
            back == big,
            "slices of one buffer, each its own registration"
        );
        assert_eq!(s.write_registrations().misses, regs.misses + 4);
        let s = std::sync::Arc::try_unwrap(s).ok().unwrap();
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}
