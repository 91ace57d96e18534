//! The target's side of iSCSI/TCP: a portal that accepts connections, the login channel,
//! and in full feature phase one reader task and one writer task per connection.
//!
//! Receive path: the [`FrameReader`] reads in large chunks; each frame's header digest is
//! checked there, and a Data-Out payload (or a command's immediate data) is copied straight
//! into the task's write buffer with the CRC32C computed in the same pass. Send path:
//! queued PDUs are stamped (StatSN, ExpCmdSN, MaxCmdSN), read data is cut into Data-In
//! PDUs, and a [`PduBatch`] goes out in one vectored write whose payload slices reference
//! the backend's buffers (no copy). With a trace, the socket is wrapped in [`Traced`].
//!
//! At ErrorRecoveryLevel 1 the reader discards a PDU whose header fails its digest and
//! reports data digest errors as Reject notices; lost write data is asked for again by
//! recovery R2T (at once, or after 5 s without Data-Out); read
//! data is kept until its status is acknowledged, so a Data SNACK can have it sent again.

use crate::frame::{Frame, FrameError, FrameReader, PduBatch};
use crate::poll::SocketPoll;
use crate::socket::PduSocket;
use crate::trace::Traced;
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use datamover::budget::{Budget, Reservation};
use datamover::LOGIN_MAX_DATA;
use datamover::{
    CmdSnState, CollapsedStatus, Datamover, DmError, FfpConfig, InPdu, LoginChannel,
    LoginRecvError, Notice, Portal, RecoveryCounters, TaskRef, TransportKind, WriteHandle,
};
use iscsi_session::{data_in_segments, R2tRequest, WriteTransfer};
use iscsi_wire::serial::sn_lt;
use iscsi_wire::{
    reject, Bhs, DataIn, DataOut, Digests, Pdu, R2t, ScsiCommand, WireError, BHS_LEN, RESERVED_TAG,
};
use pcap_trace::{PduTrace, Side};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

const READ_CHUNK: usize = 256 * 1024;
/// PDUs with header digest errors discarded one after another before the stream is taken
/// for lost (a wrong claimed length puts every later header out of place).
const MAX_DISCARDS_IN_A_ROW: u32 = 4;
const OUT_QUEUE: usize = 1024;
const NOTICE_QUEUE: usize = 256;
const WRITE_BATCH: usize = 64;

/// An iSCSI/TCP portal: a listening socket.
pub struct TcpPortal {
    listener: TcpListener,
    local: SocketAddr,
    /// How long each connection's reader polls after a PDU ([`crate::poll`]).
    poll: Duration,
}

impl TcpPortal {
    /// Listens on `addr`; its connections poll for [`crate::poll::DEFAULT_POLL`].
    pub async fn bind(addr: SocketAddr) -> io::Result<TcpPortal> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok(TcpPortal {
            listener,
            local,
            poll: crate::poll::DEFAULT_POLL,
        })
    }

    /// Its connections poll their socket for `window` after each PDU (zero: never).
    pub fn with_poll(mut self, window: Duration) -> TcpPortal {
        self.poll = window;
        self
    }
}

#[async_trait]
impl Portal for TcpPortal {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    async fn accept(&self, trace: Option<&PduTrace>) -> io::Result<Box<dyn LoginChannel>> {
        let (stream, _) = self.listener.accept().await?;
        Ok(Box::new(
            TcpConnection::new(stream, trace)?.with_poll(self.poll),
        ))
    }
}

/// Login channels of iSCSI/TCP for connections another portal accepted (one that shares its
/// port with iSCSI/TCP and sorts connections by their first bytes).
/// Their connections poll for [`crate::poll::DEFAULT_POLL`].
pub fn login_channels() -> datamover::TcpLoginChannels {
    login_channels_polling(crate::poll::DEFAULT_POLL)
}

/// [`login_channels`] whose connections poll their socket for `window` after each PDU.
pub fn login_channels_polling(window: Duration) -> datamover::TcpLoginChannels {
    std::sync::Arc::new(move |stream, trace| {
        Ok(Box::new(TcpConnection::new(stream, trace)?.with_poll(window)) as Box<dyn LoginChannel>)
    })
}

/// An accepted connection before full feature phase: plain PDU exchange for login.
pub struct TcpConnection {
    socket: PduSocket,
    peer: SocketAddr,
    /// How long the reader polls the socket after each PDU ([`crate::poll`]).
    poll: Duration,
}

impl TcpConnection {
    /// Wraps an accepted socket; with `trace`, its bytes are recorded from now on.
    pub fn new(stream: TcpStream, trace: Option<&PduTrace>) -> io::Result<TcpConnection> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        Ok(TcpConnection {
            socket: PduSocket::new(stream, trace, Side::Accepted, READ_CHUNK),
            peer,
            poll: crate::poll::DEFAULT_POLL,
        })
    }

    /// Polls the socket for `window` after each PDU in full feature phase (zero: never).
    pub fn with_poll(mut self, window: Duration) -> TcpConnection {
        self.poll = window;
        self
    }

    /// Enters full feature phase: spawns the reader and writer tasks.
    pub fn into_full_feature(
        self,
        cfg: FfpConfig,
        sn: Arc<CmdSnState>,
    ) -> (Arc<TcpDatamover>, mpsc::Receiver<Notice>) {
        crate::poll::set_busy_poll(self.socket.socket(), self.poll);
        let poll = SocketPoll::new(self.poll);
        let (reader, write) = self.socket.into_split();
        let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE);
        let (notice_tx, notice_rx) = mpsc::channel(NOTICE_QUEUE);
        let (stop_tx, stop_rx) = watch::channel(false);
        let stop_tx = Arc::new(stop_tx);
        let sent_reads = SentReads::default();
        let max_send = Arc::new(AtomicU32::new(cfg.max_send_data_segment_length));
        let shared = Arc::new(Shared {
            max_send: max_send.clone(),
            slots: Mutex::new(HashMap::new()),
            sent_reads: sent_reads.clone(),
            out: out_tx,
            next_ttt: AtomicU32::new(1),
            cfg: cfg.clone(),
            stop: stop_tx.clone(),
            peer: self.peer,
            digest_buffers: crate::digest_buf::DigestBuffers::for_connection(&cfg)
                .map(|b| Arc::new(b) as Arc<dyn storage::ReadBufSource>),
        });
        let writer = Writer {
            cfg,
            sn,
            sent_reads,
            max_send,
            peer: self.peer,
            stop_all: stop_tx,
        };
        tokio::spawn(writer.run(write, out_rx, stop_rx.clone()));
        tokio::spawn(watch_sequences(shared.clone(), stop_rx.clone()));
        tokio::spawn(run_reader(reader, poll, shared.clone(), notice_tx, stop_rx));
        (Arc::new(TcpDatamover { shared }), notice_rx)
    }
}

