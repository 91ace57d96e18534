//! The initiator's iSCSI/TCP data phases on one connection, sans IO: fed the received
//! bytes, it answers R2Ts with Data-Out sequences, places Data-In into each command's read
//! buffer (checking DataSN, offsets and the data digest, computed in the same pass as the
//! copy), keeps a whole read that arrives in one Data-In as the receive buffer's own bytes
//! (no copy), and hands everything else up as notices.
//!
//! At ErrorRecoveryLevel 1 a Data-In that fails its data digest, or the Data-In a DataSN
//! gap shows were lost (to a header digest error), are asked for again with a Data SNACK;
//! the command's status waits until they have come (RFC 7143 §7.8). A PDU whose header
//! digest fails is discarded (the reader skips it by its claimed length) and what it carried
//! shows as a gap, asked for again: a StatSN gap by a Status SNACK (ExpStatSN stays at the
//! first missing status until it comes), an R2TSN gap by an R2T SNACK, Data-In missing
//! before a SCSI Response by its ExpDataSN and a Data SNACK. A write that hears nothing while
//! the target still owes it R2Ts is probed with an R2T SNACK ([`DataPath::probe`]). After our
//! MaxRecvDataSegmentLength changes ([`DataPath::set_max_recv_data_segment_length`]), a read
//! begun before is asked for again with an R-Data SNACK: the target resends it cut anew and
//! ends it with a SCSI Response carrying the SNACK's tag.

use std::collections::HashMap;

use bytes::{Buf, Bytes, BytesMut};
use datamover::{CommandOut, InitiatorFfpConfig, InitiatorNotice, Resume, SnackFor};
use iscsi_session::erl1::snack_type;
use iscsi_session::DataOutSequence;
use iscsi_wire::serial::{sn_gt, sn_lt};
use iscsi_wire::{Bhs, DataIn, Pdu, R2t, SnackRequest, RESERVED_TAG};

use crate::frame::{complete_frame, Frame, FrameError};

/// A command's data phases.
#[derive(Debug)]
struct Task {
    lun: u64,
    write: Bytes,
    read_len: u32,
    /// Read data placed so far (filled in order normally: no zeroing first).
    buf: BytesMut,
    /// The whole read carried by one Data-In, kept as received.
    whole: Option<Bytes>,
    exp_data_sn: u32,
    /// The R2TSN after the highest R2T received (what TASK REASSIGN's ExpDataSN says for a
    /// write: R2Ts from it on never arrived).
    next_r2t_sn: u32,
    /// ERL ≥ 1: DataSNs lost and asked for again with a SNACK.
    missing: Vec<u32>,
    /// SNACKs sent for this command (bounded: a link that corrupts every resend ends the
    /// connection instead).
    snacks: u32,
    /// Status (a Data-In with status or a SCSI Response) that came while data was still
    /// missing: delivered when the last hole fills.
    held_status: Option<Pdu>,
    /// Where solicited write data begins, and the R2Ts received so far: (R2TSN, (offset,
    /// length)), each R2TSN once. A recovery R2T asks again for a range an earlier R2T asked
    /// for, so what is owed is what no range covers, not a sum of lengths.
    solicited_from: u32,
    r2ts_seen: Vec<(u32, (u32, u32))>,
    /// R2T SNACKs sent for R2Ts that then did not come: a target that sends nothing for
    /// them has lost track of the write, and only connection recovery gets it back.
    r2t_snacks_unanswered: u32,
    /// Recovery ticks since a PDU for this command last came ([`DataPath::probe`]).
    quiet_ticks: u32,
    /// Its CmdSN: until the target's ExpCmdSN passes it, the target has not taken it up
    /// (an earlier command is missing), and owes it no R2T yet.
    cmd_sn: u32,
    /// It went through a recovery (a Data-Out Rejected, or reassigned here): hearing
    /// nothing for long, it is given up as lost by the target.
    recovered: bool,
    /// Reassigned here from a failed connection (ERL 2): the target re-issues the R2Ts it
    /// owes after TASK REASSIGN, and the reassignment has its own retries, so the probe asks
    /// only when none came for a long while.
    adopted: bool,
    /// The data path's `segment_epoch` when the command's Data-In started: a Data-In asked
    /// for again after MaxRecvDataSegmentLength changed takes an R-Data SNACK.
    epoch: u32,
    /// Read bytes before this offset were acknowledged with a DataACK (an R-Data SNACK has
    /// the target resend from there), and the DataSN after the Data-In acknowledged (TASK
    /// REASSIGN's ExpDataSN for the read).
    acked_bytes: u32,
    acked_data_sn: u32,
    /// An R-Data SNACK is out: the data comes again cut anew.
    r_data: Option<RData>,
}

/// A read being resent after an R-Data SNACK (RFC 7143 §11.16): Data-In from before the
/// SNACK may still arrive, numbered the old way, so data is placed by offset and counted by
/// the bytes it covers; only the SCSI Response carrying `tag` ends the command, and only
/// when every byte from `acked_bytes` on came with a sound digest.
#[derive(Debug)]
struct RData {
    tag: u32,
    placed: Vec<(u32, u32)>,
}

