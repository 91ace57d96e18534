//! The initiator's iSCSI/TCP data phases on one connection, sans IO: fed the received
//! bytes, it answers R2Ts with Data-Out sequences, places Data-In into each command's read
//! buffer (checking DataSN, offsets and the data digest, computed in the same pass as the
//! copy), keeps a whole read that arrives in one Data-In as the receive buffer's own bytes
//! (no copy), and hands everything else up as notices.

use std::collections::HashMap;

use bytes::{Buf, Bytes, BytesMut};
use datamover::{CommandOut, InitiatorFfpConfig, InitiatorNotice};
use iscsi_session::DataOutSequence;
use iscsi_wire::serial::sn_gt;
use iscsi_wire::{Bhs, DataIn, Pdu, R2t};

use crate::frame::{complete_frame, Frame};

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
}

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
    /// StatSN expected next (for the ExpStatSN of Data-Out).
    exp_stat_sn: u32,
    tasks: HashMap<u32, Task>,
    /// ExpCmdSN/MaxCmdSN of consumed PDUs not yet reported.
    window: Option<(u32, u32)>,
}

impl DataPath {
    pub fn new(cfg: InitiatorFfpConfig) -> DataPath {
        DataPath {
            cfg,
            exp_stat_sn: cfg.exp_stat_sn,
            tasks: HashMap::new(),
            window: None,
        }
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
            },
        );
    }

    /// Drops a command's state (aborted or rejected).
    pub fn forget(&mut self, itt: u32) {
        self.tasks.remove(&itt);
    }

    /// Commands whose status has not arrived.
    pub fn in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Handles the PDU at the front of `rbuf` if it is complete: Ok(false) means more bytes
    /// are needed. Data-Out to send go to `out`, notices to `notices`; an error is a
    /// protocol or digest error from the target that ends the connection.
    pub fn receive(
        &mut self,
        rbuf: &mut BytesMut,
        out: &mut Vec<Pdu>,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<bool, String> {
        let Some(frame) = complete_frame(rbuf, self.cfg.digests, self.max_recv())
            .map_err(|e| format!("from the target: {e}"))?
        else {
            return Ok(false);
        };
        let bhs = Bhs::decode(&frame.head)
            .map_err(|e| format!("protocol error from the target: {e}"))?
            .bhs;
        if bhs.advances_stat_sn() {
            let stat_sn = u32::from_be_bytes(frame.head[24..28].try_into().expect("4 bytes"));
            if sn_gt(stat_sn.wrapping_add(1), self.exp_stat_sn) {
                self.exp_stat_sn = stat_sn.wrapping_add(1);
            }
        }
        if let Bhs::DataIn(d) = bhs {
            // The frame leaves the receive buffer as shared bytes, so a payload that is a
            // whole read reaches the caller without a copy.
            let bytes = rbuf.split_to(frame.total_len()).freeze();
            self.on_data_in(d, &frame, &bytes, notices)?;
            return Ok(true);
        }
        frame
            .verify_data_digest(rbuf)
            .map_err(|e| format!("{e} from the target"))?;
        let data = Bytes::copy_from_slice(&rbuf[frame.data_range()]);
        let ahs = Bytes::copy_from_slice(&rbuf[frame.ahs_range()]);
        rbuf.advance(frame.total_len());
        match bhs {
            Bhs::R2t(r) => self.on_r2t(&r, out)?,
            Bhs::ScsiResponse(ref r) => {
                let read = self
                    .tasks
                    .remove(&r.itt)
                    .map_or_else(Bytes::new, |mut t| t.take_read());
                let pdu = Pdu { bhs, ahs, data };
                notices.push(InitiatorNotice::Status { pdu, read });
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

    fn max_recv(&self) -> u32 {
        self.cfg.max_recv_data_segment_length.max(512)
    }

    fn on_r2t(&mut self, r: &R2t, out: &mut Vec<Pdu>) -> Result<(), String> {
        let Some(task) = self.tasks.get(&r.itt) else {
            return Err(format!("R2T for unknown ITT 0x{:08x}", r.itt));
        };
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
            exp_stat_sn: self.exp_stat_sn,
            max_segment: self.cfg.max_send_data_segment_length.max(512),
        };
        out.extend(seq.pdus(&task.write, r.buffer_offset, end as u32));
        self.window = Some((r.exp_cmd_sn, r.max_cmd_sn));
        Ok(())
    }

    /// A Data-In whose frame is `bytes`: placed, checked, and with status ends its task.
    fn on_data_in(
        &mut self,
        d: DataIn,
        frame: &Frame,
        bytes: &Bytes,
        notices: &mut Vec<InitiatorNotice>,
    ) -> Result<(), String> {
        let payload = bytes.slice(frame.data_range());
        let crc = match self.tasks.get_mut(&d.itt) {
            Some(task) => place(task, &d, &payload, frame.has_data_digest())?,
            // Data for a task we forgot: checked, then dropped.
            None => digest::crc32c(&payload),
        };
        frame.check_data_digest(bytes, crc).map_err(|e| {
            format!(
                "data digest error on Data-In (got {:08x}, computed {:08x})",
                e.got, e.computed
            )
        })?;
        if !d.status_present {
            self.window = Some((d.exp_cmd_sn, d.max_cmd_sn));
            return Ok(());
        }
        if !d.final_ {
            return Err("Data-In with status but without the F bit".into());
        }
        let read = self
            .tasks
            .remove(&d.itt)
            .map_or_else(Bytes::new, |mut t| t.take_read());
        let pdu = Pdu {
            bhs: Bhs::DataIn(d),
            ahs: Bytes::new(),
            data: Bytes::new(),
        };
        notices.push(InitiatorNotice::Status { pdu, read });
        Ok(())
    }
}

/// Places a Data-In payload in its task's read buffer; returns the payload's CRC32C when
/// `crc` asks for it (computed in the copy), else 0.
fn place(task: &mut Task, d: &DataIn, payload: &Bytes, crc: bool) -> Result<u32, String> {
    let read_len = task.read_len as usize;
    if d.data_sn != task.exp_data_sn {
        return Err(format!(
            "Data-In DataSN {} where {} was expected (ITT 0x{:08x})",
            d.data_sn, task.exp_data_sn, d.itt
        ));
    }
    let off = d.buffer_offset as usize;
    let Some(end) = off.checked_add(payload.len()).filter(|&e| e <= read_len) else {
        return Err(format!(
            "Data-In at offset {} length {} overruns the {read_len}-byte read (ITT 0x{:08x})",
            d.buffer_offset,
            payload.len(),
            d.itt
        ));
    };
    task.exp_data_sn = task.exp_data_sn.wrapping_add(1);
    let buf = &mut task.buf;
    if let Some(w) = task.whole.take() {
        // More data after a whole-read Data-In (the target resent a range): assemble.
        buf.extend_from_slice(&w);
    }
    if off == 0 && end == read_len && buf.is_empty() {
        // The whole read in one Data-In: keep the receive buffer's bytes, no copy.
        task.whole = Some(payload.clone());
        return Ok(if crc { digest::crc32c(payload) } else { 0 });
    }
    if off == buf.len() {
        // In order (the normal case): append, never zero-filling first.
        if buf.capacity() == 0 {
            buf.reserve(read_len);
        }
        if crc {
            return Ok(digest::extend_with_crc32c(buf, payload));
        }
        buf.extend_from_slice(payload);
        return Ok(0);
    }
    if end > buf.len() {
        buf.resize(end, 0);
    }
    let dst = &mut buf[off..end];
    if crc {
        return Ok(digest::copy_with_crc32c(dst, payload));
    }
    dst.copy_from_slice(payload);
    Ok(0)
}
