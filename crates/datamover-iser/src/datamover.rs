//! The target's iSER datamover in full feature phase. What arrives are Sends: SCSI Commands
//! (their iSER header names the initiator's Read and Write STags and addresses; immediate
//! data rides behind the BHS), unsolicited Data-Out and control PDUs. Read data leaves as
//! RDMA Writes into the Read STag, solicited write data is fetched with RDMA Reads from the
//! Write STag (the initiator's Write address is where its solicited data begins, as Linux
//! sets it), no more Reads in flight than the negotiated ORD, and a Read unanswered past the
//! data-out timeout drops the connection; status goes as a Send, with
//! Invalidate of the command's STag when negotiated, posted after the command's data so the
//! queue pair's ordering places the data first. iSER has no phase collapse: status given
//! with the data becomes a SCSI Response. Every PDU is stamped (StatSN, ExpCmdSN, MaxCmdSN)
//! as it is posted, so numbers follow wire order. A peer that takes none of what is sent to
//! it for the send-stall time loses the connection ([`Endpoint::drop_when_send_stalls`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use datamover::budget::Reservation;
use datamover::{
    CmdSnState, CollapsedStatus, Datamover, DmError, FfpConfig, InPdu, Notice, TaskRef, WriteHandle,
};
use iscsi_session::{WriteLimits, WriteTransfer};
use iscsi_wire::{Bhs, DataOut, Pdu, ScsiCommand, ScsiResponse, RESERVED_TAG};
use iser::IserHeader;
use rdma::{MemoryRegion, SendOp, SendWr};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::endpoint::{Device, Endpoint, Inbound, Received};
use crate::lent::{self, RegisteredReadBuffers};
use crate::mr_pool::PooledMr;
use crate::stats;

/// How many RDMA Writes of read data left straight from a registered RAM LUN image (no copy
/// into a buffer first) in this process so far: a diagnostic, and what tests check.
pub fn writes_from_lun_images() -> u64 {
    stats::WRITES_FROM_LUN_IMAGES.load(Ordering::Relaxed)
}

/// The initiator's buffers of one command, from its iSER header.
#[derive(Debug, Clone, Copy, Default)]
struct Stags {
    read: Option<(u32, u64)>,
    write: Option<(u32, u64)>,
}

impl Stags {
    /// The STag a SCSI Response invalidates: the read buffer's, else the write buffer's.
    fn invalidated_by_status(self) -> Option<u32> {
        self.read.or(self.write).map(|(stag, _)| stag)
    }
}

/// Write data being collected for one command, in a registered region: immediate and
/// unsolicited data are copied in, RDMA Reads land in it, and it goes up as the data.
struct WriteSlot<P: Device> {
    /// The region and its bytes in the connection's memory budget; `None` when the budget
    /// had no room (then `failed` says so: the command ends with TASK SET FULL, and what
    /// arrives for it is dropped).
    region: Option<(Arc<PooledMr<P>>, Reservation)>,
    xfer: WriteTransfer,
    /// Set when an unsolicited Data-Out broke the rules, or the budget had no room.
    failed: Option<DmError>,
    /// Woken when the unsolicited part is complete (or failed), or with the abort.
    unsolicited_done: Option<oneshot::Sender<Result<(), DmError>>>,
}

struct Shared<P: Device> {
    ep: Arc<Endpoint<P>>,
    cfg: FfpConfig,
    sn: Arc<CmdSnState>,
    send_invalidate: bool,
    stags: Mutex<HashMap<u32, Stags>>,
    slots: Mutex<HashMap<u32, WriteSlot<P>>>,
    /// RDMA Reads in flight, bounded by the negotiated ORD.
    reads: Semaphore,
    next_ttt: AtomicU32,
    peer: SocketAddr,
    /// Read data is produced into registered regions (see [`lent`]).
    read_buffers: Arc<RegisteredReadBuffers<P>>,
}

