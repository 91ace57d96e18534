//! The initiator against the ironsan target started in-process on an ephemeral loopback
//! port: login (plain, CHAP, mutual CHAP, digests), verified data both ways, four
//! connections per session, a 16 MiB READ counted on the wire as one SCSI command,
//! discovery, task management, reconnection, and the errors users see.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iscsi_initiator::{Error, IscsiUrl, Session, SessionConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use test_support::random_bytes;

const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
queue_depth = 64

[[target]]
name = "iqn.2026-11.org.ironsan:plain"
[target.lun.0]
size = "64MiB"
backend = "memory"
[target.lun.1]
size = "8MiB"
backend = "memory"
block_size = 4096

[[target]]
name = "iqn.2026-11.org.ironsan:chap"
chap = { user = "alice", secret = "alicesecret12" }
[target.lun.0]
size = "16MiB"
backend = "memory"

[[target]]
name = "iqn.2026-11.org.ironsan:mutual"
chap = { user = "bob", secret = "bobsecret1234" }
mutual_chap = { user = "tgt", secret = "targetsecret1" }
[target.lun.0]
size = "16MiB"
backend = "memory"

[[target]]
name = "iqn.2026-11.org.ironsan:digests"
header_digest = "required"
data_digest = "required"
[target.lun.0]
size = "32MiB"
backend = "memory"
"#;

async fn start_target() -> SocketAddr {
    test_support::start_target(CONFIG).await
}

fn url(addr: SocketAddr, creds: &str, target: &str, lun: u16) -> IscsiUrl {
    IscsiUrl::parse_lun(&format!(
        "iscsi://{creds}{addr}/iqn.2026-11.org.ironsan:{target}/{lun}"
    ))
    .expect("url")
}

async fn write_read_verify(s: &Session, lba: u64, len: usize, seed: u64) {
    let lun = s.default_lun();
    let cap = s.capacity(lun).await.expect("capacity");
    let data = random_bytes(len, seed);
    s.write(lun, lba, cap.block_size, data.clone())
        .await
        .expect("write");
    let back = s
        .read(
            lun,
            lba,
            (len / cap.block_size as usize) as u32,
            cap.block_size,
        )
        .await
        .expect("read");
    assert!(back == data, "data read back differs from data written");
}