#[async_trait]
impl LoginChannel for TcpConnection {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn socket(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.socket().as_fd())
    }

    async fn recv(&mut self) -> Result<InPdu, LoginRecvError> {
        self.socket.recv(Digests::default(), LOGIN_MAX_DATA).await
    }

    async fn send(&mut self, pdu: &Pdu) -> io::Result<()> {
        self.socket.send(pdu, Digests::default()).await
    }

    fn into_full_feature(
        self: Box<Self>,
        cfg: FfpConfig,
        sn: Arc<CmdSnState>,
    ) -> (Arc<dyn Datamover>, mpsc::Receiver<Notice>) {
        let (dm, notices) = TcpConnection::into_full_feature(*self, cfg, sn);
        (dm, notices)
    }
}

struct WriteSlot {
    /// Set when a Data-Out broke the rules, or the budget had no room even for the
    /// unsolicited data (then `buf` is empty): later Data-Outs are discarded.
    failed: Option<DmError>,
    /// When data for it last arrived (or its R2Ts went out): the sequence reception
    /// timeout counts from here.
    progress: std::time::Instant,
    /// When data for it last arrived, or it was first asked for: the data-out timeout
    /// (`PeerTimeouts::data_out`) counts from here, recovery R2Ts or not.
    data_seen: std::time::Instant,
    /// The data so far: the unsolicited part until the command asks for the rest.
    buf: BytesMut,
    /// `buf`'s bytes in the connection's memory budget.
    reservation: Reservation,
    xfer: WriteTransfer,
    lun: u64,
    solicited: bool,
    waiter: Option<oneshot::Sender<Result<(Bytes, u32), DmError>>>,
}

impl WriteSlot {
    /// Places a PDU's payload (already checked against the transfer) at `offset`; for a
    /// write that failed (the command's immediate data, over budget) only its digest is
    /// checked.
    fn place(&mut self, frame: &Frame, bytes: &[u8], offset: u32) -> Result<(), String> {
        if self.failed.is_some() {
            return frame.verify_data_digest(bytes).map_err(|e| e.to_string());
        }
        let off = offset as usize;
        let len = frame.layout.data_len as usize;
        place(frame, bytes, &mut self.buf[off..off + len])
    }

    /// The collected data, its reservation travelling with it until the last reference to it
    /// is dropped (the backend has written it).
    fn into_data(self) -> Bytes {
        let WriteSlot {
            buf, reservation, ..
        } = self;
        reservation.travel_with(buf)
    }
}

/// Read data kept at ErrorRecoveryLevel ≥ 1 until its status is acknowledged, for a Data
/// SNACK to have sent again.
#[derive(Clone)]
struct SentRead {
    task: TaskRef,
    data: Bytes,
    crcs: Option<Arc<digest::SegmentCrcs>>,
    status: Option<CollapsedStatus>,
    /// The StatSN of the task's status once it is sent (in the last Data-In or a SCSI
    /// Response): when the initiator acknowledges it, the data is forgotten.
    stat_sn: Option<u32>,
    /// Data-In before this DataSN were acknowledged by DataACK: not sent again.
    acked: u32,
    /// How the data is cut into Data-In (changed by an R-Data SNACK).
    layout: ReadLayout,
    /// The tag of the last R-Data SNACK: the read's status carries it from then on.
    snack_tag: Option<u32>,
}

/// How a kept read's Data-In are numbered: DataSN `first_sn` on carry `data[from..]` in
/// segments of at most `max_seg` bytes (`first_sn` and `from` are 0 until an R-Data SNACK
/// resends from a DataACK on, cut anew).
#[derive(Clone, Copy)]
struct ReadLayout {
    first_sn: u32,
    from: u32,
    max_seg: u32,
}

impl SentRead {
    /// The read's Data-In segments as it numbers them now (offsets into `data`).
    fn segments(&self, max_burst: u32) -> impl Iterator<Item = iscsi_session::DataSegment> {
        let ReadLayout {
            first_sn,
            from,
            max_seg,
        } = self.layout;
        data_in_segments(self.data.len() as u32 - from, max_seg, max_burst).map(move |mut s| {
            s.data_sn += first_sn;
            s.offset += from;
            s
        })
    }

    /// The Data-In count (the DataSN after the last).
    fn data_in_count(&self, max_burst: u32) -> u32 {
        self.layout.first_sn + self.segments(max_burst).count() as u32
    }
}

type SentReads = Arc<Mutex<HashMap<u32, SentRead>>>;

struct Shared {
    /// The initiator's MaxRecvDataSegmentLength: data PDUs are cut to it (a Text
    /// negotiation in full feature phase may change it).
    max_send: Arc<AtomicU32>,
    slots: Mutex<HashMap<u32, WriteSlot>>,
    sent_reads: SentReads,
    out: mpsc::Sender<Out>,
    next_ttt: AtomicU32,
    cfg: FfpConfig,
    /// Ends the connection's tasks (reader, writer, watcher).
    stop: Arc<watch::Sender<bool>>,
    peer: SocketAddr,
    /// Lent for read data when this connection sends data digests at a fixed cut.
    digest_buffers: Option<Arc<dyn storage::ReadBufSource>>,
}

impl Shared {
    fn alloc_ttt(&self) -> u32 {
        loop {
            let t = self.next_ttt.fetch_add(1, Ordering::Relaxed);
            if t != RESERVED_TAG {
                return t;
            }
        }
    }
}

enum Out {
    Pdu(Pdu),
    DataIn {
        task: TaskRef,
        data: Bytes,
        crcs: Option<Arc<digest::SegmentCrcs>>,
        status: Option<CollapsedStatus>,
    },
    /// A bidirectional command's read data, numbered from `first_data_sn`.
    BidiDataIn {
        task: TaskRef,
        data: Bytes,
        first_data_sn: u32,
    },
    R2ts {
        task: TaskRef,
        r2ts: Vec<R2tRequest>,
    },
    /// A Data SNACK's Data-In PDUs, DataSN `run`, as first sent (the read's data taken
    /// when the SNACK came, so an acknowledgement meanwhile cannot take it away).
    DataInAgain {
        read: SentRead,
        run: std::ops::Range<u32>,
    },
    /// A retained status PDU, its StatSN kept.
    StatusAgain(Pdu),
    /// An R-Data SNACK for read `itt`: its Data-In from the last DataACK on, cut anew,
    /// then its status carrying `snack_tag`.
    Resegment {
        itt: u32,
        snack_tag: u32,
    },
    Close,
}

/// The TCP implementation of [`Datamover`].
pub struct TcpDatamover {
    shared: Arc<Shared>,
}

