//! The initiator's side of iSCSI/TCP: connecting (bounded in time, traced when asked),
//! login-phase and discovery PDUs one at a time, then full feature phase as a
//! [`TcpInitiatorDatamover`]: a reader task that runs the connection's [`DataPath`] over
//! the received bytes (Data-In placed, R2Ts answered) and passes notices to the session,
//! and a writer task that sends queued PDUs in vectored batches.

mod data_path;

pub use data_path::DataPath;

use crate::frame::{FrameError, FrameReader, PduBatch};
use crate::poll::SocketPoll;
use crate::socket::PduSocket;
use crate::trace::Traced;
use async_trait::async_trait;
use datamover::{
    CommandOut, InPdu, InitiatorChannel, InitiatorDatamover, InitiatorFfpConfig, InitiatorNotice,
    LoginRecvError, NoticeSink, Resume, TransportKind,
};
use iscsi_wire::{Digests, Pdu};
use pcap_trace::{PduTrace, Side};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// Receive buffer growth per read.
pub const READ_CHUNK: usize = 512 * 1024;
/// PDUs taken from the queue per vectored write.
const WRITE_BATCH: usize = 128;

/// A connected socket before full feature phase.
pub struct TcpInitiatorConnection {
    socket: PduSocket,
    /// How long the reader polls the socket after each PDU ([`crate::poll`]).
    poll: Duration,
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
            poll: crate::poll::DEFAULT_POLL,
        })
    }

    /// Polls the socket for `window` after each PDU in full feature phase (zero: never).
    pub fn with_poll(mut self, window: Duration) -> TcpInitiatorConnection {
        self.poll = window;
        self
    }
}

#[async_trait]
impl InitiatorChannel for TcpInitiatorConnection {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn socket(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.socket().as_fd())
    }

    async fn send(&mut self, pdu: &Pdu, digests: Digests) -> io::Result<()> {
        self.socket.send(pdu, digests).await
    }

    async fn recv(&mut self, digests: Digests, max_data: u32) -> Result<InPdu, LoginRecvError> {
        self.socket.recv(digests, max_data).await
    }

    fn into_full_feature(
        self: Box<Self>,
        cfg: InitiatorFfpConfig,
        sink: NoticeSink,
    ) -> Arc<dyn InitiatorDatamover> {
        crate::poll::set_busy_poll(self.socket.socket(), self.poll);
        let poll = SocketPoll::new(self.poll);
        let (rd, wr) = self.socket.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(writer(wr, rx, cfg.digests)).abort_handle();
        let path = Arc::new(Mutex::new(DataPath::new(cfg)));
        let reader =
            tokio::spawn(reader(rd, poll, cfg, path.clone(), tx.clone(), sink)).abort_handle();
        Arc::new(TcpInitiatorDatamover {
            path,
            recovery: cfg.error_recovery_level >= 1,
            tx,
            reader,
            writer,
        })
    }
}

/// One connection's datamover: commands register with the [`DataPath`] before they are
/// queued for the writer, so their Data-In and R2Ts always find them.
pub struct TcpInitiatorDatamover {
    path: Arc<Mutex<DataPath>>,
    /// ErrorRecoveryLevel ≥ 1: statuses can be held, so ExpStatSN is checked against the
    /// data path (`hold_exp_stat_sn`); at level 0 no PDU takes its lock for that.
    recovery: bool,
    tx: mpsc::UnboundedSender<WriterMsg>,
    reader: AbortHandle,
    writer: AbortHandle,
}

fn lock(path: &Mutex<DataPath>) -> MutexGuard<'_, DataPath> {
    path.lock().unwrap_or_else(|p| p.into_inner())
}

impl InitiatorDatamover for TcpInitiatorDatamover {
    fn send_command(&self, mut cmd: CommandOut) {
        {
            let mut path = lock(&self.path);
            path.command(&cmd);
            if self.recovery {
                hold_exp_stat_sn(&path, &mut cmd.pdu);
            }
        }
        let _ = self.tx.send(WriterMsg::Pdu(cmd.pdu));
    }

    fn adopt(&self, cmd: CommandOut, resume: Resume) {
        lock(&self.path).adopt(&cmd, resume);
    }

    fn resume_point(&self, itt: u32) -> Resume {
        lock(&self.path).resume_point(itt)
    }

