//! The target's side of iSCSI/TCP: a portal that accepts connections, the login channel,
//! and in full feature phase one reader task and one writer task per connection.
//!
//! Receive path: the [`FrameReader`] reads in large chunks; each frame's header digest is
//! checked there, and a Data-Out payload (or a command's immediate data) is copied straight
//! into the task's write buffer with the CRC32C computed in the same pass. Send path:
//! queued PDUs are stamped (StatSN, ExpCmdSN, MaxCmdSN), read data is cut into Data-In
//! PDUs, and a [`PduBatch`] goes out in one vectored write whose payload slices reference
//! the backend's buffers (no copy). With a trace, the socket is wrapped in [`Traced`].

use crate::frame::{Frame, FrameError, FrameReader, PduBatch};
use crate::socket::PduSocket;
use crate::trace::Traced;
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use datamover::login_pdu::LOGIN_MAX_DATA;
use datamover::{
    CmdSnState, CollapsedStatus, Datamover, DmError, FfpConfig, InPdu, LoginChannel,
    LoginRecvError, Notice, Portal, TaskRef, TransportKind, WriteHandle,
};
use iscsi_session::{data_in_segments, R2tRequest, WriteTransfer};
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
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

const READ_CHUNK: usize = 256 * 1024;
const OUT_QUEUE: usize = 1024;
const NOTICE_QUEUE: usize = 256;
const WRITE_BATCH: usize = 64;

/// An iSCSI/TCP portal: a listening socket.
pub struct TcpPortal {
    listener: TcpListener,
    local: SocketAddr,
}

impl TcpPortal {
    pub async fn bind(addr: SocketAddr) -> io::Result<TcpPortal> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok(TcpPortal { listener, local })
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
        Ok(Box::new(TcpConnection::new(stream, trace)?))
    }
}

/// An accepted connection before full feature phase: plain PDU exchange for login.
pub struct TcpConnection {
    socket: PduSocket,
    peer: SocketAddr,
}

impl TcpConnection {
    /// Wraps an accepted socket; with `trace`, its bytes are recorded from now on.
    pub fn new(stream: TcpStream, trace: Option<&PduTrace>) -> io::Result<TcpConnection> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        Ok(TcpConnection {
            socket: PduSocket::new(stream, trace, Side::Accepted, READ_CHUNK),
            peer,
        })
    }

    /// Enters full feature phase: spawns the reader and writer tasks.
    pub fn into_full_feature(
        self,
        cfg: FfpConfig,
        sn: Arc<CmdSnState>,
    ) -> (Arc<TcpDatamover>, mpsc::Receiver<Notice>) {
        let (reader, write) = self.socket.into_split();
        let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE);
        let (notice_tx, notice_rx) = mpsc::channel(NOTICE_QUEUE);
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            slots: Mutex::new(HashMap::new()),
            out: out_tx,
            next_ttt: AtomicU32::new(1),
            cfg: cfg.clone(),
            stop: stop_tx,
            peer: self.peer,
            digest_buffers: crate::digest_buf::DigestBuffers::for_connection(&cfg)
                .map(|b| Arc::new(b) as Arc<dyn storage::ReadBufSource>),
        });
        let writer = Writer { cfg, sn };
        tokio::spawn(writer.run(write, out_rx, stop_rx.clone()));
        tokio::spawn(run_reader(reader, shared.clone(), notice_tx, stop_rx));
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
    /// Set when a Data-Out broke the rules: later Data-Outs are discarded.
    failed: Option<DmError>,
    buf: BytesMut,
    xfer: WriteTransfer,
    lun: u64,
    solicited: bool,
    waiter: Option<oneshot::Sender<Result<(Bytes, u32), DmError>>>,
}

struct Shared {
    slots: Mutex<HashMap<u32, WriteSlot>>,
    out: mpsc::Sender<Out>,
    next_ttt: AtomicU32,
    cfg: FfpConfig,
    stop: watch::Sender<bool>,
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
    R2ts {
        task: TaskRef,
        r2ts: Vec<R2tRequest>,
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
        // CRCs noted by one of our digest buffers, at our cut (others are not ours).
        let crcs = note.and_then(|n| n.0.downcast::<digest::SegmentCrcs>().ok());
        let cfg = &self.shared.cfg;
        let n = data_in_segments(
            data.len() as u32,
            cfg.max_send_data_segment_length,
            cfg.max_burst_length,
        )
        .count();
        self.enqueue(Out::DataIn {
            task,
            data,
            crcs,
            status,
        })
        .await?;
        Ok(n as u32)
    }

    fn read_buffers(&self) -> Option<Arc<dyn storage::ReadBufSource>> {
        self.shared.digest_buffers.clone()
    }