/// The iSER implementation of [`Datamover`] (target side).
pub struct IserDatamover<P: Device> {
    shared: Arc<Shared<P>>,
}

/// What full feature phase starts from (the accepted connection's state).
pub(crate) struct Start<P: Device> {
    pub ep: Arc<Endpoint<P>>,
    pub received: Received,
    pub peer: SocketAddr,
    pub send_invalidate: bool,
    pub ord: u16,
    /// Largest data segment a Send of the initiator may carry.
    pub max_recv_data: u32,
}

pub(crate) fn start<P: Device>(
    s: Start<P>,
    mut cfg: FfpConfig,
    sn: Arc<CmdSnState>,
) -> (Arc<dyn Datamover>, mpsc::Receiver<Notice>) {
    // RDMA Reads fetch whole bursts: the per-PDU segment limit applies to Sends only, and
    // the receive buffers already bound those.
    cfg.write_limits.max_recv_data_segment_length = cfg
        .write_limits
        .max_recv_data_segment_length
        .max(cfg.write_limits.max_burst_length);
    let shared = Arc::new(Shared {
        read_buffers: Arc::new(RegisteredReadBuffers::new(
            s.ep.source_pool(),
            s.ep.domain(),
        )),
        ep: s.ep,
        cfg,
        sn,
        send_invalidate: s.send_invalidate,
        stags: Mutex::new(HashMap::new()),
        slots: Mutex::new(HashMap::new()),
        reads: Semaphore::new(usize::from(s.ord.max(1))),
        next_ttt: AtomicU32::new(1),
        peer: s.peer,
    });
    shared
        .ep
        .drop_when_send_stalls(shared.cfg.timeouts.send_stall);
    let (notices, rx) = NoticeOut::new(shared.ep.recv_credit());
    let receiver = Receiver {
        sh: shared.clone(),
        notices,
        max_recv_data: s.max_recv_data,
    };
    receiver.deliver(&shared.ep, s.received);
    (Arc::new(IserDatamover { shared }), rx)
}

impl<P: Device> Shared<P> {
    /// Posts a PDU in a Send, stamped as it is posted.
    async fn send_pdu(&self, mut pdu: Pdu, op: SendOp) -> Result<(), DmError> {
        let status = &self.cfg.status;
        let sn = &self.sn;
        self.ep
            .send_with(&IserHeader::CONTROL, &mut pdu, op, |pdu| {
                let (exp, max) = sn.load();
                let mut status = status.lock().expect("status numbering");
                pdu.bhs.set_target_sns(status.next(), exp, max);
                if pdu.bhs.advances_stat_sn() {
                    status.assign(pdu.clone());
                }
            })
            .await
            .map_err(|_| DmError::Closed)
    }

    /// Runs `f` on the command's write slot, unless the command was aborted or its data
    /// already failed (that failure ends the command here).
    fn with_slot<T>(&self, itt: u32, f: impl FnOnce(&mut WriteSlot<P>) -> T) -> Result<T, DmError> {
        let mut slots = self.slots.lock().expect("slots");
        let Some(slot) = slots.get_mut(&itt) else {
            return Err(DmError::Aborted);
        };
        if let Some(e) = slot.failed.take() {
            slots.remove(&itt);
            return Err(e);
        }
        Ok(f(slot))
    }

    fn alloc_ttt(&self) -> u32 {
        loop {
            let t = self.next_ttt.fetch_add(1, Ordering::Relaxed);
            if t != RESERVED_TAG {
                return t;
            }
        }
    }

    /// A region could not be registered for an RDMA operation: the command fails with the
    /// connection, and the log says why (on rdma-core devices registration pins memory, so the
    /// usual cause is the memlock limit).
    fn registration_failed(&self, len: usize, e: rdma::Error) -> DmError {
        tracing::warn!(
            peer = %self.peer,
            "registering {len} bytes for RDMA failed: {e} (on an RDMA device registration pins memory: raise the memlock limit, e.g. ulimit -l unlimited or LimitMEMLOCK=infinity)"
        );
        DmError::Closed
    }