    fn send_control(&self, mut pdu: Pdu) {
        if self.recovery {
            hold_exp_stat_sn(&lock(&self.path), &mut pdu);
        }
        let _ = self.tx.send(WriterMsg::Pdu(pdu));
    }

    fn forget(&self, itt: u32) {
        lock(&self.path).forget(itt);
    }

    fn set_max_recv_data_segment_length(&self, len: u32, settled: bool) {
        lock(&self.path).set_max_recv_data_segment_length(len, settled);
    }

    fn probe(&self) -> (Vec<InitiatorNotice>, bool) {
        let (mut out, mut notices) = (Vec::new(), Vec::new());
        let probed = lock(&self.path).probe(&mut out, &mut notices);
        for pdu in out {
            let _ = self.tx.send(WriterMsg::Pdu(pdu));
        }
        match probed {
            Ok(stalled) => (notices, stalled),
            Err(why) => {
                // The reader reports the connection's end once the writer closes it.
                tracing::warn!("{why}: closing the connection");
                let _ = self.tx.send(WriterMsg::Close);
                (notices, false)
            }
        }
    }

    fn close(&self) {
        let _ = self.tx.send(WriterMsg::Close);
    }

    fn abort(&self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Drop for TcpInitiatorDatamover {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// An ExpStatSN never acknowledges a status the data path has not delivered (one held while
/// its command's data is asked for again, or lost and asked for with a Status SNACK): the
/// target would free what the SNACK asks for. The session core counts statuses as it gets
/// them; the data path knows which are still missing.
fn hold_exp_stat_sn(path: &DataPath, pdu: &mut Pdu) {
    let ack = path.ack_stat_sn();
    if let Some(exp) = pdu.bhs.initiator_exp_stat_sn_mut() {
        if iscsi_wire::serial::sn_lt(ack, *exp) {
            *exp = ack;
        }
    }
}

/// PDUs handled per lock of the data path before its output goes out.
const RECEIVE_BATCH: usize = 4096;

/// Reads frames and runs them through the data path: everything complete in the buffer is
/// handled under one lock, then Data-Out go to the writer and notices to the session.
async fn reader(
    mut rd: FrameReader<Traced<OwnedReadHalf>>,
    mut poll: SocketPoll,
    cfg: InitiatorFfpConfig,
    path: Arc<Mutex<DataPath>>,
    tx: mpsc::UnboundedSender<WriterMsg>,
    sink: NoticeSink,
) {
    let mut out = Vec::new();
    let mut notices = Vec::new();
    let max_data = cfg.max_recv_data_segment_length.max(512);
    let reason = loop {
        let next = match poll.spin(&mut rd, cfg.digests, max_data).await {
            Ok(()) => rd.next_frame(cfg.digests, max_data).await,
            Err(e) => Err(e),
        };
        match next {
            Ok(_) => poll.busy(),
            // ERL ≥ 1: the PDU is skipped by the length its header claims; the gap it
            // leaves is asked for again (the data path's SNACKs).
            Err(FrameError::HeaderDigest { claimed_len, .. }) if cfg.error_recovery_level >= 1 => {
                if let Err(why) = lock(&path).header_digest_discarded(&mut notices) {
                    break why;
                }
                tracing::warn!("header digest error from the target: PDU of {claimed_len} bytes discarded (ErrorRecoveryLevel 1)");
                sink(&mut notices);
                match rd.discard(claimed_len).await {
                    Ok(()) => continue,
                    Err(FrameError::Eof) => break "the target closed the connection".to_string(),
                    Err(e) => break format!("connection error: {e}"),
                }
            }
            Err(e) => {
                break match e {
                    FrameError::Eof => "the target closed the connection".to_string(),
                    FrameError::Io(e) => format!("connection error: {e}"),
                    e => format!("from the target: {e}"),
                };
            }
        }
        let mut failed = None;
        {
            let mut p = lock(&path);
            for _ in 0..RECEIVE_BATCH {
                match p.receive(rd.buffered(), &mut out, &mut notices) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            notices.extend(p.take_window());
        }
        for pdu in out.drain(..) {
            let _ = tx.send(WriterMsg::Pdu(pdu));
        }
        sink(&mut notices);
        if let Some(e) = failed {
            break e;
        }
    };
    // The connection is over: what is queued goes out, then the socket closes.
    let _ = tx.send(WriterMsg::Close);
    notices.clear();
    notices.push(InitiatorNotice::Closed(reason));
    sink(&mut notices);
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