impl TcpDatamover {
    pub fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    /// The Data-In PDUs `data` takes (for ExpDataSN).
    fn data_in_pdus(&self, data: &Bytes) -> u32 {
        data_in_segments(
            data.len() as u32,
            self.shared.max_send.load(Ordering::Relaxed),
            self.shared.cfg.max_burst_length,
        )
        .count() as u32
    }

    /// The read `itt` kept for SNACKs, unless its status was acknowledged (then the data
    /// is only waiting to be forgotten).
    fn kept_read(&self, itt: u32) -> Result<SentRead, DmError> {
        let not_kept = || DmError::NotRetained(format!("ITT 0x{itt:08x}: no data kept"));
        let read = {
            let reads = self.shared.sent_reads.lock().expect("sent reads");
            reads.get(&itt).cloned().ok_or_else(not_kept)?
        };
        if let Some(sn) = read.stat_sn {
            let status = self.shared.cfg.status.lock().expect("status");
            if status.retained(sn).is_none() {
                return Err(not_kept());
            }
        }
        Ok(read)
    }

    async fn enqueue(&self, out: Out) -> Result<(), DmError> {
        self.shared.out.send(out).await.map_err(|_| DmError::Closed)
    }
}

#[async_trait]
impl Datamover for TcpDatamover {
    async fn send_control(&self, pdu: Pdu) -> Result<(), DmError> {
        self.enqueue(Out::Pdu(pdu)).await
    }

    async fn put_data(
        &self,
        task: TaskRef,
        data: Bytes,
        note: Option<storage::BufNote>,
        status: Option<CollapsedStatus>,
    ) -> Result<u32, DmError> {
        // CRCs our digest buffers noted (another kind of note is not for this transport).
        let crcs = match note {
            Some(storage::BufNote::SegmentCrcs(crcs)) => Some(crcs),
            _ => None,
        };
        let n = self.data_in_pdus(&data);
        self.enqueue(Out::DataIn {
            task,
            data,
            crcs,
            status,
        })
        .await?;
        Ok(n)
    }

    async fn put_bidi_data(
        &self,
        task: TaskRef,
        data: Bytes,
        first_data_sn: u32,
    ) -> Result<u32, DmError> {
        let n = self.data_in_pdus(&data);
        self.enqueue(Out::BidiDataIn {
            task,
            data,
            first_data_sn,
        })
        .await?;
        Ok(n)
    }

    fn read_buffers(&self) -> Option<Arc<dyn storage::ReadBufSource>> {
        self.shared.digest_buffers.clone()
    }

    async fn get_data(&self, task: TaskRef, write: WriteHandle) -> Result<(Bytes, u32), DmError> {
        let held = {
            let mut slots = self.shared.slots.lock().expect("slots lock");
            let Some(slot) = slots.get_mut(&write.itt) else {
                return Err(DmError::Aborted);
            };
            if let Some(e) = slot.failed.take() {
                slots.remove(&write.itt);
                return Err(e);
            }
            slot.buf.len() as u32
        };
        // The rest of the data is reserved before it is asked for.
        let mut more = None;
        if held < write.expected_len {
            let cfg = &self.shared.cfg;
            let wanted = u64::from(write.expected_len - held);
            match cfg.budget.reserve(wanted, cfg.timeouts.budget_wait).await {
                Ok(r) => more = Some(r),
                Err(e) => {
                    self.abort_task(write.itt);
                    return Err(DmError::OverBudget(e.to_string()));
                }
            }
        }
        let (rx, r2ts) = {
            let mut slots = self.shared.slots.lock().expect("slots lock");
            // Aborted while it waited for memory: the reservation goes back as `more` drops.
            let Some(slot) = slots.get_mut(&write.itt) else {
                return Err(DmError::Aborted);
            };
            if let Some(more) = more {
                slot.reservation.merge(more);
                // A fresh zeroed buffer (its pages zeroed by the kernel when first touched)
                // and a copy of the unsolicited part, rather than zeroing the rest in place.
                let mut whole = BytesMut::zeroed(write.expected_len as usize);
                whole[..slot.buf.len()].copy_from_slice(&slot.buf);
                slot.buf = whole;
            }
            if slot.xfer.is_complete() {
                let slot = slots.remove(&write.itt).expect("present");
                let r2ts = slot.xfer.r2t_count();
                return Ok((slot.into_data(), r2ts));
            }
            slot.solicited = true;
            slot.progress = std::time::Instant::now();
            slot.data_seen = slot.progress;
            let r2ts = slot.xfer.next_r2ts(|| self.shared.alloc_ttt());
            let (tx, rx) = oneshot::channel();
            slot.waiter = Some(tx);
            (rx, r2ts)
        };
        if !r2ts.is_empty() {
            self.enqueue(Out::R2ts { task, r2ts }).await?;
        }
        rx.await.map_err(|_| DmError::Closed)?
    }

    async fn resend_data(&self, itt: u32, beg_run: u32, run_length: u32) -> Result<(), DmError> {
        let refused = |e: iscsi_session::erl1::SnackRefused| {
            DmError::NotRetained(format!("ITT 0x{itt:08x}: {e}"))
        };
        if self.shared.cfg.error_recovery_level == 0 {
            return Err(DmError::NotRetained("ErrorRecoveryLevel is 0".into()));
        }
        // A write still collecting data: its outstanding R2Ts.
        let r2ts = self
            .shared
            .slots
            .lock()
            .expect("slots lock")
            .get(&itt)
            .map(|slot| (slot.lun, slot.xfer.r2ts_to_resend(beg_run, run_length)));
        if let Some((lun, r2ts)) = r2ts {
            let r2ts = r2ts.map_err(refused)?;
            return self
                .enqueue(Out::R2ts {
                    task: TaskRef { itt, lun },
                    r2ts,
                })
                .await;
        }
        // A read: its Data-In PDUs.
        let read = self.kept_read(itt)?;
        let sent = read.data_in_count(self.shared.cfg.max_burst_length);
        let run: Vec<u32> = iscsi_session::erl1::snack_run(beg_run, run_length, read.acked, sent)
            .map_err(refused)?
            .collect();
        let run = run[0]..run[run.len() - 1] + 1;
        self.enqueue(Out::DataInAgain { read, run }).await
    }

    async fn resegment_data(&self, itt: u32, snack_tag: u32) -> Result<(), DmError> {
        if self.shared.cfg.error_recovery_level == 0 {
            return Err(DmError::NotRetained("ErrorRecoveryLevel is 0".into()));
        }
        self.kept_read(itt)?;
        self.enqueue(Out::Resegment { itt, snack_tag }).await
    }