    /// Fetches `len` bytes at `remote` of the initiator's `stag` with one RDMA Read into
    /// `into` at `offset`, for the write `itt`. A Read that gets no response within the
    /// data-out timeout (an initiator that never answers would hold the write's region, its
    /// budget and its task for ever) drops the connection, as a write whose Data-Out never
    /// comes does over TCP.
    async fn rdma_read(
        &self,
        itt: u32,
        stag: u32,
        remote: u64,
        into: &Arc<PooledMr<P>>,
        offset: u32,
        len: u32,
    ) -> Result<(), DmError> {
        let _slot = self.reads.acquire().await.map_err(|_| DmError::Closed)?;
        let wr = SendWr {
            wr_id: 0,
            op: SendOp::RdmaRead {
                remote_addr: remote,
                rkey: stag,
            },
            sges: vec![into.mr().sge(offset as usize, len as usize)],
            signaled: true,
        };
        let posted = std::time::Instant::now();
        let limit = self.cfg.timeouts.data_out;
        let Ok(done) = tokio::time::timeout(limit, self.ep.post_and_wait(wr)).await else {
            tracing::warn!(
                peer = %self.peer,
                "write ITT 0x{itt:08x}: an RDMA Read of {len} bytes got no response in {} s: dropping the connection",
                limit.as_secs_f32()
            );
            self.ep.abort();
            // The Read Response may still land in the region until the queue pair is down:
            // it goes back to the pool only then.
            let region = into.clone();
            let ended = self.ep.when_ended();
            tokio::spawn(async move {
                ended.await;
                drop(region);
            });
            return Err(DmError::Closed);
        };
        done.map_err(|_| DmError::Closed)?;
        crate::stats::count(
            &crate::stats::RDMA_READS,
            &crate::stats::RDMA_READ_BYTES,
            len.into(),
        );
        let took = posted.elapsed();
        if took > std::time::Duration::from_millis(100) {
            tracing::debug!(peer = %self.peer, len, ?took, "a slow RDMA Read");
        }
        Ok(())
    }
}

#[async_trait]
impl<P: Device> Datamover for IserDatamover<P> {
    async fn send_control(&self, pdu: Pdu) -> Result<(), DmError> {
        let op = match &pdu.bhs {
            Bhs::ScsiResponse(r) => {
                let stags = self.shared.stags.lock().expect("stags").remove(&r.itt);
                match stags.and_then(|s| s.invalidated_by_status()) {
                    Some(rkey) if self.shared.send_invalidate => SendOp::SendInvalidate { rkey },
                    _ => SendOp::Send,
                }
            }
            _ => SendOp::Send,
        };
        self.shared.send_pdu(pdu, op).await
    }