/// Data SNACKs one command may send before its connection is given up.
const MAX_SNACKS_PER_COMMAND: u32 = 16;
/// R2T SNACKs a write may send, none of them answered by an R2T, before its connection is
/// given up (at ErrorRecoveryLevel 2, TASK REASSIGN then has the target ask afresh). LIO
/// 6.1 sends no further R2T after a recovery R2T for a damaged Data-Out, and ignores an R2T
/// SNACK for an R2TSN it has not sent.
const MAX_UNANSWERED_R2T_SNACKS: u32 = 2;
/// A DataSN ahead of the expected one by at most this is a gap (Data-In lost on the way).
const MAX_DATA_SN_GAP: u32 = 4096;
/// A StatSN or R2TSN ahead of the expected one by at most this is a gap; further ahead, the
/// stream cannot be trusted.
const MAX_SN_GAP: u32 = 1024;
/// Recovery ticks a write reassigned here (ERL 2) waits for its first R2T before it asks
/// with an R2T SNACK from the R2TSN its TASK REASSIGN named: the reassignment's own retries
/// (10 at 300 ms) come first.
const ADOPTED_QUIET_TICKS: u32 = 16;
/// PDUs discarded for header digest errors one after another before the stream is taken
/// for lost (the claimed lengths were wrong too).
const MAX_DISCARDS_IN_A_ROW: u32 = 4;
/// Recovery ticks a command that went through a recovery waits, hearing nothing and owing
/// nothing, before it is given up as lost by the target ([`InitiatorNotice::Stalled`]):
/// LIO (6.1) loses a write whose Data-Out it Rejected once the initiator's ExpStatSN passes
/// the Reject, and answers a TASK REASSIGN for a task it no longer has as if it moved it.
const STALLED_AFTER_RECOVERY_TICKS: u32 = 24;
/// Recovery ticks (a quarter second each) a command waits, hearing nothing, before it asks
/// again for what it still waits for (R2Ts never sent, Data-In or statuses asked for whose
/// SNACK or answer was lost too).
const QUIET_TICKS_BEFORE_ASKING_AGAIN: u32 = 4;

impl Task {
    /// The read data as the command ends with it: bytes never sent read as zeros.
    fn take_read(&mut self) -> Bytes {
        if let Some(w) = self.whole.take() {
            return w;
        }
        if self.read_len == 0 {
            return Bytes::new();
        }
        self.buf.resize(self.read_len as usize, 0);
        std::mem::take(&mut self.buf).freeze()
    }
}

/// The data phases of one connection's commands.
#[derive(Debug)]
pub struct DataPath {
    cfg: InitiatorFfpConfig,
    /// StatSN after the highest one seen.
    exp_stat_sn: u32,
    /// StatSNs below it whose status has not gone up: held while their command's data is
    /// asked for again, or (ERL ≥ 1) lost and asked for with a Status SNACK. ExpStatSN stays
    /// at the first of them, so the target keeps them.
    undelivered: Vec<u32>,
    /// Of those, the statuses lost and asked for with a Status SNACK; the recovery ticks
    /// since a status last came, and the Status SNACKs sent for them (bounded).
    lost_status: Vec<u32>,
    status_quiet_ticks: u32,
    status_snacks: u32,
    /// PDUs discarded for header digest errors since the last sound one.
    discarded_in_a_row: u32,
    tasks: HashMap<u32, Task>,
    /// ExpCmdSN/MaxCmdSN of consumed PDUs not yet reported.
    window: Option<(u32, u32)>,
    /// The largest data segment accepted now (our MaxRecvDataSegmentLength; while a change
    /// is being negotiated, the larger of the old and new values).
    recv_limit: u32,
    /// Counts settled changes of MaxRecvDataSegmentLength.
    segment_epoch: u32,
    /// The next R-Data SNACK's tag.
    next_snack_tag: u32,
    /// The highest ExpCmdSN the target sent on this connection.
    exp_cmd_sn: Option<u32>,
}

impl DataPath {
    pub fn new(cfg: InitiatorFfpConfig) -> DataPath {
        DataPath {
            cfg,
            exp_stat_sn: cfg.exp_stat_sn,
            undelivered: Vec::new(),
            lost_status: Vec::new(),
            status_quiet_ticks: 0,
            status_snacks: 0,
            discarded_in_a_row: 0,
            tasks: HashMap::new(),
            window: None,
            recv_limit: cfg.max_recv_data_segment_length,
            segment_epoch: 0,
            next_snack_tag: 1,
            exp_cmd_sn: None,
        }
    }

    /// Our MaxRecvDataSegmentLength changes to `len` by a Text negotiation in full feature
    /// phase. Before the target's answer (`settled` false) segments up to the larger of the
    /// two values are accepted; once settled, `len` is the limit. From the start, Data-In of
    /// commands begun before are asked for again with an R-Data SNACK (they were cut the
    /// old way, and the target may already cut the new way).
    pub fn set_max_recv_data_segment_length(&mut self, len: u32, settled: bool) {
        if len != self.cfg.max_recv_data_segment_length {
            // From the Text Request on, a Data-In asked for again may come cut either way.
            self.cfg.max_recv_data_segment_length = len;
            self.segment_epoch = self.segment_epoch.wrapping_add(1);
        }
        self.recv_limit = match settled {
            false => self.recv_limit.max(len),
            true => len,
        };
    }

