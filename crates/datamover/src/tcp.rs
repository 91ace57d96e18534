//! The TCP datamover: one reader task and one writer task per connection.
//!
//! Receive path: bytes are read in large chunks into a receive buffer; each PDU is framed
//! with `iscsi_wire::FrameLayout`, its header digest checked, and a Data-Out payload (or a
//! command's immediate data) is copied straight into the task's write buffer with the
//! CRC32C computed in the same pass. Send path: queued PDUs are stamped (StatSN,
//! ExpCmdSN, MaxCmdSN), read data is cut into Data-In PDUs, and a batch goes out in one
//! vectored write whose payload slices reference the backend's buffers (no copy).
//! With a [`PduTrace`] attached ([`TcpConnection::trace`]), every byte read from and written
//! to the socket is also recorded, in order, into a pcapng file that tshark and
//! `ironsan analyze` decode.

use crate::{CmdSnState, CollapsedStatus, Datamover, DmError, InPdu, Notice, TaskRef, WriteHandle};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use iscsi_session::{data_in_segments, R2tRequest, WriteLimits, WriteTransfer};
use iscsi_wire::{
    reject, Bhs, DataIn, Digests, FrameLayout, Pdu, R2t, Reject, WireError, BHS_LEN, RESERVED_TAG,
};
use pcap_trace::{PduTrace, Side, TraceConnection};
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

const READ_CHUNK: usize = 256 * 1024;
const OUT_QUEUE: usize = 1024;
const NOTICE_QUEUE: usize = 256;
const MAX_IOVECS: usize = 512;
/// Login PDUs larger than this are refused (RFC default MaxRecvDataSegmentLength is 8 KiB;
/// continuation handles longer text).
pub const LOGIN_MAX_DATA: u32 = 64 * 1024;

/// A connection before full feature phase: plain PDU exchange for login.
pub struct TcpConnection {
    stream: TcpStream,
    rbuf: BytesMut,
    peer: SocketAddr,
    trace: Option<Arc<TraceConnection>>,
}

/// Parameters of a connection in full feature phase.
#[derive(Debug, Clone)]
pub struct FfpConfig {
    pub digests: Digests,
    /// Largest data segment we accept (our declared MaxRecvDataSegmentLength).
    pub max_recv_data_segment_length: u32,
    /// Largest data segment the peer accepts (its declared value).
    pub max_send_data_segment_length: u32,
    pub max_burst_length: u32,
    pub write_limits: WriteLimits,
    /// StatSN of the next status-bearing PDU.
    pub next_stat_sn: u32,
    /// Largest Expected Data Transfer Length of a write we buffer.
    pub max_write_len: u32,
}

fn crc_of(parts: &[&[u8]]) -> u32 {
    let mut c = digest::Crc32c::new();
    for p in parts {
        c.update(p);
    }
    c.finalize()
}

impl TcpConnection {
    pub fn new(stream: TcpStream) -> io::Result<TcpConnection> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        Ok(TcpConnection {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            peer,
            trace: None,
        })
    }

    /// Records this connection's bytes, both ways, from now on into `trace` (`side`: whether
    /// this end accepted or connected, for the synthetic handshake).
    pub fn trace(&mut self, trace: &PduTrace, side: Side) -> io::Result<()> {
        let local = self.stream.local_addr()?;
        self.trace = Some(Arc::new(trace.connection(local, self.peer, side)));
        Ok(())
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Read one PDU without digests (login phase). EOF before a PDU is `UnexpectedEof`.
    pub async fn recv_pdu(&mut self, max_data: u32) -> io::Result<InPdu> {
        let trace = self.trace.as_deref();
        fill(&mut self.stream, &mut self.rbuf, BHS_LEN, trace).await?;
        let head: [u8; BHS_LEN] = self.rbuf[..BHS_LEN].try_into().expect("48 bytes");
        let layout = FrameLayout::of(&head, Digests::default(), max_data).map_err(invalid)?;
        fill(&mut self.stream, &mut self.rbuf, layout.total_len(), trace).await?;
        let decoded = Bhs::decode(&head).map_err(invalid)?;
        let mut frame = self.rbuf.split_to(layout.total_len());
        let _ = frame.split_to(BHS_LEN);
        let ahs = frame.split_to(layout.ahs_len).freeze();
        let data = frame.split_to(layout.data_len as usize).freeze();
        Ok(InPdu {
            pdu: Pdu {
                bhs: decoded.bhs,
                ahs,
                data,
            },
            raw_bhs: head,
        })
    }

    /// Write one PDU without digests (login phase).
    pub async fn send_pdu(&mut self, pdu: &Pdu) -> io::Result<()> {
        let bytes = iscsi_wire::encode_pdu(pdu, None, None);
        if let Some(t) = &self.trace {
            t.sent(&bytes);
        }
        self.stream.write_all(&bytes).await
    }

    /// Enter full feature phase: spawn the reader and writer tasks.
    pub fn into_full_feature(
        self,
        cfg: FfpConfig,
        sn: Arc<CmdSnState>,
    ) -> (Arc<TcpDatamover>, mpsc::Receiver<Notice>) {
        let (read, write) = self.stream.into_split();
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
            trace: self.trace.clone(),
        });
        let writer = Writer {
            cfg: cfg.clone(),
            sn,
            stat_sn: cfg.next_stat_sn,
            trace: self.trace,
        };
        tokio::spawn(writer.run(write, out_rx, stop_rx.clone()));
        tokio::spawn(reader(read, self.rbuf, shared.clone(), notice_tx, stop_rx));
        (Arc::new(TcpDatamover { shared }), notice_rx)
    }
}