    async fn put_data(
        &self,
        task: TaskRef,
        data: Bytes,
        note: Option<storage::BufNote>,
        status: Option<CollapsedStatus>,
    ) -> Result<u32, DmError> {
        let read = self
            .shared
            .stags
            .lock()
            .expect("stags")
            .get(&task.itt)
            .and_then(|s| s.read);
        let mut ops = 0;
        if !data.is_empty() {
            let Some((stag, va)) = read else {
                tracing::warn!(peer = %self.shared.peer, itt = task.itt, "read data for a command without a Read STag: closing the connection");
                self.shared.ep.close();
                return Err(DmError::Closed);
            };
            // Data produced in a region this connection lent, or lying in a LUN image
            // registered in its domain, leaves from there (`data` keeps that memory); other
            // data is copied into a region first.
            let (sge, copy) = match self.shared.read_buffers.sge_of(note.as_ref(), &data) {
                Some((sge, in_image)) => {
                    if in_image {
                        stats::WRITES_FROM_LUN_IMAGES.fetch_add(1, Ordering::Relaxed);
                    }
                    (sge, None)
                }
                None => {
                    let lease = self
                        .shared
                        .ep
                        .source(data.len())
                        .map_err(|e| self.shared.registration_failed(data.len(), e))?;
                    lease.mr().write_at(0, &data);
                    (lease.mr().sge(0, data.len()), Some(lease))
                }
            };
            let wr = SendWr {
                wr_id: 0,
                op: SendOp::RdmaWrite {
                    remote_addr: va,
                    rkey: stag,
                },
                sges: vec![sge],
                signaled: true,
            };
            // Not waited for: the status Send follows it on the queue pair, so the data is
            // placed before the initiator sees the status (waiting cost a completion's
            // round trip through the completion task per read).
            let sent = data.len() as u64;
            self.shared
                .ep
                .post_holding(wr, Box::new((copy, data)))
                .map_err(|_| DmError::Closed)?;
            crate::stats::count(
                &crate::stats::RDMA_WRITES,
                &crate::stats::RDMA_WRITE_BYTES,
                sent,
            );
            ops = 1;
        }
        if let Some(st) = status {
            let rsp = ScsiResponse {
                itt: task.itt,
                status: st.status,
                overflow: st.overflow,
                underflow: st.underflow,
                residual: st.residual,
                ..Default::default()
            };
            self.send_control(Pdu::new(Bhs::ScsiResponse(rsp), Bytes::new()))
                .await?;
        }
        Ok(ops)
    }

    fn read_buffers(&self) -> Option<Arc<dyn storage::ReadBufSource>> {
        Some(self.shared.read_buffers.clone())
    }

    async fn get_data(&self, task: TaskRef, write: WriteHandle) -> Result<(Bytes, u32), DmError> {
        let sh = &self.shared;
        let itt = write.itt;
        // First the unsolicited part, then RDMA Reads for the rest.
        let wait = sh.with_slot(itt, |slot| {
            slot.xfer.awaiting_unsolicited().then(|| {
                let (tx, rx) = oneshot::channel();
                slot.unsolicited_done = Some(tx);
                rx
            })
        })?;
        if let Some(rx) = wait {
            let since = std::time::Instant::now();
            // Unsolicited data announced (F=0) that does not come would hold the write's
            // region and window slot for ever: past the data-out timeout the connection ends.
            let limit = sh.cfg.timeouts.data_out;
            let Ok(got) = tokio::time::timeout(limit, rx).await else {
                tracing::warn!(peer = %sh.peer, "write ITT 0x{itt:08x} got none of its unsolicited data in {} s: closing the connection", limit.as_secs());
                sh.ep.close();
                return Err(DmError::Closed);
            };
            got.map_err(|_| DmError::Closed)??;
            let took = since.elapsed();
            if took > std::time::Duration::from_millis(100) {
                tracing::debug!(peer = %sh.peer, itt, ?took, "a slow wait for unsolicited data");
            }
        }
        let write_stag = sh
            .stags
            .lock()
            .expect("stags")
            .get(&task.itt)
            .and_then(|s| s.write);
        let mut first_solicited = None;
        let mut reads = 0;
        loop {
            let r2ts = sh.with_slot(itt, |slot| {
                (!slot.xfer.is_complete()).then(|| slot.xfer.next_r2ts(|| sh.alloc_ttt()))
            })?;
            let Some(r2ts) = r2ts else {
                let slot = sh.slots.lock().expect("slots").remove(&itt);
                let slot = slot.ok_or(DmError::Aborted)?;
                let len = write.expected_len as usize;
                let (region, held) = slot
                    .region
                    .expect("a slot that has not failed has its region");
                return Ok((lent::view_holding(region, len, held), reads));
            };
            let Some((stag, va)) = write_stag else {
                tracing::warn!(peer = %sh.peer, itt, "solicited data for a command without a Write STag: closing the connection");
                sh.ep.close();
                return Err(DmError::Closed);
            };
            for r in r2ts {
                let base = *first_solicited.get_or_insert(r.offset);
                // Held through the Read: an abort meanwhile must not return the region to
                // the pool while the Read Response may still land in it.
                let region = sh
                    .with_slot(itt, |slot| slot.region.as_ref().map(|(r, _)| r.clone()))?
                    .expect("a slot that has not failed has its region");
                sh.rdma_read(
                    itt,
                    stag,
                    va + u64::from(r.offset - base),
                    &region,
                    r.offset,
                    r.len,
                )
                .await?;
                reads += 1;
                sh.with_slot(itt, |slot| {
                    slot.xfer
                        .on_data_out(r.ttt, 0, r.offset, r.len, true)
                        .map_err(|e| DmError::DataPhase {
                            why: e.to_string(),
                            raw_bhs: [0; 48],
                        })?;
                    Ok::<(), DmError>(())
                })??;
            }
        }
    }