fn timeout<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(60), f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_login_capacity_inquiry_and_data_both_ways() {
    timeout(async {
        let addr = start_target().await;
        let u = url(addr, "", "plain", 0);
        let s = test_support::connect(&u).await.unwrap();
        let inq = s.inquiry(0).await.unwrap();
        assert_eq!(inq.device_type, 0);
        assert!(!inq.vendor.is_empty());
        let cap = s.read_capacity16(0).await.unwrap();
        assert_eq!((cap.bytes(), cap.block_size), (64 << 20, 512));
        let cap10 = s.read_capacity10(0).await.unwrap();
        assert_eq!(cap10.blocks, cap.blocks);
        assert_eq!(s.report_luns().await.unwrap(), vec![0, 1]);
        let cap1 = s.capacity(1).await.unwrap();
        assert_eq!((cap1.bytes(), cap1.block_size), (8 << 20, 4096));
        let pages = iscsi_initiator::scsi::parse_vpd_page_list(&s.inquiry_vpd(0, 0).await.unwrap());
        assert!(pages.contains(&0x80), "{pages:?}");
        // Writes of several shapes: one block, immediate+unsolicited, R2T bursts.
        write_read_verify(&s, 0, 512, 1).await;
        write_read_verify(&s, 100, 200 * 1024, 2).await;
        write_read_verify(&s, 5000, 3 << 20, 3).await;
        s.synchronize_cache(0).await.unwrap();
        s.unmap(0, &[(100, 8)]).await.unwrap();
        let z = s.read(0, 100, 8, 512).await.unwrap();
        assert!(
            z.iter().all(|&b| b == 0),
            "unmapped blocks read back as zeros"
        );
        // Out of range: a CHECK CONDITION with decoded sense.
        let e = s.read(0, cap.blocks, 1, 512).await.unwrap_err().to_string();
        assert!(
            e.contains("ILLEGAL REQUEST") && e.contains("out of range"),
            "{e}"
        );
        assert_eq!(s.lun_reset(0).await.unwrap(), 0);
        s.ping().await.unwrap();
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_mutual_chap_and_their_failures() {
    timeout(async {
        let addr = start_target().await;
        let u = url(addr, "alice%alicesecret12@", "chap", 0);
        let s = test_support::connect(&u).await.unwrap();
        write_read_verify(&s, 8, 64 * 1024, 4).await;
        s.logout().await.unwrap();

        let u = url(addr, "alice%wrongsecret99@", "chap", 0);
        let e = test_support::connect(&u).await.err().unwrap();
        let m = e.to_string();
        assert!(m.contains("authentication failure") && m.contains("0x0201"), "{m}");

        let u = IscsiUrl::parse_lun(&format!(
            "iscsi://bob%bobsecret1234@{addr}/iqn.2026-11.org.ironsan:mutual/0?target_user=tgt&target_password=targetsecret1"
        ))
        .unwrap();
        let s = test_support::connect(&u).await.unwrap();
        write_read_verify(&s, 0, 128 * 1024, 5).await;
        s.logout().await.unwrap();

        let u = IscsiUrl::parse_lun(&format!(
            "iscsi://bob%bobsecret1234@{addr}/iqn.2026-11.org.ironsan:mutual/0?target_user=tgt&target_password=notthesecret1"
        ))
        .unwrap();
        let e = test_support::connect(&u).await.err().unwrap();
        assert!(e.to_string().contains("mutual CHAP"), "{e}");

        // A target that demands CHAP, without credentials.
        let u = url(addr, "", "chap", 0);
        let e = test_support::connect(&u).await.err().unwrap();
        assert!(matches!(e, Error::Login(_)), "{e}");
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_data_digests() {
    timeout(async {
        let addr = start_target().await;
        let u = IscsiUrl::parse_lun(&format!(
            "iscsi://{addr}/iqn.2026-11.org.ironsan:digests/0?header_digest=crc32c&data_digest=crc32c"
        ))
        .unwrap();
        let s = test_support::connect(&u).await.unwrap();
        write_read_verify(&s, 0, 512, 6).await;
        write_read_verify(&s, 77, 5 << 20, 7).await;
        s.logout().await.unwrap();
        // Offering "None,CRC32C" to a target that requires CRC32C ends with CRC32C; four
        // connections each negotiate their own digests.
        let u = IscsiUrl::parse_lun(&format!(
            "iscsi://{addr}/iqn.2026-11.org.ironsan:digests/0?header_digest=none-crc32c&data_digest=none-crc32c"
        ))
        .unwrap();
        let cfg = SessionConfig {
            connections: 4,
            ..SessionConfig::from_url(&u)
        };
        let s = transports::connect_session(&u, cfg).await.unwrap();
        assert_eq!(s.connection_count(), 4);
        write_read_verify(&s, 4096, 1 << 20, 8).await;
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_connections_per_session_with_concurrent_verified_io() {
    timeout(async {
        let addr = start_target().await;
        let u = url(addr, "", "plain", 0);
        let cfg = SessionConfig {
            connections: std::env::var("CONNS").map_or(4, |v| v.parse().unwrap()),
            ..SessionConfig::from_url(&u)
        };
        let s = Arc::new(transports::connect_session(&u, cfg).await.unwrap());
        assert_eq!(
            s.connection_count(),
            std::env::var("CONNS").map_or(4, |v| v.parse().unwrap())
        );
        s.test_unit_ready(0).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..32u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let data = random_bytes(64 * 1024, 100 + i);
                if let Err(e) = s.write(0, i * 128, 512, data.clone()).await {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    panic!("{e}");
                }
                let back = s.read(0, i * 128, 128, 512).await.unwrap();
                assert!(back == data, "command {i}: data differs");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let s = Arc::try_unwrap(s).ok().unwrap();
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

/// Relays one TCP connection and counts, in the initiator-to-target byte stream, the SCSI
/// Command PDUs with a READ CDB and their expected lengths.
async fn counting_proxy(target: SocketAddr) -> (SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let reads = Arc::new(AtomicU64::new(0));
    let read_bytes = Arc::new(AtomicU64::new(0));
    let (r2, b2) = (reads.clone(), read_bytes.clone());
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let server = TcpStream::connect(target).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        });
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 65536];
        loop {
            let n = match cr.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if sw.write_all(&chunk[..n]).await.is_err() {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            // No digests on this session: BHS + AHS + padded data.
            while buf.len() >= 48 {
                let ahs = buf[4] as usize * 4;
                let dlen = u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize;
                let total = 48 + ahs + ((dlen + 3) & !3);
                if buf.len() < total {
                    break;
                }
                if buf[0] & 0x3f == 0x01 && matches!(buf[32], 0x28 | 0x88) {
                    r2.fetch_add(1, Ordering::SeqCst);
                    let edtl = u32::from_be_bytes([buf[20], buf[21], buf[22], buf[23]]);
                    b2.fetch_add(edtl as u64, Ordering::SeqCst);
                }
                buf.drain(..total);
            }
        }
    });
    (addr, reads, read_bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_16_mib_read_is_one_scsi_command_on_the_wire() {
    timeout(async {
        let addr = start_target().await;
        let (proxy, reads, read_bytes) = counting_proxy(addr).await;
        let u = url(proxy, "", "plain", 0);
        let s = test_support::connect(&u).await.unwrap();
        s.test_unit_ready(0).await.unwrap();
        let data = random_bytes(16 << 20, 9);
        s.write(0, 0, 512, data.clone()).await.unwrap();
        let before = reads.load(Ordering::SeqCst);
        let back = s.read(0, 0, 32768, 512).await.unwrap();
        assert!(back == data, "16 MiB read back differs");
        s.logout().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            reads.load(Ordering::SeqCst) - before,
            1,
            "READ commands on the wire"
        );
        assert_eq!(read_bytes.load(Ordering::SeqCst), 16 << 20);
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_every_target() {
    timeout(async {
        let addr = start_target().await;
        let u = IscsiUrl::from_portal_or_url(&addr.to_string()).unwrap();
        let mut names: Vec<String> = transports::discover(&u, &SessionConfig::default())
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["chap", "digests", "mutual", "plain"].map(|n| format!("iqn.2026-11.org.ironsan:{n}"))
        );
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_reinstates_the_session_and_io_goes_on() {
    timeout(async {
        let addr = start_target().await;
        let u = url(addr, "", "plain", 0);
        let cfg = SessionConfig {
            reconnect: true,
            connections: 2,
            ..SessionConfig::from_url(&u)
        };
        let s = transports::connect_session(&u, cfg).await.unwrap();
        write_read_verify(&s, 0, 64 * 1024, 11).await;
        let tsih = s.tsih();
        s.break_connections();
        // Commands submitted during the outage wait for the reinstated session.
        write_read_verify(&s, 256, 64 * 1024, 12).await;
        assert_ne!(s.tsih(), tsih, "a new session after reinstatement");
        assert_eq!(s.connection_count(), 2);
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connection_fails_commands_with_a_clear_error() {
    timeout(async {
        let addr = start_target().await;
        let u = url(addr, "", "plain", 0);
        let s = test_support::connect(&u).await.unwrap();
        s.test_unit_ready(0).await.unwrap();
        s.break_connections();
        let e = s.read(0, 0, 1, 512).await.unwrap_err().to_string();
        assert!(e.contains("connection"), "{e}");
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_users_see() {
    timeout(async {
        // Nothing listens on a port just freed.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let u = url(dead, "", "plain", 0);
        let e = transports::connect_session(&u, SessionConfig::default())
            .await
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with(&format!("cannot connect to {dead}")),
            "{e}"
        );

        let addr = start_target().await;
        let u = url(addr, "", "nosuchtarget", 0);
        let e = transports::connect_session(&u, SessionConfig::default())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not found") && e.contains("0x0203"), "{e}");

        // iser:// to a portal that serves only iSCSI/TCP: a clear one-line failure.
        let iser = url(addr, "", "plain", 0)
            .to_string()
            .replace("iscsi://", "iser://");
        let u = IscsiUrl::parse_lun(&iser).unwrap();
        let e = transports::connect_session(&u, SessionConfig::default())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with(&format!("cannot connect to {addr}")), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");

        for bad in ["iscsi://host", "http://x/y/0", "iscsi://h/iqn.x:y/zz"] {
            let e = IscsiUrl::parse_lun(bad).unwrap_err().to_string();
            assert!(e.starts_with("bad iSCSI URL"), "{e}");
        }
    })
    .await
    .expect("in time");
}

/// A relay to `target` whose first connection is cut (both ways) once `cut_after` bytes
/// have gone from the target to the initiator; later connections are relayed whole.
async fn cutting_proxy(target: SocketAddr, cut_after: u64) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        for n in 0..64 {
            let Ok((client, _)) = l.accept().await else {
                return;
            };
            let server = TcpStream::connect(target).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let up = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            tokio::spawn(async move {
                let mut sent = 0u64;
                let mut chunk = vec![0u8; 65536];
                loop {
                    let k = match sr.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => k,
                    };
                    if n == 0 && sent + k as u64 >= cut_after {
                        // Mid-transfer: drop both directions.
                        up.abort();
                        return;
                    }
                    if cw.write_all(&chunk[..k]).await.is_err() {
                        break;
                    }
                    sent += k as u64;
                }
                up.abort();
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_in_flight_when_the_connection_drops_are_retried_or_failed() {
    timeout(async {
        let target = start_target().await;
        // Known data first, straight to the target.
        let u = url(target, "", "plain", 0);
        let s = test_support::connect(&u).await.unwrap();
        s.test_unit_ready(0).await.unwrap();
        let data = random_bytes(8 << 20, 77);
        s.write(0, 0, 512, data.clone()).await.unwrap();
        s.logout().await.unwrap();

        for reconnect in [true, false] {
            // The cut comes 2.5 MiB into eight 1 MiB READs all in flight.
            let proxy = cutting_proxy(target, 5 << 19).await;
            let u = url(proxy, "", "plain", 0);
            let cfg = SessionConfig {
                reconnect,
                ..SessionConfig::from_url(&u)
            };
            let s = transports::connect_session(&u, cfg).await.unwrap();
            s.test_unit_ready(0).await.unwrap();
            let pending: Vec<_> = (0..8u64)
                .map(|i| {
                    s.submit(iscsi_initiator::CommandRequest::read(
                        0,
                        iscsi_initiator::scsi::read_write(false, i * 2048, 2048, false),
                        1 << 20,
                    ))
                })
                .collect();
            let mut ok = 0;
            for (i, p) in pending.into_iter().enumerate() {
                match p.wait().await {
                    Ok(r) => {
                        assert_eq!(r.status, 0, "command {i}");
                        assert!(
                            r.data[..] == data[i << 20..(i + 1) << 20],
                            "command {i}: data of a retried READ differs"
                        );
                        ok += 1;
                    }
                    Err(e) => {
                        assert!(!reconnect, "with reconnect command {i} failed: {e}");
                        let e = e.to_string();
                        assert!(e.contains("connection"), "a clear error: {e}");
                    }
                }
            }
            if reconnect {
                assert_eq!(ok, 8, "every READ retried after the reinstatement");
            } else {
                assert!(ok < 8, "the cut came before all data was delivered");
            }
        }
    })
    .await
    .expect("in time: no command silently dropped");
}
