//! The datamover conformance kit (`datamover::conformance`) run against the TCP datamover,
//! without and with digests. The initiator end is a plain socket speaking PDUs encoded by
//! the codec (digests from a separate reference CRC32C), answering R2Ts with Data-Out.

use async_trait::async_trait;
use bytes::Bytes;
use datamover::conformance::{KitConnection, KitEvent, KitInitiator, KitTransport};
use datamover::{CmdSnState, FfpConfig};
use datamover_tcp::TcpConnection;
use iscsi_wire::{Bhs, DataOut, Pdu, RESERVED_TAG};
use std::collections::HashMap;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::Tcp;

const PLAIN: Tcp = Tcp(common::PLAIN);
const DIGESTS: Tcp = Tcp(common::DIGESTS);

#[async_trait]
impl KitTransport for Tcp {
    fn config(&self) -> FfpConfig {
        datamover::conformance::config(self.0, false, 1)
    }

    async fn connect(&self) -> KitConnection {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (ours, _) = listener.accept().await.unwrap();
        let conn = TcpConnection::new(ours, None).unwrap();
        let (dm, notices) = conn.into_full_feature(self.config(), CmdSnState::new(1, 64));
        let peer = TcpPeer {
            socket: common::PeerSocket::new(peer, self.0),
            writes: HashMap::new(),
            pending: Vec::new(),
            max_send: 8192,
        };
        (dm, notices, Box::new(peer))
    }
}

struct TcpPeer {
    socket: common::PeerSocket,
    /// Write data by ITT, for answering R2Ts.
    writes: HashMap<u32, Bytes>,
    /// Events decoded but not yet returned (a collapsed status follows its data).
    pending: Vec<KitEvent>,
    /// The target's MaxRecvDataSegmentLength.
    max_send: u32,
}

impl TcpPeer {
    async fn send(&mut self, pdu: Pdu) {
        self.socket.send(&pdu).await
    }

    /// Sends `data[offset..offset + len]` of `itt` as Data-Out PDUs of at most `max_send`.
    async fn data_out(&mut self, itt: u32, ttt: u32, offset: u32, len: u32) {
        let data = self.writes[&itt].clone();
        let (mut sent, mut data_sn) = (0, 0);
        while sent < len {
            let n = (len - sent).min(self.max_send);
            let at = (offset + sent) as usize;
            let bhs = Bhs::DataOut(DataOut {
                final_: sent + n == len,
                itt,
                ttt,
                data_sn,
                buffer_offset: offset + sent,
                ..Default::default()
            });
            self.send(Pdu::new(bhs, data.slice(at..at + n as usize)))
                .await;
            sent += n;
            data_sn += 1;
        }
    }

    /// Handles one PDU: R2Ts are answered here; everything else becomes events.
    async fn on_pdu(&mut self, pdu: Pdu) {
        match &pdu.bhs {
            Bhs::R2t(r) => {
                self.data_out(r.itt, r.ttt, r.buffer_offset, r.desired_len)
                    .await
            }
            Bhs::DataIn(d) => {
                self.pending.push(KitEvent::Data {
                    itt: d.itt,
                    offset: d.buffer_offset,
                    data: pdu.data.clone(),
                });
                if d.status_present {
                    self.pending.push(KitEvent::Status {
                        itt: d.itt,
                        stat_sn: d.stat_sn,
                        status: d.status,
                        underflow: d.underflow,
                        residual: d.residual,
                    });
                }
            }
            Bhs::ScsiResponse(r) => self.pending.push(KitEvent::Status {
                itt: r.itt,
                stat_sn: r.stat_sn,
                status: r.status,
                underflow: r.underflow,
                residual: r.residual,
            }),
            _ => self.pending.push(KitEvent::Control(pdu)),
        }
    }
}

#[async_trait]
impl KitInitiator for TcpPeer {
    async fn send_read(&mut self, itt: u32, len: u32) {
        self.send(Pdu::new(
            datamover::conformance::scsi_command(itt, true, len, true),
            Bytes::new(),
        ))
        .await
    }

    async fn send_write(&mut self, itt: u32, data: Bytes, immediate: u32, unsolicited: u32) {
        let len = data.len() as u32;
        self.writes.insert(itt, data.clone());
        let cmd = datamover::conformance::scsi_command(itt, false, len, unsolicited == 0);
        self.send(Pdu::new(cmd, data.slice(..immediate as usize)))
            .await;
        if unsolicited > 0 {
            self.data_out(itt, RESERVED_TAG, immediate, unsolicited)
                .await;
        }
    }

    async fn send_write_withholding(&mut self, itt: u32, data: Bytes) {
        let cmd = datamover::conformance::scsi_command(itt, false, data.len() as u32, false);
        self.writes.insert(itt, data);
        self.send(Pdu::new(cmd, Bytes::new())).await
    }

    async fn send_bad_data(&mut self, itt: u32) {
        let len = self.writes.get(&itt).map_or(0, |d| d.len() as u32);
        let bhs = Bhs::DataOut(DataOut {
            final_: true,
            itt,
            ttt: RESERVED_TAG,
            buffer_offset: len,
            ..Default::default()
        });
        self.send(Pdu::new(bhs, Bytes::from(vec![0xee; 512]))).await
    }

    async fn next_event(&mut self, timeout: Duration) -> Option<KitEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if !self.pending.is_empty() {
                return Some(self.pending.remove(0));
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.socket.recv(left).await? {
                Some(pdu) => self.on_pdu(pdu).await,
                None => return Some(KitEvent::Closed),
            }
        }
    }

    fn disconnect(&mut self) {
        self.socket.disconnect()
    }
}

mod plain {
    use super::*;
    datamover::conformance_tests!(PLAIN);
}

mod with_digests {
    use super::*;
    datamover::conformance_tests!(DIGESTS);
}
