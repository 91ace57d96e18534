//! The initiator's side of iSCSI/TCP: connecting (bounded in time, traced when asked),
//! login-phase and discovery PDUs one at a time, then in full feature phase a
//! [`FrameReader`] for the reader task and the [`writer`] task that sends queued PDUs in
//! vectored batches.

use crate::frame::{FrameReader, PduBatch};
use crate::socket::PduSocket;
use crate::trace::Traced;
use async_trait::async_trait;
use datamover::{InPdu, InitiatorChannel, LoginRecvError, TransportKind};
use iscsi_wire::{Digests, Pdu};
use pcap_trace::{PduTrace, Side};
use std::io;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Receive buffer growth per read.
pub const READ_CHUNK: usize = 512 * 1024;
/// PDUs taken from the queue per vectored write.
const WRITE_BATCH: usize = 128;

/// A connected socket before full feature phase.
pub struct TcpInitiatorConnection {
    socket: PduSocket,
}

impl TcpInitiatorConnection {
    /// Opens a TCP connection to `addr` (`host:port`) within `timeout`, traced into `trace`
    /// when given. The error says why, in a few words.
    pub async fn connect(
        addr: &str,
        timeout: Duration,
        trace: Option<&PduTrace>,
    ) -> Result<TcpInitiatorConnection, String> {
        let s = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("no answer within {} s", timeout.as_secs()))?
            .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        Ok(TcpInitiatorConnection {
            socket: PduSocket::new(s, trace, Side::Connected, READ_CHUNK),
        })
    }

    /// The socket (for its descriptor: TCP_INFO sampling).
    pub fn socket(&self) -> &TcpStream {
        self.socket.socket()
    }

    /// Full feature phase: the reader (with what was received already) and the write half.
    pub fn into_split(self) -> (FrameReader<Traced<OwnedReadHalf>>, Traced<OwnedWriteHalf>) {
        self.socket.into_split()
    }
}

#[async_trait]
impl InitiatorChannel for TcpInitiatorConnection {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    async fn send(&mut self, pdu: &Pdu, digests: Digests) -> io::Result<()> {
        self.socket.send(pdu, digests).await
    }

    async fn recv(&mut self, digests: Digests, max_data: u32) -> Result<InPdu, LoginRecvError> {
        self.socket.recv(digests, max_data).await
    }
}

/// What the writer task is asked to do.
pub enum WriterMsg {
    Pdu(Pdu),
    Close,
}

/// Sends queued PDUs: each wake-up takes everything queued (up to a batch) and writes it in
/// one vectored write; `Close` (or the queue's end) shuts the socket's sending side.
pub async fn writer(
    mut w: Traced<OwnedWriteHalf>,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    digests: Digests,
) -> io::Result<()> {
    let mut queued = Vec::with_capacity(WRITE_BATCH);
    let mut batch = PduBatch::default();
    loop {
        if rx.recv_many(&mut queued, WRITE_BATCH).await == 0 {
            break;
        }
        batch.clear();
        let mut close = false;
        for m in queued.drain(..) {
            match m {
                WriterMsg::Pdu(p) => batch.push(&p.bhs, &p.ahs, p.data, digests, None),
                WriterMsg::Close => {
                    close = true;
                    break;
                }
            }
        }
        batch.write_to(&mut w).await?;
        if close {
            break;
        }
    }
    let _ = w.shutdown().await;
    Ok(())
}
