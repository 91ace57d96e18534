//! LUNs added to and removed from a running target, seen by the project's initiator over
//! loopback: a session hears REPORTED LUNS DATA HAS CHANGED once, then finds the new LUN in
//! REPORT LUNS and writes and reads it; a removed LUN answers LOGICAL UNIT NOT SUPPORTED;
//! another session's I/O to another LUN carries on throughout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iscsi_initiator::scsi::Sense;
use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use iscsi_target::LunAdminError;

const NAME: &str = "iqn.2026-11.org.ironsan:live";
const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
[[target]]
name = "iqn.2026-11.org.ironsan:live"
[target.lun.0]
size = "4MiB"
backend = "memory"
[target.lun.2]
size = "4MiB"
backend = "memory"
"#;

const T: Duration = Duration::from_secs(30);
const BS: u32 = 512;
const TUR: [u8; 6] = [0; 6];

async fn login(addr: std::net::SocketAddr) -> Session {
    let url = IscsiUrl::parse_lun(&format!("iscsi://{addr}/{NAME}/0")).unwrap();
    transports::connect_session(&url, SessionConfig::from_url(&url))
        .await
        .expect("login")
}

/// (key, ASC, ASCQ) of a command sent as is (no retry on a unit attention).
async fn sense_of(s: &Session, lun: u16, cdb: &[u8], read_len: u32) -> Option<(u8, u8, u8)> {
    let r = s
        .raw(lun, cdb, read_len, Bytes::new())
        .await
        .expect("answered");
    if r.status == 0 {
        return None;
    }
    assert_eq!(r.status, 2, "CHECK CONDITION");
    let sense = Sense::parse(&r.sense).expect("sense data");
    Some((sense.key, sense.asc, sense.ascq))
}

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Writes and reads back LUN 0 of `s` until `stop` (at most 20 s), each block with its own
/// pattern; how many round trips passed. Any failure or mismatch fails the test.
async fn io_until(s: Arc<Session>, stop: Arc<AtomicBool>, rounds: Arc<AtomicU64>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for i in 0u64.. {
        if stop.load(Ordering::Acquire) || tokio::time::Instant::now() > deadline {
            break;
        }
        let lba = i % 64;
        let data = Bytes::from(vec![(i % 251) as u8; 8 * BS as usize]);
        s.write(0, lba * 8, BS, data.clone())
            .await
            .expect("write to LUN 0 during the change");
        let back = s.read(0, lba * 8, 8, BS).await.expect("read of LUN 0");
        assert_eq!(back, data, "round {i}");
        rounds.fetch_add(1, Ordering::AcqRel);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn luns_added_and_removed_while_sessions_run() {
    tokio::time::timeout(T, async {
        let config = iscsi_target::Config::parse(CONFIG, "test.toml").expect("config");
        let bound = transports::bind_target(config).await.expect("bind");
        let addr = bound.local_addrs()[0];
        let target = bound.target();
        tokio::spawn(bound.serve());

        let a = login(addr).await;
        let b = Arc::new(login(addr).await);
        assert_eq!(a.report_luns().await.unwrap(), vec![0, 2]);
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let io = tokio::spawn(io_until(b.clone(), stop.clone(), rounds.clone()));
        let rounds_at = |r: &AtomicU64| r.load(Ordering::Acquire);
        while rounds_at(&rounds) < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let lun1 = scsi::LunConfig::memory(4 << 20);
        target
            .add_lun(NAME, 1, lun1.clone())
            .await
            .expect("LUN 1 added");
        assert_eq!(
            target.add_lun(NAME, 1, lun1.clone()).await,
            Err(LunAdminError::Lun(scsi::LunChangeError::InUse(1)))
        );
        assert_eq!(
            target
                .add_lun("iqn.2026-11.org.ironsan:none", 1, lun1)
                .await,
            Err(LunAdminError::NoSuchTarget(
                "iqn.2026-11.org.ironsan:none".into()
            ))
        );
        assert_eq!(target.luns(NAME), Some(vec![0, 1, 2]));

        // Session A: the news once, then the new LUN listed and usable.
        assert_eq!(sense_of(&a, 2, &TUR, 0).await, Some((6, 0x3F, 0x0E)));
        assert_eq!(sense_of(&a, 2, &TUR, 0).await, None, "once");
        assert_eq!(a.report_luns().await.unwrap(), vec![0, 1, 2]);
        let data = Bytes::from((0..16 * BS).map(|i| (i % 253) as u8).collect::<Vec<u8>>());
        a.write(1, 100, BS, data.clone())
            .await
            .expect("write LUN 1");
        assert_eq!(a.read(1, 100, 16, BS).await.expect("read LUN 1"), data);

        let before = rounds_at(&rounds);
        target.remove_lun(NAME, 1).await.expect("LUN 1 removed");
        assert_eq!(
            target.remove_lun(NAME, 1).await,
            Err(LunAdminError::Lun(scsi::LunChangeError::NotFound(1)))
        );
        // A removed LUN is not supported (and that is no unit attention spent).
        assert_eq!(
            sense_of(&a, 1, &read10(100, 1), BS).await,
            Some((5, 0x25, 0x00))
        );
        assert_eq!(sense_of(&a, 0, &TUR, 0).await, Some((6, 0x3F, 0x0E)));
        assert_eq!(a.report_luns().await.unwrap(), vec![0, 2]);

        // Session B went on writing and reading LUN 0 through both changes.
        let wanted = before + 3;
        for _ in 0..2000 {
            if rounds_at(&rounds) >= wanted {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(rounds_at(&rounds) >= wanted, "B's I/O carries on");
        stop.store(true, Ordering::Release);
        io.await.expect("B's I/O had no error");
        assert_eq!(b.report_luns().await.unwrap(), vec![0, 2]);
        a.logout().await.expect("logout A");
        let b = Arc::try_unwrap(b).ok().expect("B's I/O task has ended");
        b.logout().await.expect("logout B");
    })
    .await
    .expect("in time");
}