    /// A command is about to be sent: its data phases start.
    pub fn command(&mut self, cmd: &CommandOut) {
        let Bhs::ScsiCommand(c) = &cmd.pdu.bhs else {
            return;
        };
        self.tasks.insert(
            c.itt,
            Task {
                lun: c.lun,
                write: cmd.write.clone(),
                read_len: cmd.read_len,
                buf: BytesMut::new(),
                whole: None,
                exp_data_sn: 0,
                next_r2t_sn: 0,
                missing: Vec::new(),
                snacks: 0,
                held_status: None,
                solicited_from: cmd.solicited_from,
                r2ts_seen: Vec::new(),
                r2t_snacks_unanswered: 0,
                quiet_ticks: 0,
                cmd_sn: c.cmd_sn,
                recovered: false,
                adopted: false,
                epoch: self.segment_epoch,
                acked_bytes: 0,
                acked_data_sn: 0,
                r_data: None,
            },
        );
    }

    /// ERL 2: a command reassigned to this connection. For a write, R2Ts before
    /// `resume.exp_data_sn` came on the old one (the TASK REASSIGN says so), so they are no
    /// gap here; a read's Data-In come again from that DataSN on, after the bytes kept.
    pub fn adopt(&mut self, cmd: &CommandOut, resume: Resume) {
        self.command(cmd);
        let Bhs::ScsiCommand(c) = &cmd.pdu.bhs else {
            return;
        };
        let Some(t) = self.tasks.get_mut(&c.itt) else {
            return;
        };
        t.adopted = true;
        t.recovered = true;
        if !t.write.is_empty() {
            t.next_r2t_sn = resume.exp_data_sn;
        } else if resume.exp_data_sn != 0 && resume.read_prefix.len() <= t.read_len as usize {
            t.exp_data_sn = resume.exp_data_sn;
            t.acked_data_sn = resume.exp_data_sn;
            t.acked_bytes = resume.read_prefix.len() as u32;
            t.buf = BytesMut::from(&resume.read_prefix[..]);
        }
    }

    /// Drops a command's state (aborted or rejected).
    pub fn forget(&mut self, itt: u32) {
        self.tasks.remove(&itt);
    }

    /// ERL 2: how far command `itt` got here ([`Resume`]): for a write the R2TSN after the
    /// highest R2T received, for a read the DataSN after the Data-In acknowledged with a
    /// DataACK and the bytes before them (nothing when none was).
    pub fn resume_point(&self, itt: u32) -> Resume {
        let Some(t) = self.tasks.get(&itt) else {
            return Resume::default();
        };
        if !t.write.is_empty() {
            return Resume {
                exp_data_sn: t.next_r2t_sn,
                read_prefix: Bytes::new(),
            };
        }
        let kept = t.acked_bytes as usize;
        let read_prefix = match &t.whole {
            Some(w) if w.len() >= kept => w.slice(..kept),
            _ if t.buf.len() >= kept => Bytes::copy_from_slice(&t.buf[..kept]),
            _ => return Resume::default(),
        };
        Resume {
            exp_data_sn: t.acked_data_sn,
            read_prefix,
        }
    }

    /// Commands whose status has not arrived.
    pub fn in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// The ExpStatSN this connection's PDUs carry: the first status asked for again and not
    /// yet come, else the StatSN after the highest seen.
    pub fn ack_stat_sn(&self) -> u32 {
        self.undelivered
            .iter()
            .copied()
            .fold(self.exp_stat_sn, |a, h| if sn_lt(h, a) { h } else { a })
    }