fn invalid(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

async fn fill<R: AsyncReadExt + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    need: usize,
    trace: Option<&TraceConnection>,
) -> io::Result<()> {
    while buf.len() < need {
        if read_more(r, buf, need, trace).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// One read towards `need` buffered bytes (in large chunks); what arrived is also traced.
async fn read_more<R: AsyncReadExt + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    need: usize,
    trace: Option<&TraceConnection>,
) -> io::Result<usize> {
    buf.reserve(READ_CHUNK.max(need - buf.len()));
    let before = buf.len();
    let n = r.read_buf(buf).await?;
    if let Some(t) = trace {
        t.received(&buf[before..]);
    }
    Ok(n)
}

struct WriteSlot {
    /// Set when a Data-Out broke the rules: later Data-Outs are discarded.
    failed: Option<String>,
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
    trace: Option<Arc<TraceConnection>>,
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
        crcs: Option<digest::SegmentCrcs>,
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
        crcs: Option<digest::SegmentCrcs>,
        status: Option<CollapsedStatus>,
    ) -> Result<u32, DmError> {
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

    fn data_in_digest_segment(&self) -> Option<u32> {
        let cfg = &self.shared.cfg;
        // Data-In is cut at MaxSendDataSegmentLength within each MaxBurstLength burst: fixed
        // pieces exactly when the burst is a whole number of segments.
        (cfg.digests.data
            && cfg
                .max_burst_length
                .is_multiple_of(cfg.max_send_data_segment_length))
        .then_some(cfg.max_send_data_segment_length)
    }

    async fn get_data(&self, task: TaskRef, write: WriteHandle) -> Result<(Bytes, u32), DmError> {
        let (rx, r2ts) = {
            let mut slots = self.shared.slots.lock().expect("slots lock");
            let Some(slot) = slots.get_mut(&write.itt) else {
                return Err(DmError::Aborted);
            };
            if let Some(why) = slot.failed.clone() {
                slots.remove(&write.itt);
                return Err(DmError::DataPhase(why));
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

async fn reader(
    mut r: OwnedReadHalf,
    mut rbuf: BytesMut,
    shared: Arc<Shared>,
    notices: mpsc::Sender<Notice>,
    mut stop: watch::Receiver<bool>,
) {
    let end = loop {
        match next_pdu(&mut r, &mut rbuf, &shared, &notices, &mut stop).await {
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

/// Read until `need` bytes are buffered, or stop. Ok(false) = stopped.
async fn fill_or_stop(
    r: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    need: usize,
    stop: &mut watch::Receiver<bool>,
    trace: Option<&TraceConnection>,
) -> Result<bool, ReadEnd> {
    while buf.len() < need {
        tokio::select! {
            n = read_more(r, buf, need, trace) => match n {
                Ok(0) => return Err(ReadEnd::Eof),
                Ok(_) => {}
                Err(e) => return Err(ReadEnd::Error(format!("read error: {e}"))),
            },
            _ = stop.changed() => return Ok(false),
        }
    }
    Ok(true)
}

/// Handle one PDU. Ok(false) when asked to stop.
async fn next_pdu(
    r: &mut OwnedReadHalf,
    rbuf: &mut BytesMut,
    shared: &Shared,
    notices: &mpsc::Sender<Notice>,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, ReadEnd> {
    let cfg = &shared.cfg;
    let trace = shared.trace.as_deref();
    if !fill_or_stop(r, rbuf, BHS_LEN, stop, trace).await? {
        return Ok(false);
    }
    let head: [u8; BHS_LEN] = rbuf[..BHS_LEN].try_into().expect("48 bytes");
    let layout = match FrameLayout::of(&head, cfg.digests, cfg.max_recv_data_segment_length) {
        Ok(l) => l,
        Err(e) => {
            send_reject(shared, reject::PROTOCOL_ERROR, head).await;
            return Err(ReadEnd::Error(format!("protocol error: {e}")));
        }
    };
    let header_end = BHS_LEN + layout.header_rest_len();
    if !fill_or_stop(r, rbuf, header_end, stop, trace).await? {
        return Ok(false);
    }
    if layout.header_digest_len > 0 {
        let got = u32::from_le_bytes(rbuf[header_end - 4..header_end].try_into().expect("4"));
        let want = digest::crc32c(&rbuf[..header_end - 4]);
        if got != want {
            return Err(ReadEnd::Error(format!(
                "header digest error (got {got:08x}, computed {want:08x})"
            )));
        }
    }
    let total = layout.total_len();
    if !fill_or_stop(r, rbuf, total, stop, trace).await? {
        return Ok(false);
    }
    let decoded = match Bhs::decode(&head) {
        Ok(d) => d,
        Err(e) => {
            let _ = rbuf.split_to(total);
            let reason = match e {
                WireError::UnknownOpcode(_) => reject::COMMAND_NOT_SUPPORTED,
                _ => reject::PROTOCOL_ERROR,
            };
            tracing::warn!(peer = %shared.peer, "rejecting PDU: {e}");
            send_reject(shared, reason, head).await;
            return Ok(true);
        }
    };
    let data_start = header_end;
    let data_len = layout.data_len as usize;
    let data_digest = if layout.data_digest_len > 0 {
        let at = data_start + data_len + layout.pad_len;
        Some(u32::from_le_bytes(rbuf[at..at + 4].try_into().expect("4")))
    } else {
        None
    };
    let pad = layout.pad_len;
    let check_data = |crc_of_data: u32, frame: &[u8]| -> Result<(), ReadEnd> {
        if let Some(want) = data_digest {
            let pad_bytes = &frame[data_start + data_len..data_start + data_len + pad];
            let got = digest::crc32c_append(crc_of_data, pad_bytes);
            if got != want {
                return Err(ReadEnd::Error(format!(
                    "data digest error (got {want:08x}, computed {got:08x})"
                )));
            }
        }
        Ok(())
    };

    match decoded.bhs {
        Bhs::DataOut(d) => {
            let frame = rbuf.split_to(total);
            let payload = &frame[data_start..data_start + data_len];
            let mut done = None;
            let mut more_r2ts = Vec::new();
            let task_lun;
            let mut rejected = false;
            'placed: {
                let mut slots = shared.slots.lock().expect("slots lock");
                let Some(slot) = slots.get_mut(&d.itt) else {
                    // Data for a task that was aborted or never existed: discard.
                    check_data(digest::crc32c(payload), &frame)?;
                    tracing::debug!(peer = %shared.peer, itt = d.itt, "discarding Data-Out for unknown task");
                    return Ok(true);
                };
                if slot.failed.is_some() {
                    return Ok(true);
                }
                let slot_lun = slot.lun;
                if let Err(e) = slot.xfer.on_data_out(
                    d.ttt,
                    d.data_sn,
                    d.buffer_offset,
                    data_len as u32,
                    d.final_,
                ) {
                    // ERL 0 without dropping the session: Reject this PDU, fail the command.
                    let why = format!("Data-Out for ITT 0x{:08x}: {e}", d.itt);
                    tracing::warn!(peer = %shared.peer, "{why}");
                    match slot.waiter.take() {
                        Some(w) => {
                            slots.remove(&d.itt);
                            let _ = w.send(Err(DmError::DataPhase(why)));
                        }
                        None => slot.failed = Some(why),
                    }
                    rejected = true;
                    task_lun = slot_lun;
                    break 'placed;
                }
                task_lun = slot.lun;
                let off = d.buffer_offset as usize;
                let dst = &mut slot.buf[off..off + data_len];
                let crc = if data_digest.is_some() {
                    digest::copy_with_crc32c(dst, payload)
                } else {
                    dst.copy_from_slice(payload);
                    0
                };
                check_data(crc, &frame)?;
                if slot.solicited {
                    if d.final_ {
                        more_r2ts = slot.xfer.next_r2ts(|| shared.alloc_ttt());
                    }
                    if slot.xfer.is_complete() {
                        let slot = slots.remove(&d.itt).expect("present");
                        done = Some(slot);
                    }
                }
            }
            if rejected {
                send_reject(shared, reject::PROTOCOL_ERROR, head).await;
                return Ok(true);
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
        Bhs::ScsiCommand(c) if c.write && c.expected_data_len > 0 => {
            let frame = rbuf.split_to(total);
            let payload = &frame[data_start..data_start + data_len];
            if c.expected_data_len > cfg.max_write_len {
                return Err(ReadEnd::Error(format!(
                    "write of {} bytes exceeds the {}-byte limit",
                    c.expected_data_len, cfg.max_write_len
                )));
            }
            let xfer = WriteTransfer::new(
                c.expected_data_len,
                data_len as u32,
                c.final_,
                cfg.write_limits,
            )
            .map_err(|e| ReadEnd::Error(format!("SCSI Command ITT 0x{:08x}: {e}", c.itt)))?;
            let mut buf = BytesMut::zeroed(c.expected_data_len as usize);
            let crc = if data_digest.is_some() {
                digest::copy_with_crc32c(&mut buf[..data_len], payload)
            } else {
                buf[..data_len].copy_from_slice(payload);
                0
            };
            check_data(crc, &frame)?;
            let ahs = Bytes::copy_from_slice(&frame[BHS_LEN..BHS_LEN + layout.ahs_len]);
            let itt = c.itt;
            let lun = c.lun;
            let expected_len = c.expected_data_len;
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
                raw_bhs: head,
            };
            let write = Some(WriteHandle { itt, expected_len });
            notices
                .send(Notice::Command { pdu, write })
                .await
                .map_err(|_| ReadEnd::Stopped)?;
            Ok(true)
        }
        bhs => {
            let mut frame = rbuf.split_to(total);
            if data_digest.is_some() {
                let crc = digest::crc32c(&frame[data_start..data_start + data_len]);
                check_data(crc, &frame)?;
            }
            let _ = frame.split_to(BHS_LEN);
            let ahs = frame.split_to(layout.ahs_len).freeze();
            let _ = frame.split_to(layout.header_digest_len);
            let data = frame.split_to(data_len).freeze();
            let is_command = matches!(bhs, Bhs::ScsiCommand(_));
            let pdu = InPdu {
                pdu: Pdu { bhs, ahs, data },
                raw_bhs: head,
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

async fn send_reject(shared: &Shared, reason: u8, head: [u8; BHS_LEN]) {
    let pdu = Pdu::new(
        Bhs::Reject(Reject {
            reason,
            ..Default::default()
        }),
        Bytes::copy_from_slice(&head),
    );
    let _ = shared.out.send(Out::Pdu(pdu)).await;
}

// ---------------------------------------------------------------------------------------
// Send path

struct Writer {
    cfg: FfpConfig,
    sn: Arc<CmdSnState>,
    stat_sn: u32,
    trace: Option<Arc<TraceConnection>>,
}

enum Part {
    Head(std::ops::Range<usize>),
    Data(Bytes),
    Pad(usize),
    Digest([u8; 4]),
}

static ZEROS: [u8; 4] = [0; 4];

impl Writer {
    async fn run(
        mut self,
        mut w: OwnedWriteHalf,
        mut rx: mpsc::Receiver<Out>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut batch = Vec::with_capacity(64);
        let mut heads = Vec::with_capacity(64 * 56);
        let mut parts = Vec::with_capacity(256);
        loop {
            let first = tokio::select! {
                m = rx.recv() => match m { Some(m) => m, None => break },
                _ = stop.changed() => break,
            };
            batch.push(first);
            while batch.len() < 64 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            heads.clear();
            parts.clear();
            let mut close = false;
            for m in batch.drain(..) {
                match m {
                    Out::Pdu(p) => self.encode(p.bhs, &p.ahs, p.data, &mut heads, &mut parts),
                    Out::DataIn {
                        task,
                        data,
                        crcs,
                        status,
                    } => self.encode_data_in(task, data, crcs, status, &mut heads, &mut parts),
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
                            self.encode(bhs, &[], Bytes::new(), &mut heads, &mut parts);
                        }
                    }
                    Out::Close => {
                        close = true;
                        break;
                    }
                }
            }
            if let Some(t) = &self.trace {
                for p in &parts {
                    t.sent(part_bytes(p, &heads));
                }
            }
            let result = tokio::select! {
                r = write_parts(&mut w, &heads, &parts) => r,
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

    fn stamp(&mut self, bhs: &mut Bhs) {
        let (exp, max) = self.sn.load();
        bhs.set_target_sns(self.stat_sn, exp, max);
        if bhs.advances_stat_sn() {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
    }

    fn encode(
        &mut self,
        bhs: Bhs,
        ahs: &[u8],
        data: Bytes,
        heads: &mut Vec<u8>,
        parts: &mut Vec<Part>,
    ) {
        self.encode_with_crc(bhs, ahs, data, None, heads, parts)
    }

    /// `data_crc`: the CRC32C of `data` (without padding) when the producer already has it.
    fn encode_with_crc(
        &mut self,
        mut bhs: Bhs,
        ahs: &[u8],
        data: Bytes,
        data_crc: Option<u32>,
        heads: &mut Vec<u8>,
        parts: &mut Vec<Part>,
    ) {
        self.stamp(&mut bhs);
        let start = heads.len();
        heads.extend_from_slice(&bhs.encode(ahs.len(), data.len() as u32));
        heads.extend_from_slice(ahs);
        if self.cfg.digests.header {
            let d = digest::crc32c(&heads[start..]);
            heads.extend_from_slice(&d.to_le_bytes());
        }
        parts.push(Part::Head(start..heads.len()));
        self.push_data(data, data_crc, parts);
    }

    fn push_data(&self, data: Bytes, data_crc: Option<u32>, parts: &mut Vec<Part>) {
        if data.is_empty() {
            return;
        }
        let pad = iscsi_wire::padded_len(data.len() as u32) - data.len();
        let digest = self.cfg.digests.data.then(|| {
            match data_crc {
                Some(crc) => digest::crc32c_append(crc, &ZEROS[..pad]),
                None => crc_of(&[&data, &ZEROS[..pad]]),
            }
            .to_le_bytes()
        });
        parts.push(Part::Data(data));
        if pad > 0 {
            parts.push(Part::Pad(pad));
        }
        if let Some(d) = digest {
            parts.push(Part::Digest(d));
        }
    }

    fn encode_data_in(
        &mut self,
        task: TaskRef,
        data: Bytes,
        crcs: Option<digest::SegmentCrcs>,
        status: Option<CollapsedStatus>,
        heads: &mut Vec<u8>,
        parts: &mut Vec<Part>,
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
            self.encode_with_crc(Bhs::DataIn(d), &[], payload, crc, heads, parts);
        }
    }
}

fn part_bytes<'a>(p: &'a Part, heads: &'a [u8]) -> &'a [u8] {
    match p {
        Part::Head(r) => &heads[r.clone()],
        Part::Data(b) => b,
        Part::Pad(n) => &ZEROS[..*n],
        Part::Digest(d) => d,
    }
}

async fn write_parts(w: &mut OwnedWriteHalf, heads: &[u8], parts: &[Part]) -> io::Result<()> {
    for chunk in parts.chunks(MAX_IOVECS) {
        let mut slices: Vec<IoSlice<'_>> = chunk
            .iter()
            .map(|p| IoSlice::new(part_bytes(p, heads)))
            .collect();
        let mut rest: &mut [IoSlice<'_>] = &mut slices;
        while !rest.is_empty() {
            let n = w.write_vectored(rest).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
    }
    Ok(())
}
