//! The initiator over iSER (`iser://`) against the ironsan target's iSER portal, both on the
//! software iWARP RNIC in this process: login in iSER mode, verified data both ways in the
//! shapes that take each path (immediate, unsolicited and solicited write data; reads placed
//! by RDMA Writes), many commands in flight, and the same port serving iSCSI/TCP.

use std::net::SocketAddr;
use std::time::Duration;

use iscsi_initiator::{IscsiUrl, Session, SessionConfig};

use test_support::random_bytes;

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
    let port = test_support::target::free_port();
    let config = format!("{settings}\n{}", CONFIG.replace("PORT", &port.to_string()));
    test_support::start_target(&config).await
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
    test_support::connect(&u).await.expect("iSER login")
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
        let s = test_support::connect(&t).await.unwrap();
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
            let s = transports::connect_session(&u, cfg).await.expect(what);
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

/// With MPA CRC, read data leaves the registered RAM LUN image in place, its CRC joined from
/// the image's 4 KiB block CRCs (not read again, not copied). Writes racing those reads over
/// the same blocks, over iSER and over iSCSI/TCP (whose connections write the image from
/// other threads), must never change bytes whose CRC is already taken: a read holds its
/// blocks until its data has left, every write locks them exclusively. A broken promise
/// shows as an MPA CRC error at the initiator, which ends the connection and fails commands.
/// Afterwards the image reads back as last written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mpa_crc_reads_leave_by_block_crcs_and_racing_writes_never_break_them() {
    use rand::{Rng, SeedableRng};
    const SPAN_BLOCKS: u64 = 4096; // 2 MiB of 512-byte blocks, shared by every task
    tokio::time::timeout(Duration::from_secs(90), async {
        let addr = start_with("iser_mpa_crc = true").await;
        let tcp = url(addr, "iscsi");
        let sessions = [
            std::sync::Arc::new(iser_session(addr).await),
            std::sync::Arc::new(iser_session(addr).await),
            std::sync::Arc::new(test_support::connect(&tcp).await.unwrap()),
        ];
        let by_crc = rnic::blocks_sent_by_crc();
        let mut tasks = Vec::new();
        for k in 0..12u64 {
            // Readers on the iSER sessions; writers on all three.
            let (s, reads) = match k % 3 {
                0 => (sessions[0].clone(), true),
                1 => (sessions[1].clone(), k % 2 == 0),
                _ => (sessions[2].clone(), false),
            };
            tasks.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(k);
                for i in 0..60u64 {
                    let blocks = rng.gen_range(1..=2048u64);
                    let lba = rng.gen_range(0..=SPAN_BLOCKS - blocks);
                    if reads {
                        s.read(0, lba, blocks as u32, 512)
                            .await
                            .expect("a racing read");
                    } else {
                        let data = random_bytes(blocks as usize * 512, k * 1000 + i);
                        s.write(0, lba, 512, data).await.expect("a racing write");
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(
            rnic::blocks_sent_by_crc() > by_crc + 1000,
            "read data left by block CRCs"
        );
        let data = random_bytes(SPAN_BLOCKS as usize * 512, 77);
        sessions[2].write(0, 0, 512, data.clone()).await.unwrap();
        for s in &sessions[..2] {
            let back = s.read(0, 0, SPAN_BLOCKS as u32, 512).await.unwrap();
            assert!(back == data, "the image reads back as last written");
        }
        for s in sessions {
            let s = std::sync::Arc::try_unwrap(s).ok().unwrap();
            s.logout().await.unwrap();
        }
    })
    .await
    .expect("in time");
}

/// A read sent in place from the RAM LUN image holds its blocks until its data has left, and
/// writes wait for that: the hold must end when the RDMA Write completes, not when the
/// connection next has work. Here the iSER session reads and then goes quiet while a TCP
/// session writes the same blocks; the writes must not wait for the quiet connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_iser_connection_does_not_keep_its_reads_blocks_from_writers() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let addr = start().await;
        let iser = iser_session(addr).await;
        let tcp = url(addr, "iscsi");
        let tcp = test_support::connect(&tcp).await.unwrap();
        let iser = std::sync::Arc::new(iser);
        for round in 0..5u64 {
            // Enough reads at once that the last data leaves after the target's completion
            // task has gone quiet.
            let reads: Vec<_> = (0..16u64)
                .map(|k| {
                    let s = iser.clone();
                    tokio::spawn(async move { s.read(0, k * 2048, 2048, 512).await.unwrap() })
                })
                .collect();
            for r in reads {
                r.await.unwrap();
            }
            let started = std::time::Instant::now();
            for k in 0..16u64 {
                let data = random_bytes(1 << 20, round * 100 + k);
                tokio::time::timeout(Duration::from_secs(2), tcp.write(0, k * 2048, 512, data))
                    .await
                    .expect("the write did not wait for the quiet iSER connection")
                    .unwrap();
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "16 MiB of writes took {:?}",
                started.elapsed()
            );
        }
        let iser = std::sync::Arc::try_unwrap(iser).ok().unwrap();
        iser.logout().await.unwrap();
        tcp.logout().await.unwrap();
    })
    .await
    .expect("in time");
}