    fn set_max_send_data_segment_length(&self, len: u32) {
        self.shared.max_send.store(len, Ordering::Relaxed);
    }

    fn data_acked(&self, ttt: u32, beg_run: u32) {
        // The acknowledgement request's tag is the read's ITT (`data_in_header`).
        let mut reads = self.shared.sent_reads.lock().expect("sent reads");
        if let Some(r) = reads.get_mut(&ttt) {
            if iscsi_wire::serial::sn_gt(beg_run, r.acked) {
                r.acked = beg_run;
            }
        }
    }

    fn status_acknowledged(&self) {
        if self.shared.cfg.error_recovery_level >= 1 {
            forget_acknowledged_reads(&self.shared.cfg, &self.shared.sent_reads);
        }
    }

    async fn resend_status(&self, pdu: Pdu) -> Result<(), DmError> {
        if self.shared.cfg.error_recovery_level == 0 {
            return Err(DmError::NotRetained("ErrorRecoveryLevel is 0".into()));
        }
        self.enqueue(Out::StatusAgain(pdu)).await
    }

    fn solicit_write(&self, task: TaskRef, expected_len: u32) -> Result<WriteHandle, DmError> {
        let cfg = &self.shared.cfg;
        if cfg.error_recovery_level < 2 {
            return Err(DmError::NotRetained("ErrorRecoveryLevel is below 2".into()));
        }
        if expected_len > cfg.max_write_len {
            return Err(DmError::NotRetained(format!(
                "write of {expected_len} bytes exceeds the {}-byte limit",
                cfg.max_write_len
            )));
        }
        let xfer = WriteTransfer::new(expected_len, 0, true, cfg.write_limits)
            .map_err(|e| DmError::NotRetained(e.to_string()))?
            .with_recovery();
        let reservation = cfg
            .budget
            .try_reserve(expected_len.into())
            .map_err(|e| DmError::NotRetained(e.to_string()))?;
        let slot = WriteSlot {
            failed: None,
            progress: std::time::Instant::now(),
            data_seen: std::time::Instant::now(),
            buf: BytesMut::zeroed(expected_len as usize),
            reservation,
            xfer,
            lun: task.lun,
            solicited: false,
            waiter: None,
        };
        let mut slots = self.shared.slots.lock().expect("slots lock");
        if slots.contains_key(&task.itt) {
            return Err(DmError::NotRetained(format!(
                "ITT 0x{:08x} already has a write in progress here",
                task.itt
            )));
        }
        slots.insert(task.itt, slot);
        Ok(WriteHandle {
            itt: task.itt,
            expected_len,
        })
    }

    fn abort_task(&self, itt: u32) {
        let slot = self.shared.slots.lock().expect("slots lock").remove(&itt);
        if let Some(WriteSlot {
            waiter: Some(w), ..
        }) = slot
        {
            let _ = w.send(Err(DmError::Aborted));
        }
    }

    fn close(&self) {
        if self.shared.out.try_send(Out::Close).is_err() {
            let _ = self.shared.stop.send(true);
        }
    }
}

impl Drop for TcpDatamover {
    fn drop(&mut self) {
        let _ = self.shared.stop.send(true);
    }
}

// ---------------------------------------------------------------------------------------
// Receive path

enum ReadEnd {
    Eof,
    Stopped,
    Error(String),
}

type Reader = FrameReader<Traced<OwnedReadHalf>>;

async fn run_reader(
    mut r: Reader,
    mut poll: SocketPoll,
    shared: Arc<Shared>,
    notices: mpsc::Sender<Notice>,
    mut stop: watch::Receiver<bool>,
) {
    let mut discarded_in_a_row = 0u32;
    let end = loop {
        match next_pdu(
            &mut r,
            &mut poll,
            &shared,
            &notices,
            &mut stop,
            &mut discarded_in_a_row,
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => break ReadEnd::Stopped,
            Err(e) => break e,
        }
    };
    let reason = match end {
        ReadEnd::Eof => "peer closed the connection".to_string(),
        ReadEnd::Stopped => "connection closed".to_string(),
        ReadEnd::Error(e) => e,
    };
    for (_, slot) in shared.slots.lock().expect("slots lock").drain() {
        if let Some(w) = slot.waiter {
            let _ = w.send(Err(DmError::Closed));
        }
    }
    let _ = notices.send(Notice::Closed(reason)).await;
}

/// Handle one PDU. Ok(false) when asked to stop. `discarded_in_a_row`: PDUs skipped for
/// header digest errors since the last sound one.
async fn next_pdu(
    r: &mut Reader,
    poll: &mut SocketPoll,
    shared: &Shared,
    notices: &mpsc::Sender<Notice>,
    stop: &mut watch::Receiver<bool>,
    discarded_in_a_row: &mut u32,
) -> Result<bool, ReadEnd> {
    let cfg = &shared.cfg;
    let max_data = cfg.max_recv_data_segment_length;
    let next = match poll.spin(r, cfg.digests, max_data).await {
        Ok(()) => tokio::select! {
            f = r.next_frame(cfg.digests, max_data) => f,
            _ = stop.changed() => return Ok(false),
        },
        Err(e) => Err(e),
    };
    let frame = match next {
        Ok(f) => {
            *discarded_in_a_row = 0;
            poll.busy();
            f
        }
        // ERL ≥ 1: the PDU is discarded by the length its header claims (bounded by
        // MaxRecvDataSegmentLength); the initiator's SNACK or timeout recovers it, and a
        // lost Data-Out shows as a DataSN gap. Several in a row mean the claimed length
        // was wrong too and the stream is lost: end the connection.
        Err(FrameError::HeaderDigest { claimed_len, .. })
            if cfg.error_recovery_level >= 1 && *discarded_in_a_row < MAX_DISCARDS_IN_A_ROW =>
        {
            *discarded_in_a_row += 1;
            tracing::warn!(peer = %shared.peer, "header digest error: PDU of {claimed_len} bytes discarded (ErrorRecoveryLevel 1)");
            RecoveryCounters::bump(&cfg.recovery.header_digest_discards);
            tokio::select! {
                d = r.discard(claimed_len) => d.map_err(|e| match e {
                    FrameError::Eof => ReadEnd::Eof,
                    e => ReadEnd::Error(e.to_string()),
                })?,
                _ = stop.changed() => return Ok(false),
            }
            return Ok(true);
        }
        Err(FrameError::Eof) => return Err(ReadEnd::Eof),
        Err(FrameError::Layout { head, err }) => {
            let why = format!("protocol error: {err}");
            report_reject(notices, reject::PROTOCOL_ERROR, head, why.clone()).await;
            return Err(ReadEnd::Error(why));
        }
        Err(e) => return Err(ReadEnd::Error(e.to_string())),
    };
    let bytes = r.take(&frame);
    let decoded = match Bhs::decode(&frame.head) {
        Ok(d) => d,
        Err(e) => {
            let reason = match e {
                WireError::UnknownOpcode(_) => reject::COMMAND_NOT_SUPPORTED,
                _ => reject::PROTOCOL_ERROR,
            };
            report_reject(notices, reason, frame.head, e.to_string()).await;
            return Ok(true);
        }
    };
    match decoded.bhs {
        Bhs::DataOut(d) => on_data_out(shared, notices, &frame, &bytes, d).await,
        Bhs::ScsiCommand(c) if c.write && c.expected_data_len > 0 => {
            on_write_command(shared, notices, &frame, &bytes, c).await
        }
        bhs => {
            if let Err(e) = frame.verify_data_digest(&bytes) {
                // A non-data PDU (a command with immediate data included) is discarded and
                // Rejected; the initiator retries it.
                return digest_error(shared, notices, &frame, e.to_string()).await;
            }
            let is_command = matches!(bhs, Bhs::ScsiCommand(_));
            let pdu = InPdu {
                pdu: frame.pdu(bhs, &bytes.freeze()),
                raw_bhs: frame.head,
            };
            let notice = if is_command {
                Notice::Command { pdu, write: None }
            } else {
                Notice::Control(pdu)
            };
            notices.send(notice).await.map_err(|_| ReadEnd::Stopped)?;
            Ok(true)
        }
    }
}

