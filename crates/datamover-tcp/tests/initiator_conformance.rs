//! The initiator half of the conformance kit (`datamover::conformance::initiator`) run
//! against the TCP initiator datamover, without and with digests. The target end is a plain
//! socket speaking PDUs encoded by the codec (digests from a separate reference CRC32C):
//! Data-In for placed data, R2T and the Data-Out answering it for fetched data.

use async_trait::async_trait;
use bytes::Bytes;
use datamover::conformance::initiator::{InitiatorKitTransport, KitArrival, KitTarget};
use datamover::{InitiatorChannel, InitiatorDatamover, InitiatorFfpConfig, NoticeSink};
use datamover_tcp::initiator::TcpInitiatorConnection;
use iscsi_wire::{Bhs, DataIn, Pdu, R2t};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

mod common;

use common::Tcp;

const PLAIN: Tcp = Tcp(common::PLAIN);
const DIGESTS: Tcp = Tcp(common::DIGESTS);

#[async_trait]
impl InitiatorKitTransport for Tcp {
    fn config(&self) -> InitiatorFfpConfig {
        InitiatorFfpConfig {
            digests: self.0,
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: 4096,
            max_burst_length: 32768,
            exp_stat_sn: 1,
            max_outstanding_unexpected_pdus: 0,
            error_recovery_level: 0,
        }
    }

    async fn connect(&self, sink: NoticeSink) -> (Arc<dyn InitiatorDatamover>, Box<dyn KitTarget>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (ours, peer) = tokio::join!(
            TcpInitiatorConnection::connect(&addr, Duration::from_secs(5), None),
            listener.accept()
        );
        let dm = Box::new(ours.unwrap()).into_full_feature(self.config(), sink);
        let target = TcpTarget {
            socket: common::PeerSocket::new(peer.unwrap().0, self.0),
            pending: VecDeque::new(),
            data_sn: HashMap::new(),
            next_ttt: 1,
            max_send: self.config().max_recv_data_segment_length,
        };
        (dm, Box::new(target))
    }
}

struct TcpTarget {
    socket: common::PeerSocket,
    /// PDUs received while waiting for Data-Out.
    pending: VecDeque<Pdu>,
    /// The next Data-In DataSN of each task.
    data_sn: HashMap<u32, u32>,
    next_ttt: u32,
    /// The initiator's MaxRecvDataSegmentLength.
    max_send: u32,
}

#[async_trait]
impl KitTarget for TcpTarget {
    async fn next(&mut self, timeout: Duration) -> Option<KitArrival> {
        if let Some(p) = self.pending.pop_front() {
            return Some(KitArrival::Pdu(p));
        }
        match self.socket.recv(timeout).await? {
            Some(p) => Some(KitArrival::Pdu(p)),
            None => Some(KitArrival::Closed),
        }
    }

    async fn put_data(&mut self, itt: u32, offset: u32, data: Bytes) {
        let mut at = 0;
        while at < data.len() {
            let end = (at + self.max_send as usize).min(data.len());
            let sn = self.data_sn.entry(itt).or_default();
            let bhs = Bhs::DataIn(DataIn {
                itt,
                data_sn: *sn,
                buffer_offset: offset + at as u32,
                exp_cmd_sn: 1,
                max_cmd_sn: 64,
                ..Default::default()
            });
            *sn += 1;
            self.send(Pdu::new(bhs, data.slice(at..end))).await;
            at = end;
        }
    }

    async fn get_data(&mut self, itt: u32, offset: u32, len: u32) -> Bytes {
        let ttt = self.next_ttt;
        self.next_ttt += 1;
        let r2t = R2t {
            itt,
            ttt,
            buffer_offset: offset,
            desired_len: len,
            exp_cmd_sn: 1,
            max_cmd_sn: 64,
            ..Default::default()
        };
        self.send(Pdu::new(Bhs::R2t(r2t), Bytes::new())).await;
        let mut got = Vec::new();
        let mut data_sn = 0;
        loop {
            let pdu = match self.socket.recv(datamover::conformance::WAIT).await {
                Some(Some(p)) => p,
                other => panic!("Data-Out for TTT {ttt} did not come: {other:?}"),
            };
            let Bhs::DataOut(d) = &pdu.bhs else {
                self.pending.push_back(pdu);
                continue;
            };
            assert_eq!((d.itt, d.ttt, d.data_sn), (itt, ttt, data_sn));
            assert_eq!(d.buffer_offset, offset + got.len() as u32, "in order");
            assert!(
                pdu.data.len() <= 4096,
                "within our MaxRecvDataSegmentLength"
            );
            got.extend_from_slice(&pdu.data);
            data_sn += 1;
            if d.final_ {
                assert_eq!(got.len() as u32, len, "the F bit ends the burst");
                return Bytes::from(got);
            }
        }
    }

    async fn send(&mut self, pdu: Pdu) {
        self.socket.send(&pdu).await
    }

    fn disconnect(&mut self) {
        self.socket.disconnect()
    }
}

mod plain {
    use super::*;
    datamover::initiator_conformance_tests!(PLAIN);
}

mod with_digests {
    use super::*;
    datamover::initiator_conformance_tests!(DIGESTS);
}

/// A protocol error from the target (here an R2T beyond the write) ends the connection on
/// both sides: a `Closed` notice naming it, and the socket closed.
#[tokio::test]
async fn a_protocol_error_from_the_target_closes_the_connection() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sink: NoticeSink = Arc::new(move |v: &mut Vec<datamover::InitiatorNotice>| {
        for n in v.drain(..) {
            let _ = tx.send(n);
        }
    });
    let (dm, mut target) = PLAIN.connect(sink).await;
    let cmd = datamover::conformance::initiator::command(4, 0, Bytes::from(vec![1u8; 512]), 0);
    dm.send_command(cmd);
    assert!(matches!(
        target.next(Duration::from_secs(5)).await,
        Some(KitArrival::Pdu(_))
    ));
    let r2t = R2t {
        itt: 4,
        ttt: 1,
        desired_len: 4096,
        ..Default::default()
    };
    target.send(Pdu::new(Bhs::R2t(r2t), Bytes::new())).await;
    let notice = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    match notice {
        Ok(Some(datamover::InitiatorNotice::Closed(why))) => {
            assert!(why.contains("of a 512-byte write"), "{why}")
        }
        other => panic!("expected Closed, got {other:?}"),
    }
    assert!(matches!(
        target.next(Duration::from_secs(5)).await,
        Some(KitArrival::Closed)
    ));
}