    /// Handles the PDU at the front of `rbuf` if it is complete: Ok(false) means more bytes
    /// are needed, or (at ERL ≥ 1) that the PDU at the front failed its header digest and is
    /// for the reader to discard ([`DataPath::header_digest_discarded`]). Data-Out and
    /// SNACKs to send go to `out`, notices to `notices`; an error is a protocol or digest
    /// error from the target that ends the connection.
    pub fn receive(
        &mut self,
        rbuf: &mut BytesMut,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<bool, String> {
        let frame = match complete_frame(rbuf, self.cfg.digests, self.max_recv()) {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(false),
            Err(FrameError::HeaderDigest { .. }) if self.recovery() => return Ok(false),
            Err(e) => return Err(format!("from the target: {e}")),
        };
        self.discarded_in_a_row = 0;
        let bhs = Bhs::decode(&frame.head)
            .map_err(|e| format!("protocol error from the target: {e}"))?
            .bhs;
        self.see_stat_sn(&bhs, out, notices)?;
        if let Some(e) = bhs.target_exp_cmd_sn() {
            if self.exp_cmd_sn.is_none_or(|seen| sn_gt(e, seen)) {
                self.exp_cmd_sn = Some(e);
            }
        }
        if self.recovery() {
            if let Some(task) = self.tasks.get_mut(&bhs.itt()) {
                task.quiet_ticks = 0;
            }
        }
        if let Bhs::DataIn(d) = bhs {
            // The frame leaves the receive buffer as shared bytes, so a payload that is a
            // whole read reaches the caller without a copy.
            let bytes = rbuf.split_to(frame.total_len()).freeze();
            self.on_data_in(d, &frame, &bytes, out, notices)?;
            return Ok(true);
        }
        frame
            .verify_data_digest(rbuf)
            .map_err(|e| format!("{e} from the target"))?;
        let data = Bytes::copy_from_slice(&rbuf[frame.data_range()]);
        let ahs = Bytes::copy_from_slice(&rbuf[frame.ahs_range()]);
        rbuf.advance(frame.total_len());
        match bhs {
            Bhs::R2t(r) => self.on_r2t(&r, out, notices)?,
            Bhs::ScsiResponse(ref r) => {
                let itt = r.itt;
                if self.tasks.get(&itt).is_some_and(|t| t.r_data.is_some()) {
                    let r = r.clone();
                    return self.resent_status(&r, Pdu { bhs, ahs, data }, out, notices);
                }
                self.data_missing_before(itt, r.exp_data_sn, out, notices)?;
                self.status(itt, Pdu { bhs, ahs, data }, notices);
            }
            Bhs::Reject(_) => {
                // A Data-Out Rejected (its header is the data): its write is in recovery.
                if let Some((0x05, itt)) = iscsi_wire::reject::rejected_pdu(&data) {
                    if let Some(t) = self.tasks.get_mut(&itt) {
                        t.recovered = true;
                    }
                }
                notices.push(InitiatorNotice::Control(Pdu { bhs, ahs, data }));
            }
            _ => notices.push(InitiatorNotice::Control(Pdu { bhs, ahs, data })),
        }
        Ok(true)
    }

    /// The window carried by PDUs consumed since the last call, as a notice.
    pub fn take_window(&mut self) -> Option<InitiatorNotice> {
        self.window
            .take()
            .map(|(exp_cmd_sn, max_cmd_sn)| InitiatorNotice::Window {
                exp_cmd_sn,
                max_cmd_sn,
            })
    }

    /// ERL ≥ 1: the reader discarded a PDU whose header digest failed. Too many in a row
    /// mean the claimed lengths were wrong too: the stream is lost.
    pub fn header_digest_discarded(
        &mut self,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        self.discarded_in_a_row += 1;
        if self.discarded_in_a_row > MAX_DISCARDS_IN_A_ROW {
            return Err(format!(
                "{} PDUs in a row failed their header digest: the stream is lost",
                self.discarded_in_a_row
            ));
        }
        notices.push(InitiatorNotice::HeaderDigestDiscarded);
        Ok(())
    }

    /// ERL ≥ 1, on the session's recovery tick: what heard nothing for a few ticks asks
    /// again. A write the target still owes R2Ts (the last R2T may have been discarded) sends
    /// an R2T SNACK (all from the next R2TSN); Data-In asked for and not come (the SNACK or
    /// its answer lost too) are asked for again, as are lost statuses. SNACKs go to `out`.
    /// Returns whether any command is stalled; an error (SNACKs past their bound) ends the
    /// connection.
    pub fn probe(
        &mut self,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<bool, String> {
        if !self.recovery() {
            return Ok(false);
        }
        let mut stalled = self.probe_lost_status(out, notices)?;
        let mut ask = Vec::new();
        let mut r_data_again = Vec::new();
        let mut lost = Vec::new();
        for (itt, t) in self.tasks.iter_mut() {
            t.quiet_ticks += 1;
            if t.quiet_ticks < QUIET_TICKS_BEFORE_ASKING_AGAIN {
                continue;
            }
            stalled = true;
            if t.r_data.is_some() {
                t.quiet_ticks = 0;
                r_data_again.push(*itt);
                continue;
            }
            let owed = (t.write.len() as u64).saturating_sub(t.solicited_from as u64);
            let asked = covered(t.r2ts_seen.iter().map(|r| r.1));
            let r2ts_owed = if t.adopted {
                // What came on the old connection is not counted here: ask only when no
                // R2T came since TASK REASSIGN, and only after its retries had their time.
                t.r2ts_seen.is_empty()
                    && t.quiet_ticks >= ADOPTED_QUIET_TICKS
                    && !t.write.is_empty()
            } else {
                // A write with no R2T yet that the target has not taken up in CmdSN order
                // (an earlier command is missing: lost with another connection, or
                // discarded) is owed nothing yet: a SNACK would be Rejected.
                let taken_up = self.exp_cmd_sn.is_some_and(|e| sn_lt(t.cmd_sn, e));
                asked < owed && (taken_up || !t.r2ts_seen.is_empty())
            };
            if r2ts_owed {
                t.quiet_ticks = 0;
                t.r2t_snacks_unanswered += 1;
                if t.r2t_snacks_unanswered > MAX_UNANSWERED_R2T_SNACKS && t.recovered {
                    lost.push(*itt);
                    continue;
                }
                if t.r2t_snacks_unanswered > MAX_UNANSWERED_R2T_SNACKS {
                    return Err(format!(
                        "write ITT 0x{itt:08x}: no R2T for the {} bytes it still owes after \
                         {MAX_UNANSWERED_R2T_SNACKS} R2T SNACKs (the target lost track of it)",
                        owed - asked
                    ));
                }
                ask.push((SnackFor::R2t, *itt, t.next_r2t_sn, 0));
            } else if !t.missing.is_empty() {
                t.quiet_ticks = 0;
                ask.extend(t.missing.iter().map(|sn| (SnackFor::DataIn, *itt, *sn, 1)));
            } else if t.recovered && t.quiet_ticks >= STALLED_AFTER_RECOVERY_TICKS {
                lost.push(*itt);
            }
        }
        for itt in lost {
            self.tasks.remove(&itt);
            notices.push(InitiatorNotice::Stalled { itt });
        }
        for (what, itt, beg_run, run_length) in ask {
            self.snack(what, itt, beg_run, run_length, out, notices)?;
        }
        for itt in r_data_again {
            self.r_data_snack(itt, out, notices)?;
        }
        Ok(stalled)
    }

    /// Statuses asked for with a Status SNACK that still have not come after a few quiet
    /// ticks are asked for again.
    fn probe_lost_status(
        &mut self,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<bool, String> {
        self.status_quiet_ticks += 1;
        if self.lost_status.is_empty() || self.status_quiet_ticks < QUIET_TICKS_BEFORE_ASKING_AGAIN
        {
            return Ok(false);
        }
        self.status_quiet_ticks = 0;
        self.status_snacks += 1;
        if self.status_snacks > MAX_SNACKS_PER_COMMAND {
            return Err(format!(
                "StatSN {} still lost after {MAX_SNACKS_PER_COMMAND} Status SNACKs",
                self.lost_status[0]
            ));
        }
        for sn in self.lost_status.clone() {
            self.status_snack(sn, 1, out, notices);
        }
        Ok(true)
    }

    fn status_snack(
        &mut self,
        beg_run: u32,
        run_length: u32,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) {
        let pdu = self.snack_pdu(
            snack_type::STATUS,
            0,
            RESERVED_TAG,
            RESERVED_TAG,
            beg_run,
            run_length,
        );
        out.push(pdu);
        notices.push(InitiatorNotice::SnackSent {
            what: SnackFor::Status,
            itt: RESERVED_TAG,
            beg_run,
            run_length,
        });
    }

    fn recovery(&self) -> bool {
        self.cfg.error_recovery_level >= 1
    }

    fn max_recv(&self) -> u32 {
        self.recv_limit.max(512)
    }

    /// Notes the StatSN of a PDU that carries status: a command's status stays undelivered
    /// until it goes up ([`DataPath::status`]). At ERL ≥ 1 a StatSN past the expected one
    /// shows statuses lost on the way (their PDUs discarded): a Status SNACK asks for them;
    /// any other PDU that fills such a hole closes it.
    fn see_stat_sn(
        &mut self,
        bhs: &Bhs,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        if !bhs.advances_stat_sn() {
            return Ok(());
        }
        let Some(stat_sn) = bhs.stat_sn() else {
            return Ok(());
        };
        let command_status = matches!(bhs, Bhs::DataIn(_) | Bhs::ScsiResponse(_));
        self.status_quiet_ticks = 0;
        self.lost_status.retain(|h| *h != stat_sn);
        if self.undelivered.contains(&stat_sn) {
            if !command_status {
                self.undelivered.retain(|h| *h != stat_sn);
            }
            return Ok(());
        }
        let ahead = match self.recovery() {
            true => sn_gap("StatSN", stat_sn, self.exp_stat_sn)?,
            false => 0,
        };
        if ahead > 0 {
            let beg_run = self.exp_stat_sn;
            let lost = (0..ahead).map(|i| beg_run.wrapping_add(i));
            self.undelivered.extend(lost.clone());
            self.lost_status.extend(lost);
            self.status_snack(beg_run, ahead, out, notices);
        }
        if sn_gt(stat_sn.wrapping_add(1), self.exp_stat_sn) {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
            // Only at ERL ≥ 1 can a status be held back (at level 0 it goes up at once).
            if command_status && self.recovery() {
                self.undelivered.push(stat_sn);
            }
        }
        Ok(())
    }

    /// ERL ≥ 1: a SCSI Response whose ExpDataSN counts more Data-In than came (the last ones
    /// lost to header digest errors) asks for the rest with a Data SNACK; the status then
    /// waits for them.
    fn data_missing_before(
        &mut self,
        itt: u32,
        exp_data_sn: u32,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        if !self.recovery() {
            return Ok(());
        }
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Ok(());
        };
        let ahead = exp_data_sn.wrapping_sub(task.exp_data_sn);
        if task.read_len == 0 || !sn_gt(exp_data_sn, task.exp_data_sn) || ahead > MAX_DATA_SN_GAP {
            return Ok(());
        }
        let beg_run = task.exp_data_sn;
        task.missing
            .extend((0..ahead).map(|i| beg_run.wrapping_add(i)));
        task.exp_data_sn = exp_data_sn;
        self.snack(SnackFor::DataIn, itt, beg_run, ahead, out, notices)
    }

    fn on_r2t(
        &mut self,
        r: &R2t,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        let recovery = self.recovery();
        let ack_stat_sn = self.ack_stat_sn();
        let Some(task) = self.tasks.get_mut(&r.itt) else {
            return Err(format!("R2T for unknown ITT 0x{:08x}", r.itt));
        };
        // ERL ≥ 1: R2Ts skipped over were lost on the way (a bidirectional command's R2Ts
        // share their numbers with its Data-In, whose gaps the Data-In path finds).
        let ahead = match recovery && task.read_len == 0 {
            true => sn_gap("R2TSN", r.r2t_sn, task.next_r2t_sn)
                .map_err(|e| format!("{e} (ITT 0x{:08x})", r.itt))?,
            false => 0,
        };
        let lost = (ahead > 0).then_some((task.next_r2t_sn, ahead));
        // What R2Ts have asked for, for the probe (ERL ≥ 1 only: no bookkeeping at level 0).
        if recovery && !task.r2ts_seen.iter().any(|s| s.0 == r.r2t_sn) {
            task.r2ts_seen
                .push((r.r2t_sn, (r.buffer_offset, r.desired_len)));
            task.r2t_snacks_unanswered = 0;
        }
        if sn_gt(r.r2t_sn.wrapping_add(1), task.next_r2t_sn) {
            task.next_r2t_sn = r.r2t_sn.wrapping_add(1);
        }
        // A bidirectional command's R2Ts and Data-Ins share one sequence.
        if task.read_len > 0 && sn_gt(r.r2t_sn.wrapping_add(1), task.exp_data_sn) {
            task.exp_data_sn = r.r2t_sn.wrapping_add(1);
        }
        let len = task.write.len();
        let end = r.buffer_offset as u64 + r.desired_len as u64;
        if r.desired_len == 0 || end > len as u64 {
            return Err(format!(
                "R2T for bytes {}..{end} of a {len}-byte write",
                r.buffer_offset
            ));
        }
        if r.desired_len > self.cfg.max_burst_length {
            return Err(format!(
                "R2T desired length {} exceeds MaxBurstLength {}",
                r.desired_len, self.cfg.max_burst_length
            ));
        }
        let seq = DataOutSequence {
            itt: r.itt,
            lun: task.lun,
            ttt: r.ttt,
            exp_stat_sn: ack_stat_sn,
            max_segment: self.cfg.max_send_data_segment_length.max(512),
        };
        out.extend(seq.pdus(&task.write, r.buffer_offset, end as u32));
        self.window = Some((r.exp_cmd_sn, r.max_cmd_sn));
        if let Some((beg_run, run_length)) = lost {
            self.snack(SnackFor::R2t, r.itt, beg_run, run_length, out, notices)?;
        }
        Ok(())
    }

    /// A Data-In whose frame is `bytes`: placed, checked, and with status ends its task
    /// (at ERL ≥ 1 once no data is missing). SNACKs go to `out`.
    fn on_data_in(
        &mut self,
        d: DataIn,
        frame: &Frame,
        bytes: &Bytes,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        let recovery = self.cfg.error_recovery_level >= 1;
        let payload = bytes.slice(frame.data_range());
        if self.tasks.get(&d.itt).is_some_and(|t| t.r_data.is_some()) {
            return self.on_resent_data_in(d, frame, bytes, &payload, out, notices);
        }
        let (crc, gap) = match self.tasks.get_mut(&d.itt) {
            Some(task) => place(task, &d, &payload, frame.has_data_digest(), recovery)?,
            // Data for a task we forgot: checked, then dropped.
            None => (digest::crc32c(&payload), None),
        };
        if let Some((beg_run, run_length)) = gap {
            self.snack(SnackFor::DataIn, d.itt, beg_run, run_length, out, notices)?;
        }
        if let Err(e) = frame.check_data_digest(bytes, crc) {
            let why = format!(
                "data digest error on Data-In (got {:08x}, computed {:08x})",
                e.got, e.computed
            );
            if !recovery {
                return Err(why);
            }
            // ERL ≥ 1: the PDU (and any status in it) is asked for again; data for a task
            // we forgot is dropped.
            if let Some(task) = self.tasks.get_mut(&d.itt) {
                if !task.missing.contains(&d.data_sn) {
                    task.missing.push(d.data_sn);
                }
                self.snack(SnackFor::DataIn, d.itt, d.data_sn, 1, out, notices)?;
            }
            return Ok(());
        }
        if let Some(task) = self.tasks.get_mut(&d.itt) {
            task.missing.retain(|sn| *sn != d.data_sn);
        }
        if d.ack && recovery {
            self.data_ack(&d, payload.len() as u32, out, notices);
        }
        if !d.status_present {
            self.window = Some((d.exp_cmd_sn, d.max_cmd_sn));
            self.release_held(d.itt, notices);
            return Ok(());
        }
        if !d.final_ {
            return Err("Data-In with status but without the F bit".into());
        }
        let itt = d.itt;
        let pdu = Pdu {
            bhs: Bhs::DataIn(d),
            ahs: Bytes::new(),
            data: Bytes::new(),
        };
        self.status(itt, pdu, notices);
        Ok(())
    }

    /// A command's status (`pdu`: a SCSI Response or a Data-In with status): it ends the
    /// command, or waits while Data-In asked for again has not come.
    fn status(&mut self, itt: u32, pdu: Pdu, notices: &mut Vec<InitiatorNotice>) {
        if let Some(task) = self.tasks.get_mut(&itt) {
            if !task.missing.is_empty() {
                task.held_status = Some(pdu);
                return;
            }
        }
        if let Some(stat_sn) = pdu.bhs.stat_sn() {
            self.undelivered.retain(|h| *h != stat_sn);
        }
        let read = self
            .tasks
            .remove(&itt)
            .map_or_else(Bytes::new, |mut t| t.take_read());
        notices.push(InitiatorNotice::Status { pdu, read });
    }

    /// The last missing Data-In of a command whose status came already: it ends now.
    fn release_held(&mut self, itt: u32, notices: &mut Vec<InitiatorNotice>) {
        let held = match self.tasks.get_mut(&itt) {
            Some(t) if t.missing.is_empty() => t.held_status.take(),
            _ => None,
        };
        if let Some(pdu) = held {
            self.status(itt, pdu, notices);
        }
    }

    /// Asks for Data-In or R2Ts `beg_run`.. (`run_length` of them, 0: all) of command `itt`
    /// again, with a Data/R2T SNACK.
    fn snack(
        &mut self,
        what: SnackFor,
        itt: u32,
        beg_run: u32,
        run_length: u32,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        let epoch = self.segment_epoch;
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Ok(());
        };
        if what == SnackFor::DataIn && task.epoch != epoch {
            return self.r_data_snack(itt, out, notices);
        }
        count_snack(task, itt, what)?;
        let lun = task.lun;
        let pdu = self.snack_pdu(
            snack_type::DATA_R2T,
            lun,
            itt,
            RESERVED_TAG,
            beg_run,
            run_length,
        );
        out.push(pdu);
        notices.push(InitiatorNotice::SnackSent {
            what,
            itt,
            beg_run,
            run_length,
        });
        Ok(())
    }

    /// An R-Data SNACK for read `itt` (its Data-In were cut for a MaxRecvDataSegmentLength
    /// that has changed since): the target resends them from our last DataACK on, cut
    /// anew, then its status with the SNACK's tag. What came so far after that DataACK no
    /// longer counts, and the status already held is dropped (the tagged one replaces it).
    fn r_data_snack(
        &mut self,
        itt: u32,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        let tag = self.next_snack_tag;
        self.next_snack_tag = self.next_snack_tag.wrapping_add(1).max(1);
        let epoch = self.segment_epoch;
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Ok(());
        };
        count_snack(task, itt, SnackFor::RData)?;
        task.epoch = epoch;
        task.missing.clear();
        task.held_status = None;
        task.r_data = Some(RData {
            tag,
            placed: Vec::new(),
        });
        let lun = task.lun;
        out.push(self.snack_pdu(snack_type::R_DATA, lun, itt, tag, 0, 0));
        notices.push(InitiatorNotice::SnackSent {
            what: SnackFor::RData,
            itt,
            beg_run: 0,
            run_length: 0,
        });
        Ok(())
    }