/// Copies `payload` into `dst`, with its CRC32C computed in the same pass when the frame
/// carries a data digest, and checks that digest (Err: what the mismatch was).
fn place(frame: &Frame, bytes: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let payload = &bytes[frame.data_range()];
    let crc = if frame.has_data_digest() {
        digest::copy_with_crc32c(dst, payload)
    } else {
        dst.copy_from_slice(payload);
        0
    };
    frame
        .check_data_digest(bytes, crc)
        .map_err(|e| e.to_string())
}

/// A PDU failed its data digest. ERL 0: the connection ends. ERL ≥ 1: the PDU is
/// discarded and answered with a Reject (reason 0x02); the caller recovers what it carried.
async fn digest_error(
    shared: &Shared,
    notices: &mpsc::Sender<Notice>,
    frame: &Frame,
    why: String,
) -> Result<bool, ReadEnd> {
    if shared.cfg.error_recovery_level == 0 {
        return Err(ReadEnd::Error(why));
    }
    RecoveryCounters::bump(&shared.cfg.recovery.data_digest_rejects);
    report_reject(notices, reject::DATA_DIGEST_ERROR, frame.head, why).await;
    Ok(true)
}

/// A Data-Out: checked against the task's transfer state and placed into its buffer; a
/// completed burst triggers the next R2Ts, a completed transfer wakes `get_data`.
async fn on_data_out(
    shared: &Shared,
    notices: &mpsc::Sender<Notice>,
    frame: &Frame,
    bytes: &[u8],
    d: DataOut,
) -> Result<bool, ReadEnd> {
    let data_len = frame.layout.data_len;
    let mut done = None;
    let mut more_r2ts = Vec::new();
    let mut lost = None;
    let mut task_lun = None;
    'locked: {
        let mut slots = shared.slots.lock().expect("slots lock");
        let Some(slot) = slots.get_mut(&d.itt) else {
            break 'locked; // an unknown task: handled below, without the lock
        };
        if slot.failed.is_some() {
            return Ok(true);
        }
        task_lun = Some(slot.lun);
        slot.progress = std::time::Instant::now();
        slot.data_seen = slot.progress;
        if let Err(e) = slot
            .xfer
            .on_data_out(d.ttt, d.data_sn, d.buffer_offset, data_len, d.final_)
        {
            // ERL 0 without dropping the session: the command Rejects this PDU and fails.
            let failed = DmError::DataPhase {
                why: format!("Data-Out for ITT 0x{:08x}: {e}", d.itt),
                raw_bhs: frame.head,
            };
            match slot.waiter.take() {
                Some(w) => {
                    slots.remove(&d.itt);
                    let _ = w.send(Err(failed));
                }
                None => slot.failed = Some(failed),
            }
            return Ok(true);
        }
        if let Err(why) = slot.place(frame, bytes, d.buffer_offset) {
            // ERL ≥ 1: the range is asked for again (recovery R2T) once the sequence allows.
            slot.xfer
                .payload_lost(d.buffer_offset, data_len)
                .map_err(|_| ReadEnd::Error(why.clone()))?;
            lost = Some(why);
        }
        if slot.solicited {
            if d.final_ || lost.is_some() {
                let before = slot.xfer.recovery_r2t_count();
                more_r2ts = slot.xfer.next_r2ts(|| shared.alloc_ttt());
                let recovery_r2ts = slot.xfer.recovery_r2t_count() - before;
                RecoveryCounters::add(&shared.cfg.recovery.recovery_r2ts, recovery_r2ts.into());
            }
            if slot.xfer.is_complete() {
                done = slots.remove(&d.itt);
            }
        }
    }
    let Some(task_lun) = task_lun else {
        // Data for a task that was aborted or never existed: discard.
        if let Err(e) = frame.verify_data_digest(bytes) {
            return digest_error(shared, notices, frame, e.to_string()).await;
        }
        tracing::debug!(peer = %shared.peer, itt = d.itt, "discarding Data-Out for unknown task");
        return Ok(true);
    };
    if let Some(why) = lost {
        // The Reject is a status the iSCSI layer numbers and sends; the recovery R2T goes
        // straight to the writer: they may reach the wire in either order.
        digest_error(shared, notices, frame, why).await?;
    }
    if !more_r2ts.is_empty() {
        let task = TaskRef {
            itt: d.itt,
            lun: task_lun,
        };
        let _ = shared
            .out
            .send(Out::R2ts {
                task,
                r2ts: more_r2ts,
            })
            .await;
    }
    if let Some(mut slot) = done {
        if let Some(w) = slot.waiter.take() {
            let count = slot.xfer.r2t_count();
            let _ = w.send(Ok((slot.into_data(), count)));
        }
    }
    Ok(true)
}