    fn abort_task(&self, itt: u32) {
        let slot = self.shared.slots.lock().expect("slots").remove(&itt);
        if let Some(tx) = slot.and_then(|s| s.unsolicited_done) {
            let _ = tx.send(Err(DmError::Aborted));
        }
    }

    fn forget_command(&self, itt: u32) {
        self.abort_task(itt);
        self.shared.stags.lock().expect("stags").remove(&itt);
    }

    fn close(&self) {
        self.shared.ep.close();
    }

    /// The initiator disconnects once it has the Logout Response; closing first races with
    /// whatever it still has on its queue (Linux siw then reports a fatal QP error). So it
    /// gets `LOGOUT_GRACE` to close before this end does.
    fn close_after_logout(&self) {
        let ep = self.shared.ep.clone();
        self.shared
            .ep
            .close_after_peer_or(LOGOUT_GRACE, move || ep.close());
    }
}

/// How long the initiator may take to close its end after a Logout Response.
const LOGOUT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Received Sends, taken on the endpoint's completion task: every Send becomes a notice
/// (commands register their STags and write state first); a malformed Send ends the
/// connection.
struct Receiver<P: Device> {
    sh: Arc<Shared<P>>,
    notices: NoticeOut,
    max_recv_data: u32,
}

impl<P: Device> Receiver<P> {
    fn deliver(mut self, ep: &Endpoint<P>, received: Received) {
        let (sh, notices) = (self.sh.clone(), self.notices.clone());
        ep.deliver_sends(
            received,
            move |inbound| self.on_send(inbound),
            move |why| {
                tracing::debug!(peer = %sh.peer, "iSER connection ended: {why}");
                sh.ep.close();
                // Waiters for unsolicited data hear of the end as their senders go.
                sh.slots.lock().expect("slots").clear();
                notices.push_end(why);
            },
        );
    }

    fn on_send(&mut self, inbound: Inbound) -> Result<(), String> {
        // An initiator has no business invalidating the target's STags (it knows none).
        if inbound.invalidated.is_some() {
            return Err("a Send with Invalidate from the initiator".to_string());
        }
        let sh = &self.sh;
        let send = iser::parse_send(&inbound.bytes, self.max_recv_data)
            .map_err(|e| format!("from the initiator: {e}"))?;
        let pdu = InPdu {
            pdu: send.pdu,
            raw_bhs: send.raw_bhs,
        };
        let notice = match &pdu.pdu.bhs {
            Bhs::ScsiCommand(c) => {
                let write = on_command(sh, c, &send.header, &pdu.pdu.data)?;
                Notice::Command {
                    pdu: InPdu {
                        pdu: Pdu {
                            data: Bytes::new(),
                            ..pdu.pdu
                        },
                        raw_bhs: pdu.raw_bhs,
                    },
                    write,
                }
            }
            Bhs::DataOut(d) => {
                on_data_out(sh, d, &pdu.pdu.data, pdu.raw_bhs);
                return Ok(());
            }
            _ => Notice::Control(pdu),
        };
        match self.notices.push(notice) {
            Ok(()) => Ok(()),
            Err(NoticeRefused::Stopped) => Err("the session stopped".to_string()),
            Err(NoticeRefused::OverCredit(why)) => {
                crate::credit::overrun(&sh.peer.to_string(), &why);
                Err(why)
            }
        }
    }
}