    /// A Data-In while an R-Data SNACK is out: placed by its offset (old and resent Data-In
    /// carry the same bytes at the same offsets), counted when its digest is sound, its
    /// range no longer counted when not. A status in it is the old one: dropped.
    fn on_resent_data_in(
        &mut self,
        d: DataIn,
        frame: &Frame,
        bytes: &Bytes,
        payload: &Bytes,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        let task = self.tasks.get_mut(&d.itt).expect("an R-Data task");
        let (off, end) = data_in_range(task, &d, payload)?;
        let crc = place_bytes(task, off, end, payload, frame.has_data_digest());
        let sound = frame.check_data_digest(bytes, crc).is_ok();
        let range = (d.buffer_offset, payload.len() as u32);
        let r = task.r_data.as_mut().expect("R-Data");
        r.placed
            .retain(|&(o, n)| o + n <= range.0 || range.0 + range.1 <= o);
        if sound {
            r.placed.push(range);
            if d.ack {
                self.data_ack(&d, payload.len() as u32, out, notices);
            }
        }
        self.window = Some((d.exp_cmd_sn, d.max_cmd_sn));
        Ok(())
    }

    /// A SCSI Response while an R-Data SNACK is out: only the one carrying its tag ends the
    /// command, once every byte the read returns came again; short of that, another R-Data
    /// SNACK asks for all of it again.
    fn resent_status(
        &mut self,
        r: &iscsi_wire::ScsiResponse,
        pdu: Pdu,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<bool, String> {
        self.window = Some((r.exp_cmd_sn, r.max_cmd_sn));
        let task = self.tasks.get_mut(&r.itt).expect("an R-Data task");
        let rd = task.r_data.as_ref().expect("R-Data");
        if r.snack_tag != rd.tag {
            return Ok(true); // the status as first sent: the tagged one follows
        }
        let returned = match r.underflow {
            true => task.read_len.saturating_sub(r.residual),
            false => task.read_len,
        };
        let acked = (0, task.acked_bytes.min(returned));
        let have = covered(rd.placed.iter().copied().chain(std::iter::once(acked)));
        if have < returned as u64 {
            self.r_data_snack(r.itt, out, notices)?;
            return Ok(true);
        }
        if let Some(t) = self.tasks.get_mut(&r.itt) {
            t.r_data = None;
        }
        self.status(r.itt, pdu, notices);
        Ok(true)
    }

    /// ERL ≥ 1: a Data-In asking for acknowledgement (A bit) is answered with a DataACK
    /// naming the DataSN after it, once every Data-In before it has come (with some still
    /// asked for again, the next request acknowledges them all).
    fn data_ack(
        &mut self,
        d: &DataIn,
        len: u32,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) {
        if let Some(t) = self.tasks.get_mut(&d.itt) {
            if t.missing.iter().any(|m| sn_lt(*m, d.data_sn)) {
                return;
            }
            t.acked_bytes = t.acked_bytes.max(d.buffer_offset.saturating_add(len));
            t.acked_data_sn = d.data_sn.wrapping_add(1);
        }
        let beg_run = d.data_sn.wrapping_add(1);
        let pdu = self.snack_pdu(snack_type::DATA_ACK, d.lun, RESERVED_TAG, d.ttt, beg_run, 0);
        out.push(pdu);
        notices.push(InitiatorNotice::SnackSent {
            what: SnackFor::DataAck,
            itt: d.itt,
            beg_run,
            run_length: 0,
        });
    }

    fn snack_pdu(
        &self,
        snack_type: u8,
        lun: u64,
        itt: u32,
        ttt: u32,
        beg_run: u32,
        run_length: u32,
    ) -> Pdu {
        Pdu::new(
            Bhs::SnackRequest(SnackRequest {
                snack_type,
                lun,
                itt,
                ttt,
                exp_stat_sn: self.ack_stat_sn(),
                beg_run,
                run_length,
            }),
            Bytes::new(),
        )
    }
}

/// How many numbers a PDU numbered `got` shows were skipped while `expected` was due (serial
/// arithmetic; 0 when it is not ahead). Further ahead than [`MAX_SN_GAP`] the stream cannot
/// be trusted: an error naming `what`.
fn sn_gap(what: &str, got: u32, expected: u32) -> Result<u32, String> {
    if !sn_gt(got, expected) {
        return Ok(0);
    }
    let ahead = got.wrapping_sub(expected);
    if ahead > MAX_SN_GAP {
        return Err(format!("{what} {got} where {expected} was expected"));
    }
    Ok(ahead)
}

/// Places a Data-In payload in its task's read buffer; returns the payload's CRC32C when
/// `crc` asks for it (computed in the copy), else 0, and with `recovery` (ERL ≥ 1) the run
/// of DataSNs a gap before it shows were lost (to ask for again), or accepts a Data-In
/// asked for again.
fn place(
    task: &mut Task,
    d: &DataIn,
    payload: &Bytes,
    crc: bool,
    recovery: bool,
) -> Result<(u32, Option<(u32, u32)>), String> {
    let mut gap = None;
    let resent = recovery && task.missing.contains(&d.data_sn);
    if d.data_sn != task.exp_data_sn && !resent {
        let ahead = d.data_sn.wrapping_sub(task.exp_data_sn);
        if !recovery || ahead > MAX_DATA_SN_GAP {
            return Err(format!(
                "Data-In DataSN {} where {} was expected (ITT 0x{:08x})",
                d.data_sn, task.exp_data_sn, d.itt
            ));
        }
        task.missing.extend(task.exp_data_sn..d.data_sn);
        gap = Some((task.exp_data_sn, ahead));
        task.exp_data_sn = d.data_sn;
    }
    let (off, end) = data_in_range(task, d, payload)?;
    if !resent {
        task.exp_data_sn = task.exp_data_sn.wrapping_add(1);
    }
    let crc = place_bytes(task, off, end, payload, crc);
    Ok((crc, gap))
}

/// The bytes `off..end` of the task's read buffer a Data-In's payload goes to; past the
/// end of the read is a protocol error.
fn data_in_range(task: &Task, d: &DataIn, payload: &Bytes) -> Result<(usize, usize), String> {
    let read_len = task.read_len as usize;
    let off = d.buffer_offset as usize;
    match off.checked_add(payload.len()).filter(|&e| e <= read_len) {
        Some(end) => Ok((off, end)),
        None => Err(format!(
            "Data-In at offset {} length {} overruns the {read_len}-byte read (ITT 0x{:08x})",
            d.buffer_offset,
            payload.len(),
            d.itt
        )),
    }
}

/// Copies a checked Data-In payload to bytes `off..end` of the task's read buffer.
fn place_bytes(task: &mut Task, off: usize, end: usize, payload: &Bytes, crc: bool) -> u32 {
    let read_len = task.read_len as usize;
    let buf = &mut task.buf;
    if let Some(w) = task.whole.take() {
        // More data after a whole-read Data-In (the target resent a range): assemble.
        buf.extend_from_slice(&w);
    }
    if off == 0 && end == read_len && buf.is_empty() {
        // The whole read in one Data-In: keep the receive buffer's bytes, no copy.
        task.whole = Some(payload.clone());
        return if crc { digest::crc32c(payload) } else { 0 };
    }
    if off == buf.len() {
        // In order (the normal case): append, never zero-filling first.
        if buf.capacity() == 0 {
            buf.reserve(read_len);
        }
        if crc {
            return digest::extend_with_crc32c(buf, payload);
        }
        buf.extend_from_slice(payload);
        return 0;
    }
    if end > buf.len() {
        buf.resize(end, 0);
    }
    let dst = &mut buf[off..end];
    if crc {
        return digest::copy_with_crc32c(dst, payload);
    }
    dst.copy_from_slice(payload);
    0
}

/// Counts a SNACK `task` (ITT `itt`) sends; past [`MAX_SNACKS_PER_COMMAND`] the link is
/// taken for one that damages every resend, and the connection is given up.
fn count_snack(task: &mut Task, itt: u32, what: SnackFor) -> Result<(), String> {
    task.snacks += 1;
    if task.snacks <= MAX_SNACKS_PER_COMMAND {
        return Ok(());
    }
    let lost = if what == SnackFor::R2t {
        "R2Ts"
    } else {
        "Data-In"
    };
    Err(format!(
        "{lost} of ITT 0x{itt:08x} still lost after {MAX_SNACKS_PER_COMMAND} SNACKs"
    ))
}

/// Bytes the ranges (offset, length) cover, each byte counted once.
fn covered(ranges: impl Iterator<Item = (u32, u32)>) -> u64 {
    let mut r: Vec<(u64, u64)> = ranges
        .map(|(o, n)| (o as u64, o as u64 + n as u64))
        .collect();
    r.sort_unstable();
    let (mut total, mut end) = (0, 0);
    for (b, e) in r {
        let b = b.max(end);
        if e > b {
            total += e - b;
            end = e;
        }
    }
    total
}