    async fn get_data(&self, task: TaskRef, write: WriteHandle) -> Result<(Bytes, u32), DmError> {
        let (rx, r2ts) = {
            let mut slots = self.shared.slots.lock().expect("slots lock");
            let Some(slot) = slots.get_mut(&write.itt) else {
                return Err(DmError::Aborted);
            };
            if let Some(e) = slot.failed.take() {
                slots.remove(&write.itt);
                return Err(e);
            }
            if slot.xfer.is_complete() {
                let slot = slots.remove(&write.itt).expect("present");
                return Ok((slot.buf.freeze(), slot.xfer.r2t_count()));
            }
            slot.solicited = true;
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
    shared: Arc<Shared>,
    notices: mpsc::Sender<Notice>,
    mut stop: watch::Receiver<bool>,
) {
    let end = loop {
        match next_pdu(&mut r, &shared, &notices, &mut stop).await {
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

/// Handle one PDU. Ok(false) when asked to stop.
async fn next_pdu(
    r: &mut Reader,
    shared: &Shared,
    notices: &mpsc::Sender<Notice>,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, ReadEnd> {
    let cfg = &shared.cfg;
    let next = tokio::select! {
        f = r.next_frame(cfg.digests, cfg.max_recv_data_segment_length) => f,
        _ = stop.changed() => return Ok(false),
    };
    let frame = match next {
        Ok(f) => f,
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
        Bhs::DataOut(d) => on_data_out(shared, &frame, &bytes, d).await,
        Bhs::ScsiCommand(c) if c.write && c.expected_data_len > 0 => {
            on_write_command(shared, notices, &frame, &bytes, c).await
        }
        bhs => {
            frame
                .verify_data_digest(&bytes)
                .map_err(|e| ReadEnd::Error(e.to_string()))?;
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
/// carries a data digest, and checks that digest.
fn place(frame: &Frame, bytes: &[u8], dst: &mut [u8]) -> Result<(), ReadEnd> {
    let payload = &bytes[frame.data_range()];
    let crc = if frame.has_data_digest() {
        digest::copy_with_crc32c(dst, payload)
    } else {
        dst.copy_from_slice(payload);
        0
    };
    frame
        .check_data_digest(bytes, crc)
        .map_err(|e| ReadEnd::Error(e.to_string()))
}

/// A Data-Out: checked against the task's transfer state and placed into its buffer; a
/// completed burst triggers the next R2Ts, a completed transfer wakes `get_data`.
async fn on_data_out(
    shared: &Shared,
    frame: &Frame,
    bytes: &[u8],
    d: DataOut,
) -> Result<bool, ReadEnd> {
    let data_len = frame.layout.data_len;
    let mut done = None;
    let mut more_r2ts = Vec::new();
    let task_lun;
    {
        let mut slots = shared.slots.lock().expect("slots lock");
        let Some(slot) = slots.get_mut(&d.itt) else {
            // Data for a task that was aborted or never existed: discard.
            frame
                .verify_data_digest(bytes)
                .map_err(|e| ReadEnd::Error(e.to_string()))?;
            tracing::debug!(peer = %shared.peer, itt = d.itt, "discarding Data-Out for unknown task");
            return Ok(true);
        };
        if slot.failed.is_some() {
            return Ok(true);
        }
        task_lun = slot.lun;
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
        let off = d.buffer_offset as usize;
        place(frame, bytes, &mut slot.buf[off..off + data_len as usize])?;
        if slot.solicited {
            if d.final_ {
                more_r2ts = slot.xfer.next_r2ts(|| shared.alloc_ttt());
            }
            if slot.xfer.is_complete() {
                done = slots.remove(&d.itt);
            }
        }
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
            let _ = w.send(Ok((slot.buf.freeze(), count)));
        }
    }
    Ok(true)
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
    let xfer = WriteTransfer::new(c.expected_data_len, data_len, c.final_, cfg.write_limits)
        .map_err(|e| ReadEnd::Error(format!("SCSI Command ITT 0x{:08x}: {e}", c.itt)))?;
    let mut buf = BytesMut::zeroed(c.expected_data_len as usize);
    place(frame, bytes, &mut buf[..data_len as usize])?;
    let ahs = Bytes::copy_from_slice(&bytes[frame.ahs_range()]);
    let (itt, lun, expected_len) = (c.itt, c.lun, c.expected_data_len);
    let slot = WriteSlot {
        failed: None,
        buf,
        xfer,
        lun,
        solicited: false,
        waiter: None,
    };
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
                    Out::Pdu(p) => self.push(p.bhs, &p.ahs, p.data, None, &mut batch),
                    Out::DataIn {
                        task,
                        data,
                        crcs,
                        status,
                    } => self.push_data_in(task, data, crcs, status, &mut batch),
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
            let result = tokio::select! {
                r = batch.write_to(&mut w) => r,
                _ = stop.changed() => break,
            };
            if let Err(e) = result {
                tracing::debug!("write failed: {e}");
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
                status.assign(status_to_keep(&bhs, &data));
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
        let segs = data_in_segments(
            data.len() as u32,
            self.cfg.max_send_data_segment_length,
            self.cfg.max_burst_length,
        );
        for s in segs {
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
            let payload = data.slice(s.offset as usize..(s.offset + s.len) as usize);
            let crc = crcs.as_ref().and_then(|c| c.get(s.offset, s.len));
            self.push(Bhs::DataIn(d), &[], payload, crc, batch);
        }
    }
}

/// What is kept of a status for resending: the PDU itself, or for status collapsed into
/// Data-In, the SCSI Response that says the same.
fn status_to_keep(bhs: &Bhs, data: &Bytes) -> Pdu {
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
                ..Default::default()
            }),
            Bytes::new(),
        ),
        other => Pdu::new(other.clone(), data.clone()),
    }
}
