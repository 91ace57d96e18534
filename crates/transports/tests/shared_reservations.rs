//! Two targets (two gateways) on two loopback ports exporting one file LUN whose persistent
//! reservations live in one shared file (`reservations = PATH`), driven by the project's
//! initiator over iSCSI: what an initiator registers and reserves through one gateway is
//! reported and enforced through the other, a preemption through one reaches the
//! preempted initiator's session on the other as a unit attention, and a restarted
//! gateway enforces the reservation from its start.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use iscsi_initiator::scsi::Sense;
use iscsi_initiator::{IscsiUrl, Session, SessionConfig};

const NAME: &str = "iqn.2026-11.org.ironsan:shared";
const X: &str = "iqn.2026-11.org.ironsan:node-x";
const Y: &str = "iqn.2026-11.org.ironsan:node-y";
const T: Duration = Duration::from_secs(60);
const BS: usize = 512;
/// WRITE EXCLUSIVE, REGISTRANTS ONLY: the type failover clusters reserve with.
const WE_RO: u8 = 5;
const RESERVATION_CONFLICT: u8 = 0x18;

struct Gateway {
    addr: SocketAddr,
    target: std::sync::Arc<iscsi_target::Target>,
    serving: tokio::task::JoinHandle<()>,
}

impl Gateway {
    async fn start(dir: &Path) -> Gateway {
        let config = format!(
            r#"
portals = ["127.0.0.1:0"]
[[target]]
name = "{NAME}"
[target.lun.0]
size = "4MiB"
backend = {{ type = "file", path = "{lun}", create = true }}
reservations = "{pr}"
"#,
            lun = dir.join("lun0.img").display(),
            pr = dir.join("lun0.pr").display(),
        );
        let config = iscsi_target::Config::parse(&config, "test.toml").expect("config");
        let bound = transports::bind_target(config).await.expect("bind");
        let addr = bound.local_addrs()[0];
        let target = bound.target();
        let serving = tokio::spawn(bound.serve());
        Gateway {
            addr,
            target,
            serving,
        }
    }

    async fn stop(self) {
        self.target.shutdown(Duration::from_millis(100)).await;
        self.serving.abort();
    }

    async fn login(&self, initiator: &str) -> Session {
        let url = IscsiUrl::parse_lun(&format!("iscsi://{}/{NAME}/0", self.addr)).unwrap();
        let mut cfg = SessionConfig::from_url(&url);
        cfg.initiator_name = initiator.to_string();
        transports::connect_session(&url, cfg).await.expect("login")
    }
}

/// PERSISTENT RESERVE OUT; the status.
async fn pr_out(s: &Session, sa: u8, rtype: u8, key: u64, sa_key: u64) -> u8 {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let cdb = [0x5F, sa, rtype, 0, 0, 0, 0, 0, 24, 0];
    s.raw(0, &cdb, 0, Bytes::from(p))
        .await
        .expect("PR OUT")
        .status
}

/// PERSISTENT RESERVE IN: the data.
async fn pr_in(s: &Session, sa: u8) -> Bytes {
    let cdb = [0x5E, sa, 0, 0, 0, 0, 0, 0x04, 0, 0];
    let r = s.raw(0, &cdb, 1024, Bytes::new()).await.expect("PR IN");
    assert_eq!(r.status, 0, "PR IN: {r:?}");
    r.data
}

async fn keys(s: &Session) -> Vec<u64> {
    let d = pr_in(s, 0).await;
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    d[8..8 + len]
        .chunks(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect()
}

/// READ RESERVATION: (key, type).
async fn reservation(s: &Session) -> Option<(u64, u8)> {
    let d = pr_in(s, 1).await;
    (d.len() >= 24).then(|| (u64::from_be_bytes(d[8..16].try_into().unwrap()), d[21]))
}

/// WRITE(10) of one block at LBA 0; the status.
async fn write(s: &Session, fill: u8) -> u8 {
    let cdb = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let r = s.raw(0, &cdb, 0, Bytes::from(vec![fill; BS])).await;
    r.expect("WRITE").status
}

/// The sense key, ASC and ASCQ of TEST UNIT READY, `None` when GOOD.
async fn tur(s: &Session) -> Option<(u8, u8, u8)> {
    let r = s.raw(0, &[0; 6], 0, Bytes::new()).await.expect("TUR");
    (r.status != 0).then(|| {
        let sense = Sense::parse(&r.sense).expect("sense");
        (sense.key, sense.asc, sense.ascq)
    })
}

/// Clears the unit attentions a new session starts with (power on, reset).
async fn settle(s: &Session) {
    for _ in 0..8 {
        if tur(s).await.is_none() {
            return;
        }
    }
    panic!("unit attentions did not clear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_hold_across_gateways_and_restarts() {
    tokio::time::timeout(T, async {
        let dir = tempfile::tempdir().unwrap();
        let a = Gateway::start(dir.path()).await;
        let b = Gateway::start(dir.path()).await;
        let x_a = a.login(X).await;
        let x_b = b.login(X).await;
        let y_b = b.login(Y).await;
        for s in [&x_a, &x_b, &y_b] {
            settle(s).await;
        }

        // X registers through A and reserves WRITE EXCLUSIVE, REGISTRANTS ONLY.
        assert_eq!(pr_out(&x_a, 0, 0, 0, 0xA).await, 0);
        assert_eq!(pr_out(&x_a, 1, WE_RO, 0xA, 0).await, 0);
        // B reports them...
        assert_eq!(keys(&y_b).await, vec![0xA]);
        assert_eq!(reservation(&y_b).await, Some((0xA, WE_RO)));
        // ...and enforces them at once: Y and X's own (unregistered) session through B may
        // not write.
        assert_eq!(write(&y_b, 1).await, RESERVATION_CONFLICT);
        assert_eq!(write(&x_b, 1).await, RESERVATION_CONFLICT);
        // X registers its path through B too (as a cluster node does): now it writes there,
        // and A reads what it wrote (the LUN is one file).
        assert_eq!(pr_out(&x_b, 0, 0, 0, 0xA).await, 0);
        assert_eq!(write(&x_b, 0x5A).await, 0);
        let back = x_a.read(0, 0, 1, BS as u32).await.expect("read");
        assert_eq!(back, Bytes::from(vec![0x5A; BS]));

        // Y registers through B and preempts X: X's sessions through B and A hear it on
        // their next commands.
        assert_eq!(pr_out(&y_b, 0, 0, 0, 0xB).await, 0);
        assert_eq!(pr_out(&y_b, 4, WE_RO, 0xB, 0xA).await, 0);
        let preempted = Some((6, 0x2A, 0x05));
        assert_eq!(tur(&x_b).await, preempted);
        assert_eq!(tur(&x_a).await, preempted);
        assert_eq!(write(&x_a, 2).await, RESERVATION_CONFLICT);
        assert_eq!(write(&y_b, 3).await, 0);
        assert_eq!(reservation(&x_a).await, Some((0xB, WE_RO)));

        // Gateway B restarts: the reservation is Y's still, enforced from the start.
        drop((x_b, y_b));
        b.stop().await;
        let b = Gateway::start(dir.path()).await;
        let x_b = b.login(X).await;
        settle(&x_b).await;
        assert_eq!(reservation(&x_b).await, Some((0xB, WE_RO)));
        assert_eq!(keys(&x_b).await, vec![0xB]);
        assert_eq!(write(&x_b, 4).await, RESERVATION_CONFLICT);
        b.stop().await;
        a.stop().await;
    })
    .await
    .expect("within the time limit");
}