/// How long a solicited write may go without Data-Out before what it lacks is asked for
/// again (ErrorRecoveryLevel ≥ 1: its last Data-Out may have been discarded for a header
/// digest error, and nothing else would show it).
const SEQUENCE_RECEPTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Once a second: a solicited write without Data-Out for the data-out timeout ends the
/// connection (a peer cannot hold a write's buffer, its task and its window slot by never
/// sending the data); at ERL ≥ 1, before that, one without Data-Out for the sequence
/// reception timeout has its missing ranges asked for again with recovery R2Ts.
async fn watch_sequences(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let data_out_timeout = shared.cfg.timeouts.data_out;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let mut due = Vec::new();
        {
            let mut slots = shared.slots.lock().expect("slots lock");
            let starved = slots.iter().find(|(_, slot)| {
                slot.solicited
                    && slot.failed.is_none()
                    && slot.data_seen.elapsed() >= data_out_timeout
            });
            if let Some((itt, _)) = starved {
                tracing::warn!(peer = %shared.peer, "write ITT 0x{itt:08x} got none of the data it asked for in {} s: closing the connection", data_out_timeout.as_secs());
                let _ = shared.stop.send(true);
                return;
            }
            if shared.cfg.error_recovery_level == 0 {
                continue;
            }
            for (itt, slot) in slots.iter_mut() {
                if !slot.solicited
                    || slot.failed.is_some()
                    || slot.progress.elapsed() < SEQUENCE_RECEPTION_TIMEOUT
                    || !slot.xfer.sequence_timeout()
                {
                    continue;
                }
                slot.progress = std::time::Instant::now();
                let r2ts = slot.xfer.next_r2ts(|| shared.alloc_ttt());
                RecoveryCounters::add(&shared.cfg.recovery.recovery_r2ts, r2ts.len() as u64);
                let task = TaskRef {
                    itt: *itt,
                    lun: slot.lun,
                };
                due.push(Out::R2ts { task, r2ts });
            }
        }
        for out in due {
            tracing::warn!(peer = %shared.peer, "no Data-Out for {} s: what is missing is asked for again (recovery R2T)", SEQUENCE_RECEPTION_TIMEOUT.as_secs());
            if shared.out.send(out).await.is_err() {
                return;
            }
        }
    }
}

/// A SCSI Command with write data: its buffer and transfer state exist (immediate data
/// placed) before the next PDU is read, so the Data-Outs that follow find them.
async fn on_write_command(
    shared: &Shared,
    notices: &mpsc::Sender<Notice>,
    frame: &Frame,
    bytes: &[u8],
    c: ScsiCommand,
) -> Result<bool, ReadEnd> {
    let cfg = &shared.cfg;
    let data_len = frame.layout.data_len;
    if c.expected_data_len > cfg.max_write_len {
        return Err(ReadEnd::Error(format!(
            "write of {} bytes exceeds the {}-byte limit",
            c.expected_data_len, cfg.max_write_len
        )));
    }
    let mut xfer = WriteTransfer::new(c.expected_data_len, data_len, c.final_, cfg.write_limits)
        .map_err(|e| ReadEnd::Error(format!("SCSI Command ITT 0x{:08x}: {e}", c.itt)))?;
    if cfg.error_recovery_level >= 1 {
        xfer = xfer.with_recovery();
    }
    // Only what the initiator may send unasked (immediate and unsolicited data, at most
    // FirstBurstLength) is held now; the rest is reserved when the command runs and asks
    // for it, so a flood of commands announcing large writes costs what they carry.
    let unasked = xfer.unrequested_from();
    let (buf, reservation, failed) = match cfg.budget.try_reserve(unasked.into()) {
        Ok(r) => (BytesMut::zeroed(unasked as usize), r, None),
        Err(e) => (
            BytesMut::new(),
            Reservation::none(),
            Some(DmError::OverBudget(e.to_string())),
        ),
    };
    let mut slot = WriteSlot {
        failed,
        progress: std::time::Instant::now(),
        data_seen: std::time::Instant::now(),
        buf,
        reservation,
        xfer,
        lun: c.lun,
        solicited: false,
        waiter: None,
    };
    if let Err(why) = slot.place(frame, bytes, 0) {
        // The command is discarded with its immediate data; the initiator retries it.
        return digest_error(shared, notices, frame, why).await;
    }
    let ahs = Bytes::copy_from_slice(&bytes[frame.ahs_range()]);
    let (itt, expected_len) = (c.itt, c.expected_data_len);
    if shared
        .slots
        .lock()
        .expect("slots lock")
        .insert(itt, slot)
        .is_some()
    {
        return Err(ReadEnd::Error(format!(
            "ITT 0x{itt:08x} reused while its write is in progress"
        )));
    }
    let pdu = InPdu {
        pdu: Pdu {
            bhs: Bhs::ScsiCommand(c),
            ahs,
            data: Bytes::new(),
        },
        raw_bhs: frame.head,
    };
    let write = Some(WriteHandle { itt, expected_len });
    notices
        .send(Notice::Command { pdu, write })
        .await
        .map_err(|_| ReadEnd::Stopped)?;
    Ok(true)
}

/// Forgets the kept reads whose status is no longer retained (acknowledged, or dropped).
/// Retained statuses are every StatSN from the oldest kept on (acknowledgement and the
/// retention cap both drop from the front), so one comparison tells.
fn forget_acknowledged_reads(cfg: &FfpConfig, sent_reads: &SentReads) {
    let first_retained = cfg.status.lock().expect("status").first_retained();
    let mut reads = sent_reads.lock().expect("sent reads");
    reads.retain(|_, r| r.stat_sn.is_none_or(|sn| !sn_lt(sn, first_retained)));
}

/// Reports a refused PDU; the iSCSI layer answers it with a Reject (it numbers status).
async fn report_reject(
    notices: &mpsc::Sender<Notice>,
    reason: u8,
    raw_bhs: [u8; BHS_LEN],
    why: String,
) {
    let _ = notices
        .send(Notice::Reject {
            reason,
            raw_bhs,
            why,
        })
        .await;
}

// ---------------------------------------------------------------------------------------
// Send path

struct Writer {
    cfg: FfpConfig,
    sn: Arc<CmdSnState>,
    /// Read data kept for Data SNACK (ErrorRecoveryLevel ≥ 1 only).
    sent_reads: SentReads,
    /// The initiator's MaxRecvDataSegmentLength as of now (`Shared::max_send`).
    max_send: Arc<AtomicU32>,
    peer: SocketAddr,
    /// Ends the whole connection when the peer stops taking what is sent.
    stop_all: Arc<watch::Sender<bool>>,
}