/// Notices to the session, in order, from the completion task, which cannot wait: one per
/// received Send, at most the receive credit of them waiting, and a place kept for the end.
#[derive(Clone)]
struct NoticeOut {
    tx: mpsc::Sender<Notice>,
    credit: usize,
}

/// Why a notice was not queued.
#[derive(Debug, PartialEq, Eq)]
enum NoticeRefused {
    /// The session takes no more notices.
    Stopped,
    /// `credit` notices already wait: the peer has more Sends outstanding than it had
    /// receives (the reason, for the log).
    OverCredit(String),
}

impl NoticeOut {
    /// A queue for at most `credit` notices of received Sends, and the receiving end.
    fn new(credit: usize) -> (NoticeOut, mpsc::Receiver<Notice>) {
        let (tx, rx) = mpsc::channel(credit + 1);
        (NoticeOut { tx, credit }, rx)
    }

    /// Queues the notice of a received Send.
    fn push(&self, notice: Notice) -> Result<(), NoticeRefused> {
        let held = crate::credit::queued(&self.tx);
        if held >= self.credit {
            return Err(NoticeRefused::OverCredit(crate::credit::overrun_reason(
                held,
                self.credit,
            )));
        }
        // Not full: the check above leaves room.
        self.tx
            .try_send(notice)
            .map_err(|_| NoticeRefused::Stopped)?;
        Ok(())
    }

    /// Queues the end of the connection, in the place kept for it (dropped if the session
    /// is gone).
    fn push_end(&self, why: String) {
        let _ = self.tx.try_send(Notice::Closed(why));
    }
}

/// A SCSI Command: its STags kept for the data and the status; a write's buffer and
/// transfer state made (immediate data placed) before the next Send is looked at.
fn on_command<P: Device>(
    sh: &Shared<P>,
    c: &ScsiCommand,
    header: &IserHeader,
    immediate: &Bytes,
) -> Result<Option<WriteHandle>, String> {
    sh.stags.lock().expect("stags").insert(
        c.itt,
        Stags {
            read: header.read,
            write: header.write,
        },
    );
    if !c.write || c.expected_data_len == 0 {
        return Ok(None);
    }
    let cfg = &sh.cfg;
    if c.expected_data_len > cfg.max_write_len {
        return Err(format!(
            "write of {} bytes exceeds the {}-byte limit",
            c.expected_data_len, cfg.max_write_len
        ));
    }
    let limits: WriteLimits = cfg.write_limits;
    let xfer = WriteTransfer::new(
        c.expected_data_len,
        immediate.len() as u32,
        c.final_,
        limits,
    )
    .map_err(|e| format!("SCSI Command ITT 0x{:08x}: {e}", c.itt))?;
    let len = c.expected_data_len as usize;
    // Budgeted before the region is taken: a flood of commands announcing large writes gets
    // TASK SET FULL, not registered memory.
    let (region, failed) = match cfg.budget.try_reserve(len as u64) {
        Ok(reservation) => {
            let region = sh.ep.sink(len).map_err(|e| {
                sh.registration_failed(len, e);
                format!("no registered region for the write of ITT 0x{:08x}", c.itt)
            })?;
            region.mr().write_at(0, immediate);
            (Some((Arc::new(region), reservation)), None)
        }
        Err(e) => (None, Some(DmError::OverBudget(e.to_string()))),
    };
    let slot = WriteSlot {
        region,
        xfer,
        failed,
        unsolicited_done: None,
    };
    if sh
        .slots
        .lock()
        .expect("slots")
        .insert(c.itt, slot)
        .is_some()
    {
        return Err(format!(
            "ITT 0x{:08x} reused while its write is in progress",
            c.itt
        ));
    }
    Ok(Some(WriteHandle {
        itt: c.itt,
        expected_len: c.expected_data_len,
    }))
}

