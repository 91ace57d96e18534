//! `SessionConfig::trace`: the pcapng written while a session runs against the in-process
//! ironsan target decodes (with the analyzer, an independent decoder of the bytes) into
//! exactly the PDUs of the exchange: logins, one WRITE of 1 MiB whose immediate, unsolicited
//! and solicited data add up to 1 MiB, one READ of 64 KiB answered by 64 KiB of Data-In,
//! logouts, and valid digests on the connection that negotiated them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use analyze::{Dir, PduRecord};
use bytes::Bytes;
use iscsi_initiator::{scsi, IscsiUrl, SessionConfig, TraceFile};

const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]

[[target]]
name = "iqn.2026-11.org.ironsan:plain"
[target.lun.0]
size = "16MiB"
backend = "memory"

[[target]]
name = "iqn.2026-11.org.ironsan:digests"
header_digest = "required"
data_digest = "required"
[target.lun.0]
size = "16MiB"
backend = "memory"
"#;

async fn start_target() -> SocketAddr {
    test_support::start_target(CONFIG).await
}

/// Logs in, writes 1 MiB at LBA 0, reads 64 KiB back, logs out; the commands go out raw so
/// that the count on the wire is exactly what was asked (no unit-attention retries).
async fn exchange(u: &IscsiUrl, trace: &TraceFile) {
    let cfg = SessionConfig {
        trace: Some(trace.clone()),
        ..SessionConfig::from_url(u)
    };
    let s = transports::connect_session(u, cfg).await.expect("login");
    let data: Bytes = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    // The first command may meet the new session's unit attention: issue it until GOOD.
    let cdb = scsi::read_write(true, 0, 2048, false);
    let mut writes = 0;
    loop {
        writes += 1;
        let r = s.raw(0, &cdb, 0, data.clone()).await.expect("write");
        if r.status == scsi::status::GOOD || writes == 4 {
            assert_eq!(r.status, scsi::status::GOOD, "WRITE status");
            break;
        }
    }
    let r = s
        .raw(
            0,
            &scsi::read_write(false, 0, 128, false),
            65536,
            Bytes::new(),
        )
        .await
        .expect("read");
    assert_eq!(r.status, scsi::status::GOOD);
    assert_eq!(&r.data[..], &data[..65536]);
    s.logout().await.expect("logout");
}

fn count(pdus: &[&PduRecord], opcode: u8) -> usize {
    pdus.iter().filter(|p| p.opcode == opcode).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_of_a_known_exchange_decodes_into_its_pdus() {
    let path = std::env::temp_dir().join(format!("initiator-trace-{}.pcapng", std::process::id()));
    tokio::time::timeout(Duration::from_secs(60), async {
        let addr = start_target().await;
        let trace = TraceFile::create(&path).expect("trace file");
        for (target, query) in [
            ("plain", ""),
            ("digests", "?header_digest=crc32c&data_digest=crc32c"),
        ] {
            let u = IscsiUrl::parse_lun(&format!(
                "iscsi://{addr}/iqn.2026-11.org.ironsan:{target}/0{query}"
            ))
            .expect("url");
            exchange(&u, &trace).await;
        }
        // Let the connection tasks end (their closing segments), then flush.
        tokio::time::sleep(Duration::from_millis(100)).await;
        trace.flush().expect("flush");
        let a = analyze::analyze_file(
            &path,
            &analyze::Options {
                ports: vec![addr.port()],
                detect_by_content: false,
            },
        )
        .expect("the trace reads back");
        assert_eq!(a.connections.len(), 2, "one connection per session");
        for conn in 0..2 {
            let pdus: Vec<&PduRecord> = a.pdus.iter().filter(|p| p.conn == conn).collect();
            let logins = count(&pdus, 0x03);
            assert!(
                logins >= 1 && logins == count(&pdus, 0x23),
                "login request/response pairs"
            );
            assert_eq!(
                (count(&pdus, 0x06), count(&pdus, 0x26)),
                (1, 1),
                "one logout"
            );
            assert!(pdus
                .iter()
                .all(|p| (p.opcode & 0x20 == 0) == (p.dir == Dir::ToTarget)));
            let cmds: Vec<&PduRecord> = pdus.iter().copied().filter(|p| p.opcode == 0x01).collect();
            let writes: Vec<&PduRecord> = cmds
                .iter()
                .copied()
                .filter(|p| p.cdb.as_deref() == Some("WRITE(10) LBA 0 len 2048"))
                .collect();
            let reads: Vec<&PduRecord> = cmds
                .iter()
                .copied()
                .filter(|p| p.cdb.as_deref() == Some("READ(10) LBA 0 len 128"))
                .collect();
            assert!(!writes.is_empty() && writes.len() <= 4, "{cmds:?}");
            assert_eq!(reads.len(), 1, "one READ");
            assert_eq!(cmds.len(), writes.len() + 1, "no other command");
            // Every byte of the last WRITE: immediate data plus Data-Out, and some R2T.
            let w = writes.last().unwrap();
            let wi = w.itt;
            let out: u64 = w.data_len as u64
                + pdus
                    .iter()
                    .filter(|p| p.opcode == 0x05 && p.itt == wi)
                    .map(|p| p.data_len as u64)
                    .sum::<u64>();
            assert_eq!(out, 1 << 20, "WRITE data on the wire");
            assert!(
                pdus.iter().any(|p| p.opcode == 0x31 && p.itt == wi),
                "an R2T"
            );
            let ri = reads[0].itt;
            let data_in: u64 = pdus
                .iter()
                .filter(|p| p.opcode == 0x25 && p.itt == ri)
                .map(|p| p.data_len as u64)
                .sum();
            assert_eq!(data_in, 65536, "READ data on the wire");
            // Every command got its status (a SCSI Response or a Data-In carrying it).
            let mut status: HashMap<Option<u32>, u8> = HashMap::new();
            for p in pdus.iter().filter(|p| p.status.is_some()) {
                status.insert(p.itt, p.status.unwrap());
            }
            assert_eq!(status.get(&ri), Some(&0), "READ status GOOD");
            assert_eq!(status.get(&wi), Some(&0), "WRITE status GOOD");
            let digests = pdus
                .iter()
                .filter(|p| p.opcode != 0x03 && p.opcode != 0x23)
                .map(|p| p.header_digest)
                .collect::<Vec<_>>();
            let want = if conn == 0 {
                analyze::iscsi::DigestCheck::Absent
            } else {
                analyze::iscsi::DigestCheck::Ok
            };
            assert!(
                digests.iter().all(|d| *d == want),
                "header digests {want:?}"
            );
        }
    })
    .await
    .expect("in time");
    let _ = std::fs::remove_file(&path);
}