impl Writer {
    async fn run(
        mut self,
        mut w: Traced<OwnedWriteHalf>,
        mut rx: mpsc::Receiver<Out>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut queued = Vec::with_capacity(WRITE_BATCH);
        let mut batch = PduBatch::default();
        loop {
            let got = tokio::select! {
                n = rx.recv_many(&mut queued, WRITE_BATCH) => n,
                _ = stop.changed() => break,
            };
            if got == 0 {
                break;
            }
            batch.clear();
            let mut close = false;
            for m in queued.drain(..) {
                match m {
                    Out::Pdu(mut p) => {
                        if let Bhs::ScsiResponse(r) = &mut p.bhs {
                            self.status_sent_for(r);
                        }
                        self.push(p.bhs, &p.ahs, p.data, None, &mut batch)
                    }
                    Out::Resegment { itt, snack_tag } => {
                        self.push_resegmented(itt, snack_tag, &mut batch)
                    }
                    Out::StatusAgain(p) => self.push_again(p, &mut batch),
                    Out::DataInAgain { read, run } => {
                        self.push_data_in_again(&read, run, &mut batch)
                    }
                    Out::DataIn {
                        task,
                        data,
                        crcs,
                        status,
                    } => self.push_data_in(task, data, crcs, status, &mut batch),
                    Out::BidiDataIn {
                        task,
                        data,
                        first_data_sn,
                    } => self.push_bidi_data_in(task, data, first_data_sn, &mut batch),
                    Out::R2ts { task, r2ts } => {
                        for r in r2ts {
                            let bhs = Bhs::R2t(R2t {
                                lun: task.lun,
                                itt: task.itt,
                                ttt: r.ttt,
                                r2t_sn: r.r2t_sn,
                                buffer_offset: r.offset,
                                desired_len: r.len,
                                ..Default::default()
                            });
                            self.push(bhs, &[], Bytes::new(), None, &mut batch);
                        }
                    }
                    Out::Close => {
                        close = true;
                        break;
                    }
                }
            }
            let stall = self.cfg.timeouts.send_stall;
            let result = tokio::select! {
                r = batch.write_to_within(&mut w, stall) => r,
                _ = stop.changed() => break,
            };
            if let Err(e) = result {
                if e.kind() == io::ErrorKind::TimedOut {
                    // Whatever it keeps sending, a peer that takes nothing would hold the
                    // session's answers (and the memory behind them) forever.
                    tracing::warn!(peer = %self.peer, "the peer took none of what was sent for {} s: closing the connection", stall.as_secs());
                    let _ = self.stop_all.send(true);
                } else {
                    tracing::debug!("write failed: {e}");
                }
                break;
            }
            if close {
                break;
            }
        }
        let _ = w.shutdown().await;
    }

    /// Stamps the PDU as it goes on the wire, so every number is in wire order: a status
    /// takes the next StatSN from the connection's numbering (which keeps it, as the PDU to
    /// resend, until acknowledged), a PDU without status carries the next StatSN, and both
    /// carry ExpCmdSN/MaxCmdSN as of now. Then encodes it. `data_crc`: the CRC32C of `data`
    /// when the producer already computed it.
    fn push(
        &mut self,
        mut bhs: Bhs,
        ahs: &[u8],
        data: Bytes,
        data_crc: Option<u32>,
        batch: &mut PduBatch,
    ) {
        let (exp, max) = self.sn.load();
        {
            let mut status = self.cfg.status.lock().expect("status numbering");
            bhs.set_target_sns(status.next(), exp, max);
            if bhs.advances_stat_sn() {
                status.assign(status_to_keep(&bhs, &data, &self.cfg.budget));
            }
        }
        batch.push(&bhs, ahs, data, self.cfg.digests, data_crc);
    }

    fn push_data_in(
        &mut self,
        task: TaskRef,
        data: Bytes,
        crcs: Option<Arc<digest::SegmentCrcs>>,
        status: Option<CollapsedStatus>,
        batch: &mut PduBatch,
    ) {
        let ack = self.cfg.error_recovery_level >= 1;
        self.push_data_in_segments(task, &data, 0, crcs.as_deref(), status, ack, batch);
        if self.cfg.error_recovery_level >= 1 {
            // Kept for Data SNACK until the status is acknowledged; with status in the last
            // Data-In, that status took the StatSN just before the next one.
            let stat_sn = status.map(|_| {
                let next = self.cfg.status.lock().expect("status").next();
                next.wrapping_sub(1)
            });
            let max_seg = self.max_send();
            self.keep_read(SentRead {
                task,
                data,
                crcs,
                status,
                stat_sn,
                acked: 0,
                layout: ReadLayout {
                    first_sn: 0,
                    from: 0,
                    max_seg,
                },
                snack_tag: None,
            });
        }
    }

    /// A bidirectional command's Data-In, numbered after its R2Ts. (Not kept for Data SNACK:
    /// a resend would number them from 0.)
    fn push_bidi_data_in(
        &mut self,
        task: TaskRef,
        data: Bytes,
        first_data_sn: u32,
        batch: &mut PduBatch,
    ) {
        self.push_data_in_segments(task, &data, first_data_sn, None, None, false, batch);
    }

    /// `data` cut into Data-In PDUs numbered from `first_data_sn`, the last one carrying
    /// `status` when there is one; with `ack`, the last of each sequence asks for a DataACK.
    #[allow(clippy::too_many_arguments)]
    fn push_data_in_segments(
        &mut self,
        task: TaskRef,
        data: &Bytes,
        first_data_sn: u32,
        crcs: Option<&digest::SegmentCrcs>,
        status: Option<CollapsedStatus>,
        ack: bool,
        batch: &mut PduBatch,
    ) {
        let segs = data_in_segments(
            data.len() as u32,
            self.max_send(),
            self.cfg.max_burst_length,
        );
        for mut s in segs {
            s.data_sn += first_data_sn;
            let d = data_in_header(task, &s, status, ack);
            let payload = data.slice(s.offset as usize..(s.offset + s.len) as usize);
            let crc = crcs.and_then(|c| c.get(s.offset, s.len, data.len() as u32));
            self.push(Bhs::DataIn(d), &[], payload, crc, batch);
        }
    }

    /// Keeps a read's data for Data SNACK, and forgets those whose status the initiator
    /// has acknowledged since.
    fn keep_read(&mut self, read: SentRead) {
        forget_acknowledged_reads(&self.cfg, &self.sent_reads);
        self.sent_reads
            .lock()
            .expect("sent reads")
            .insert(read.task.itt, read);
    }

    fn max_send(&self) -> u32 {
        self.max_send.load(Ordering::Relaxed)
    }

    /// A SCSI Response is about to take the next StatSN: a read's kept data now lives
    /// until that status is acknowledged. A read resent for an R-Data SNACK has its status
    /// carry the SNACK's tag and count the Data-In as now numbered.
    fn status_sent_for(&mut self, rsp: &mut iscsi_wire::ScsiResponse) {
        if self.cfg.error_recovery_level == 0 {
            return;
        }
        let next = self.cfg.status.lock().expect("status").next();
        if let Some(r) = self
            .sent_reads
            .lock()
            .expect("sent reads")
            .get_mut(&rsp.itt)
        {
            r.stat_sn = Some(next);
            if let Some(tag) = r.snack_tag {
                rsp.snack_tag = tag;
                rsp.exp_data_sn = r.data_in_count(self.cfg.max_burst_length);
            }
        }
    }

