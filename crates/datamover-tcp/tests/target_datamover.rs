//! The TCP datamover on its own, over a loopback socket pair: what `put_data`, `get_data`
//! and `send_control` put on the wire (decoded with the PDU codec, digests checked against a
//! separate CRC pass), and what arrives as notices.

use bytes::Bytes;
use datamover::FfpConfig;
use datamover::{CmdSnState, CollapsedStatus, Datamover, DmError, Notice, TaskRef, WriteHandle};
use datamover_tcp::TcpConnection;
use iscsi_wire::{Bhs, DataOut, Digests, NopIn, Pdu, ScsiCommand};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;

const WAIT: Duration = Duration::from_secs(10);

fn config(digests: Digests) -> FfpConfig {
    datamover::conformance::config(digests, true, 100)
}

/// The datamover on one end, a raw peer socket on the other.
async fn pair(
    digests: Digests,
) -> (
    Arc<datamover_tcp::TcpDatamover>,
    tokio::sync::mpsc::Receiver<Notice>,
    TcpStream,
    datamover::StatusNumbering,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (ours, _) = listener.accept().await.unwrap();
    let conn = TcpConnection::new(ours, None).unwrap();
    let cfg = config(digests);
    let status = cfg.status.clone();
    let (dm, notices) = conn.into_full_feature(cfg, CmdSnState::new(7, 20));
    (dm, notices, peer, status)
}

/// Reads PDUs from the peer socket until `n` are decoded; checks every digest present.
async fn read_pdus(peer: &mut TcpStream, digests: Digests, n: usize) -> Vec<Pdu> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while out.len() < n {
        match common::decode_checked(&buf, digests) {
            Some((pdu, used)) => {
                buf.drain(..used);
                out.push(pdu);
            }
            None => {
                let mut chunk = vec![0u8; 65536];
                let got = tokio::time::timeout_at(deadline, peer.read(&mut chunk))
                    .await
                    .expect("PDUs in time")
                    .unwrap();
                assert!(got > 0, "datamover closed early");
                buf.extend_from_slice(&chunk[..got]);
            }
        }
    }
    out
}

/// A WRITE(10) command PDU header: simple task, F bit, `len` bytes expected.
fn write_command(itt: u32, len: u32, cmd_sn: u32) -> Bhs {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2a;
    Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: true,
        attr: 1,
        lun: 0,
        itt,
        expected_data_len: len,
        cmd_sn,
        exp_stat_sn: 0,
        cdb,
    })
}

#[tokio::test]
async fn put_data_cuts_data_in_by_segment_and_burst_and_stamps_sequence_numbers() {
    for (digests, precomputed) in [
        (Digests::default(), false),
        (
            Digests {
                header: true,
                data: true,
            },
            false,
        ),
        (
            Digests {
                header: true,
                data: true,
            },
            true,
        ),
    ] {
        let (dm, _notices, mut peer, numbering) = pair(digests).await;
        let data: Bytes = (0..40_001u32)
            .map(|i| (i * 13) as u8)
            .collect::<Vec<_>>()
            .into();
        let task = TaskRef { itt: 0x42, lun: 0 };
        // With data digests the datamover lends read buffers that note the CRCs at its own
        // cut (4096-byte segments: bursts of 16384 are whole segments), filled here as a RAM
        // backend would; the digests on the wire are then checked independently.
        let lender = dm.read_buffers();
        assert_eq!(lender.is_some(), digests.data);
        let (data, note) = match (&lender, precomputed) {
            (Some(l), true) => {
                let mut buf = l.lend(data.len());
                buf.put(&data[..10_000]);
                buf.put(&data[10_000..]);
                buf.finish()
            }
            _ => (data, None),
        };
        assert_eq!(note.is_some(), precomputed);
        let status = CollapsedStatus {
            status: 0,
            overflow: false,
            underflow: true,
            residual: 7,
        };
        let n = dm
            .put_data(task, data.clone(), note, Some(status))
            .await
            .unwrap();
        // 40001 bytes: 2 full bursts of 4 x 4096, then 7233 = 4096 + 3137.
        assert_eq!(n, 10);
        // A status-bearing NOP-In, then a ping (no status).
        for itt in [9, iscsi_wire::RESERVED_TAG] {
            let nop = NopIn {
                itt,
                ..Default::default()
            };
            dm.send_control(Pdu::new(Bhs::NopIn(nop), Bytes::new()))
                .await
                .unwrap();
        }
        let pdus = read_pdus(&mut peer, digests, 12).await;
        let mut got = Vec::new();
        for (i, p) in pdus[..10].iter().enumerate() {
            let Bhs::DataIn(d) = &p.bhs else {
                panic!("Data-In expected")
            };
            assert_eq!(d.data_sn, i as u32);
            assert_eq!(d.buffer_offset as usize, got.len());
            assert_eq!((d.exp_cmd_sn, d.max_cmd_sn), (7, 20));
            // Before the status: the next StatSN; the status: the one it was given.
            assert_eq!(d.stat_sn, 100);
            // F ends each burst (every 4th PDU) and the sequence; status only in the last.
            assert_eq!(d.final_, i % 4 == 3 || i == 9, "F bit of PDU {i}");
            assert_eq!(d.status_present, i == 9);
            got.extend_from_slice(&p.data);
        }
        let Bhs::DataIn(last) = &pdus[9].bhs else {
            unreachable!()
        };
        assert_eq!(
            (last.stat_sn, last.underflow, last.residual),
            (100, true, 7)
        );
        assert_eq!(got, data.to_vec());
        let Bhs::NopIn(nop) = &pdus[10].bhs else {
            panic!("NOP-In expected")
        };
        assert_eq!(nop.stat_sn, 101, "the next status's StatSN");
        // Both statuses are kept (the Data-In's as the SCSI Response it stands for) until
        // the initiator's ExpStatSN passes them.
        {
            let mut seq = numbering.lock().unwrap();
            assert_eq!(seq.unacknowledged(), 2);
            let kept = seq.retained(100).expect("the collapsed status");
            let Bhs::ScsiResponse(r) = &kept.bhs else {
                panic!("kept as a SCSI Response")
            };
            assert_eq!((r.itt, r.underflow, r.residual), (0x42, true, 7));
            seq.acknowledge(101);
            assert_eq!(seq.unacknowledged(), 1);
            seq.acknowledge(102);
            assert_eq!(seq.unacknowledged(), 0);
        }
        let Bhs::NopIn(ping) = &pdus[11].bhs else {
            panic!("NOP-In expected")
        };
        assert_eq!(
            ping.stat_sn, 102,
            "a PDU without status carries the next StatSN"
        );
    }
}