/// An unsolicited Data-Out in a Send: checked and placed; one that breaks the rules fails
/// its command (Reject, then CHECK CONDITION, as over TCP).
fn on_data_out<P: Device>(sh: &Shared<P>, d: &DataOut, data: &Bytes, raw_bhs: [u8; 48]) {
    let mut slots = sh.slots.lock().expect("slots");
    let Some(slot) = slots.get_mut(&d.itt) else {
        tracing::debug!(peer = %sh.peer, itt = d.itt, "discarding Data-Out for unknown task");
        return;
    };
    if slot.failed.is_some() {
        return;
    }
    let checked = if d.ttt == RESERVED_TAG {
        slot.xfer
            .on_data_out(
                d.ttt,
                d.data_sn,
                d.buffer_offset,
                data.len() as u32,
                d.final_,
            )
            .map_err(|e| e.to_string())
    } else {
        Err("iSER carries no solicited Data-Out".to_string())
    };
    match checked {
        Ok(()) => {
            if let Some((region, _)) = &slot.region {
                region.mr().write_at(d.buffer_offset as usize, data);
            }
            if !slot.xfer.awaiting_unsolicited() {
                if let Some(tx) = slot.unsolicited_done.take() {
                    let _ = tx.send(Ok(()));
                }
            }
        }
        Err(why) => {
            slot.failed = Some(DmError::DataPhase {
                why: format!("Data-Out for ITT 0x{:08x}: {why}", d.itt),
                raw_bhs,
            });
            if let Some(tx) = slot.unsolicited_done.take() {
                let _ = tx.send(Ok(()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(itt: u32) -> Notice {
        Notice::Control(InPdu {
            pdu: Pdu::new(
                Bhs::NopOut(iscsi_wire::NopOut {
                    itt,
                    ..Default::default()
                }),
                Bytes::new(),
            ),
            raw_bhs: [0; 48],
        })
    }

    /// While the session takes nothing, notices queue up to the credit; one more is refused
    /// as the peer overrunning it (nothing is queued for it), and the end still finds its
    /// place behind the rest, which the session gets in order.
    #[tokio::test]
    async fn notices_beyond_the_credit_are_refused_and_the_end_still_fits() {
        let (out, mut rx) = NoticeOut::new(8);
        for itt in 0..8 {
            assert_eq!(out.push(ping(itt)), Ok(()));
        }
        assert!(matches!(
            out.push(ping(8)),
            Err(NoticeRefused::OverCredit(_))
        ));
        out.push_end("overrun".into());
        let mut got = Vec::new();
        while let Ok(next) = rx.try_recv() {
            match next {
                Notice::Control(pdu) => got.push(pdu.pdu.bhs.itt()),
                Notice::Closed(why) => {
                    assert_eq!(why, "overrun");
                    break;
                }
                _ => panic!("a control notice or the end"),
            }
        }
        assert_eq!(got, (0..8).collect::<Vec<u32>>());
    }

    /// A session taking notices frees places: as many pass as it takes, and once it is gone
    /// pushing says so.
    #[tokio::test]
    async fn places_come_back_as_the_session_takes_notices() {
        let (out, mut rx) = NoticeOut::new(4);
        for itt in 0..40 {
            assert_eq!(out.push(ping(itt)), Ok(()));
            let Notice::Control(pdu) = rx.recv().await.expect("the notice") else {
                panic!("a control notice")
            };
            assert_eq!(pdu.pdu.bhs.itt(), itt);
        }
        drop(rx);
        assert_eq!(out.push(ping(40)), Err(NoticeRefused::Stopped));
    }
}