    /// An R-Data SNACK: the read's Data-In from the last DataACK on, cut for the current
    /// MaxRecvDataSegmentLength and numbered from that DataACK, then (when the status was
    /// sent) the status again as a SCSI Response with the SNACK's tag and its StatSN. A
    /// status not yet sent will carry the tag ([`Writer::status_sent_for`]).
    fn push_resegmented(&mut self, itt: u32, snack_tag: u32, batch: &mut PduBatch) {
        let burst = self.cfg.max_burst_length;
        let read = {
            let mut reads = self.sent_reads.lock().expect("sent reads");
            let Some(r) = reads.get_mut(&itt) else {
                return; // its status was acknowledged meanwhile: nothing is owed
            };
            let from = r
                .segments(burst)
                .find(|s| s.data_sn == r.acked)
                .map_or(r.data.len() as u32, |s| s.offset);
            r.layout = ReadLayout {
                first_sn: r.acked,
                from,
                max_seg: self.max_send(),
            };
            // The status goes in a SCSI Response of its own from now on.
            r.status = None;
            r.snack_tag = Some(snack_tag);
            r.clone()
        };
        let end = read.data_in_count(burst);
        self.push_data_in_again(&read, read.acked..end, batch);
        let Some(stat_sn) = read.stat_sn else {
            return;
        };
        let again = {
            let mut status = self.cfg.status.lock().expect("status");
            status.retained_mut(stat_sn).and_then(|kept| {
                let Bhs::ScsiResponse(r) = &mut kept.bhs else {
                    return None;
                };
                r.snack_tag = snack_tag;
                r.exp_data_sn = end;
                Some(kept.clone())
            })
        };
        if let Some(pdu) = again {
            self.push_again(pdu, batch);
        }
    }

    /// A retained status again: its StatSN as first sent, the window as of now.
    fn push_again(&mut self, mut pdu: Pdu, batch: &mut PduBatch) {
        let (exp, max) = self.sn.load();
        if let Some(stat_sn) = pdu.bhs.stat_sn() {
            pdu.bhs.set_target_sns(stat_sn, exp, max);
        }
        batch.push(&pdu.bhs, &pdu.ahs, pdu.data, self.cfg.digests, None);
    }

    /// A Data SNACK's Data-In PDUs again, as first sent (a status in the last one keeps its
    /// StatSN).
    fn push_data_in_again(
        &mut self,
        read: &SentRead,
        run: std::ops::Range<u32>,
        batch: &mut PduBatch,
    ) {
        let (exp, max) = self.sn.load();
        let next_stat_sn = self.cfg.status.lock().expect("status").next();
        let segs = read.segments(self.cfg.max_burst_length);
        for s in segs.filter(|s| run.contains(&s.data_sn)) {
            let mut bhs = Bhs::DataIn(data_in_header(read.task, &s, read.status, true));
            let stat_sn = match (s.last, read.stat_sn) {
                (true, Some(sn)) if read.status.is_some() => sn,
                _ => next_stat_sn,
            };
            bhs.set_target_sns(stat_sn, exp, max);
            let payload = read
                .data
                .slice(s.offset as usize..(s.offset + s.len) as usize);
            let crc = read
                .crcs
                .as_ref()
                .and_then(|c| c.get(s.offset, s.len, read.data.len() as u32));
            batch.push(&bhs, &[], payload, self.cfg.digests, crc);
        }
    }
}

/// The header of one Data-In segment (the SNs are stamped when sent); the last segment
/// carries collapsed status when there is one. With `ack` (ErrorRecoveryLevel ≥ 1) the last
/// Data-In of each sequence without status asks for a DataACK (the A bit, with the read's
/// ITT as its tag), so the initiator says what it has.
fn data_in_header(
    task: TaskRef,
    s: &iscsi_session::DataSegment,
    status: Option<CollapsedStatus>,
    ack: bool,
) -> DataIn {
    let mut d = DataIn {
        final_: s.final_,
        lun: task.lun,
        itt: task.itt,
        ttt: RESERVED_TAG,
        data_sn: s.data_sn,
        buffer_offset: s.offset,
        ..Default::default()
    };
    if s.last {
        if let Some(st) = status {
            d.final_ = true;
            d.status_present = true;
            d.status = st.status;
            d.overflow = st.overflow;
            d.underflow = st.underflow;
            d.residual = st.residual;
        }
    }
    if ack && d.final_ && !d.status_present {
        d.ack = true;
        d.ttt = task.itt;
    }
    d
}

/// What is kept of a status for resending: the PDU itself, or for status collapsed into
/// Data-In, the SCSI Response that says the same. Its ExpDataSN counts the Data-In sent (the
/// collapsed one was the last): an initiator that lost that Data-In with its status learns
/// from it that data is missing too, and asks for it with a Data SNACK.
fn status_to_keep(bhs: &Bhs, data: &Bytes, budget: &Arc<Budget>) -> Pdu {
    match bhs {
        Bhs::DataIn(d) => Pdu::new(
            Bhs::ScsiResponse(iscsi_wire::ScsiResponse {
                overflow: d.overflow,
                underflow: d.underflow,
                status: d.status,
                itt: d.itt,
                stat_sn: d.stat_sn,
                exp_cmd_sn: d.exp_cmd_sn,
                max_cmd_sn: d.max_cmd_sn,
                residual: d.residual,
                exp_data_sn: d.data_sn.wrapping_add(1),
                ..Default::default()
            }),
            Bytes::new(),
        ),
        other => Pdu::new(other.clone(), kept_status_data(data, budget)),
    }
}

/// Status data up to this size is kept without being counted, as the header is: sense
/// data, a Reject's header. 1,024 kept statuses hold at most 256 KiB of it.
const UNCOUNTED_STATUS_DATA: usize = 256;

/// What a status kept until acknowledged holds of its data: its own copy (`data` may be a
/// slice of a whole receive buffer: a NOP-In echoes its ping's data), beyond
/// [`UNCOUNTED_STATUS_DATA`] counted in the connection's budget. With no room, none: a
/// status SNACK then resends the status without it (a NOP-In without its echo), rather
/// than the target holding more for a peer that does not acknowledge.
fn kept_status_data(data: &Bytes, budget: &Arc<Budget>) -> Bytes {
    if data.len() <= UNCOUNTED_STATUS_DATA {
        return Bytes::copy_from_slice(data);
    }
    match budget.try_reserve(data.len() as u64) {
        Ok(held) => held.travel_with(data.to_vec()),
        Err(_) => Bytes::new(),
    }
}