#[tokio::test]
async fn get_data_gathers_immediate_data_and_solicits_the_rest_with_r2ts() {
    let digests = Digests {
        header: true,
        data: true,
    };
    let (dm, mut notices, mut peer, _) = pair(digests).await;
    let payload: Vec<u8> = (0..30_000u32).map(|i| (i * 7 + 1) as u8).collect();
    let imm = &payload[..8192];
    let cmd = Pdu::new(
        write_command(5, payload.len() as u32, 7),
        Bytes::copy_from_slice(imm),
    );
    let crc = |b: &[u8]| common::reference_crc32c(b);
    peer.write_all(&iscsi_wire::encode_pdu(&cmd, Some(&crc), Some(&crc)))
        .await
        .unwrap();
    let Some(Notice::Command { write: Some(w), .. }) =
        tokio::time::timeout(WAIT, notices.recv()).await.unwrap()
    else {
        panic!("a command with a write handle");
    };
    assert_eq!(w.expected_len, 30_000);
    let task = TaskRef { itt: 5, lun: 0 };
    let dm2 = dm.clone();
    let gather = tokio::spawn(async move { dm2.get_data(task, w).await });

    // R2Ts for the rest (21808 bytes) in MaxBurstLength pieces, MaxOutstandingR2T 2 at once.
    let r2ts = read_pdus(&mut peer, digests, 2).await;
    let mut offsets = Vec::new();
    for r in &r2ts {
        let Bhs::R2t(r) = &r.bhs else {
            panic!("R2T expected")
        };
        offsets.push((r.buffer_offset, r.desired_len, r.ttt, r.r2t_sn));
    }
    assert_eq!(offsets[0].0, 8192);
    assert_eq!(offsets[0].1 + offsets[1].1, 30_000 - 8192);
    assert_eq!((offsets[0].3, offsets[1].3), (0, 1), "R2TSN");
    for (off, len, ttt, _) in offsets {
        let mut sent = 0u32;
        let mut data_sn = 0;
        while sent < len {
            let n = (len - sent).min(8192);
            let start = (off + sent) as usize;
            let out = Pdu::new(
                Bhs::DataOut(DataOut {
                    final_: sent + n == len,
                    itt: 5,
                    ttt,
                    data_sn,
                    buffer_offset: off + sent,
                    ..Default::default()
                }),
                Bytes::copy_from_slice(&payload[start..start + n as usize]),
            );
            peer.write_all(&iscsi_wire::encode_pdu(&out, Some(&crc), Some(&crc)))
                .await
                .unwrap();
            sent += n;
            data_sn += 1;
        }
    }
    let (got, r2t_count) = tokio::time::timeout(WAIT, gather)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], &payload[..]);
    assert_eq!(r2t_count, 2);

    // A data digest error closes the connection; a pending gather fails as Closed.
    let cmd = Pdu::new(write_command(6, 512, 8), Bytes::new());
    peer.write_all(&iscsi_wire::encode_pdu(&cmd, Some(&crc), None))
        .await
        .unwrap();
    let Some(Notice::Command { write: Some(w), .. }) =
        tokio::time::timeout(WAIT, notices.recv()).await.unwrap()
    else {
        panic!("second command");
    };
    let dm2 = dm.clone();
    let gather = tokio::spawn(async move {
        dm2.get_data(
            TaskRef { itt: 6, lun: 0 },
            WriteHandle {
                itt: w.itt,
                expected_len: 512,
            },
        )
        .await
    });
    let r2t = read_pdus(&mut peer, digests, 1).await;
    let Bhs::R2t(r) = &r2t[0].bhs else { panic!() };
    let out = Pdu::new(
        Bhs::DataOut(DataOut {
            final_: true,
            itt: 6,
            ttt: r.ttt,
            ..Default::default()
        }),
        Bytes::from(vec![1u8; 512]),
    );
    let bad = |b: &[u8]| common::reference_crc32c(b) ^ 1;
    peer.write_all(&iscsi_wire::encode_pdu(&out, Some(&crc), Some(&bad)))
        .await
        .unwrap();
    let result = tokio::time::timeout(WAIT, gather).await.unwrap().unwrap();
    assert_eq!(result, Err(DmError::Closed));
    let closed = tokio::time::timeout(WAIT, notices.recv()).await.unwrap();
    assert!(
        matches!(closed, Some(Notice::Closed(ref why)) if why.contains("data digest")),
        "{closed:?}"
    );
}
