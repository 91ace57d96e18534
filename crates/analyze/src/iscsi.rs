//! iSCSI PDU framing over one reassembled TCP byte stream, sans-IO: finds PDU boundaries
//! (also when the capture starts mid-stream or loses bytes), detects header and data digests
//! by checking CRC32C, and turns each PDU into a [`PduRecord`] with its fields decoded.

use std::collections::VecDeque;

use iscsi_wire::{
    decode_pdu, full_cdb, lun_from_wire, parse_ahs, Bhs, DecodedBhs, Digests, FrameLayout, Opcode,
    BHS_LEN, MAX_DATA_SEGMENT,
};
use serde::Serialize;

use crate::cdb;
use crate::tcp::Chunk;

/// Direction of a PDU on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
pub enum Dir {
    /// Initiator to target.
    #[serde(rename = "I->T")]
    ToTarget,
    /// Target to initiator.
    #[serde(rename = "T->I")]
    ToInitiator,
}

impl Dir {
    pub fn arrow(self) -> &'static str {
        match self {
            Dir::ToTarget => "I->T",
            Dir::ToInitiator => "T->I",
        }
    }
}

/// One PDU as the analyzer reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PduRecord {
    /// Position in the listing (0-based, in completion-time order).
    pub index: usize,
    pub conn: usize,
    pub dir: Dir,
    /// "tcp" or "iser".
    pub transport: &'static str,
    /// Seconds since the first frame of the capture when the PDU was complete.
    pub time: f64,
    /// Capture time of the first byte (ns since the epoch).
    pub first_ts_ns: u64,
    /// Capture time of the last byte (ns since the epoch).
    pub ts_ns: u64,
    /// Frame that completed the PDU.
    pub frame: u64,
    /// Stream offset of the BHS.
    pub stream_offset: u64,
    /// Bytes on the wire (BHS, AHS, digests, data, padding).
    pub wire_len: u64,
    pub opcode: u8,
    pub name: &'static str,
    pub immediate: bool,
    #[serde(rename = "final")]
    pub final_: bool,
    pub lun: Option<u16>,
    pub itt: Option<u32>,
    pub ttt: Option<u32>,
    pub cmd_sn: Option<u32>,
    pub exp_stat_sn: Option<u32>,
    pub stat_sn: Option<u32>,
    pub exp_cmd_sn: Option<u32>,
    pub max_cmd_sn: Option<u32>,
    pub data_sn: Option<u32>,
    pub buffer_offset: Option<u32>,
    /// R2T Desired Data Transfer Length.
    pub desired_len: Option<u32>,
    /// SCSI Command Expected Data Transfer Length.
    pub expected_len: Option<u32>,
    pub data_len: u32,
    /// Decoded CDB of a SCSI Command.
    pub cdb: Option<String>,
    /// READ/WRITE commands: the first block and the number of blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lba: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// SCSI status of a response (or a Data-In with status).
    pub status: Option<u8>,
    pub sense: Option<String>,
    /// Residual count when the response reports over/underflow.
    pub residual: Option<u32>,
    /// Key=value pairs of Login/Text PDUs.
    pub text: Option<Vec<String>>,
    pub header_digest: DigestCheck,
    pub data_digest: DigestCheck,
    /// iSER: the initiator's Read and Write STags named in the Send's iSER header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_stag: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_stag: Option<u32>,
    /// iSER: the addresses (tagged offsets) that go with the Read and Write STags.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_va: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_va: Option<u64>,
    /// One-line description of the opcode-specific fields.
    pub summary: String,
}

impl PduRecord {
    /// A SCSI Command's R and W flags, read back from the end of its summary (" R", " W",
    /// " RW").
    pub fn command_flags(&self) -> (bool, bool) {
        let s = &self.summary;
        let both = s.ends_with(" RW");
        (both || s.ends_with(" R"), both || s.ends_with(" W"))
    }
}

/// Whether a digest was on the wire and whether it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DigestCheck {
    Absent,
    Ok,
    Bad,
}

impl DigestCheck {
    fn of(found: Option<u32>, computed: impl FnOnce() -> u32) -> DigestCheck {
        match found {
            None => DigestCheck::Absent,
            Some(d) if d == computed() => DigestCheck::Ok,
            Some(_) => DigestCheck::Bad,
        }
    }
}

/// A PDU cut from the stream, before it is numbered.
#[derive(Debug, Clone)]
pub struct FramedPdu {
    pub offset: u64,
    pub first_ts_ns: u64,
    pub ts_ns: u64,
    pub frame: u64,
    pub wire_len: u64,
    pub bhs: Bhs,
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
    pub header_digest: DigestCheck,
    pub data_digest: DigestCheck,
    /// The iSER header of the Send that carried the PDU (iSER only).
    pub iser: Option<iser::IserHeader>,
}

/// Counters of framing trouble.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FramerStats {
    pub resyncs: u64,
    pub skipped_bytes: u64,
    pub digest_errors: u64,
}

/// Cuts one direction's byte stream into PDUs.
#[derive(Debug)]
pub struct PduFramer {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already used.
    used: usize,
    /// Stream offset of `buf[0]`.
    buf_offset: u64,
    /// (end offset, ts, frame) of each chunk still partly in the buffer.
    marks: VecDeque<(u64, u64, u64)>,
    header_digest: Option<bool>,
    data_digest: Option<bool>,
    synced: bool,
    /// While not synced, after a search that found no boundary: the stream offset the
    /// buffer must reach before the next search.
    search_at: u64,
    /// The stream has ended: no byte follows the buffer, so a digest not yet detected cannot
    /// be behind the last PDU.
    ended: bool,
    pub stats: FramerStats,
}

/// Largest data segment accepted while searching for a PDU boundary (a larger candidate
/// would stall the search until that many bytes arrive; real data PDUs are rarely larger).
const RESYNC_MAX_DATA: u32 = 1 << 20;

/// A header found while searching for a PDU boundary, decoded, if it could be real. Besides
/// decoding, the opcodes whose Final bit RFC 7143 fixes at 1 must have it: a run of zero bytes
/// (data after a capture gap) otherwise decodes as an endless chain of NOP-Outs.
fn plausible_header(head: &[u8; BHS_LEN]) -> Option<DecodedBhs> {
    if head[0] & 0x80 != 0 {
        return None;
    }
    let final_fixed = matches!(
        Opcode::from_u8(head[0] & 0x3f),
        Some(
            Opcode::NopOut
                | Opcode::NopIn
                | Opcode::TaskMgmtRequest
                | Opcode::TaskMgmtResponse
                | Opcode::LogoutRequest
                | Opcode::LogoutResponse
                | Opcode::ScsiResponse
                | Opcode::R2t
                | Opcode::AsyncMessage
                | Opcode::Reject
                | Opcode::SnackRequest
        )
    );
    if final_fixed && head[1] & 0x80 == 0 {
        return None;
    }
    Bhs::decode(head).ok()
}

fn login_opcode(op: Opcode) -> bool {
    matches!(op, Opcode::LoginRequest | Opcode::LoginResponse)
}

impl PduFramer {
    /// `from_start`: the stream is known to start at a PDU boundary (the SYN was captured).
    pub fn new(from_start: bool) -> PduFramer {
        PduFramer {
            buf: Vec::new(),
            used: 0,
            buf_offset: 0,
            marks: VecDeque::new(),
            header_digest: None,
            data_digest: None,
            synced: from_start,
            search_at: 0,
            ended: false,
            stats: FramerStats::default(),
        }
    }

    /// The digests the login negotiated, when the capture holds it: they replace detection
    /// (which needs the 4 bytes after a header or data segment, so it cannot decide the last
    /// PDU before a pause, or before the end of the stream).
    pub fn learn_digests(&mut self, header: bool, data: bool) {
        self.header_digest.get_or_insert(header);
        self.data_digest.get_or_insert(data);
    }

    /// End of the stream: frames what the buffer still holds, taking a digest that could not be
    /// detected as absent when the bytes end where the PDU without it ends.
    pub fn finish(&mut self) -> Vec<FramedPdu> {
        self.ended = true;
        self.frame_buffered()
    }

    /// Frames every complete PDU in the buffer.
    fn frame_buffered(&mut self) -> Vec<FramedPdu> {
        let mut out = Vec::new();
        // Each round consumes bytes or returns.
        loop {
            if !self.synced && !self.resync() {
                break;
            }
            match self.next_pdu() {
                Some(p) => out.push(p),
                None => break,
            }
        }
        out
    }

    /// Digests as detected so far (header, data).
    pub fn digests(&self) -> (Option<bool>, Option<bool>) {
        (self.header_digest, self.data_digest)
    }

    /// Appends stream bytes; returns the PDUs they completed.
    pub fn push(&mut self, chunk: &Chunk) -> Vec<FramedPdu> {
        if chunk.gap_before > 0 || chunk.offset != self.buf_offset + self.buf.len() as u64 {
            // Bytes are missing: drop what was pending and look for the next header.
            self.stats.skipped_bytes += (self.buf.len() - self.used) as u64;
            self.buf.clear();
            self.used = 0;
            self.marks.clear();
            self.buf_offset = chunk.offset;
            self.synced = false;
            self.search_at = 0;
        }
        self.buf.extend_from_slice(&chunk.data);
        self.marks.push_back((
            chunk.offset + chunk.data.len() as u64,
            chunk.ts_ns,
            chunk.frame,
        ));
        let out = self.frame_buffered();
        if self.used > (1 << 20) && self.used * 2 > self.buf.len() {
            self.buf.drain(..self.used);
            self.buf_offset += self.used as u64;
            self.used = 0;
        }
        out
    }

    /// Bytes received but not yet part of a complete PDU.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.used
    }

    fn ts_at(&self, offset: u64) -> (u64, u64) {
        self.marks
            .iter()
            .find(|(end, _, _)| *end > offset)
            .or(self.marks.back())
            .map_or((0, 0), |&(_, ts, fr)| (ts, fr))
    }

    /// Whether the PDU at the front of `b` has a header digest, detecting it (into
    /// `known`) if no PDU has told yet; `ended`: no byte follows `b`. (Takes the framer's
    /// fields rather than `&mut self` so `b` can borrow the buffer in place.)
    fn header_digest_for(
        known: &mut Option<bool>,
        ended: bool,
        b: &[u8],
        op: Opcode,
        ahs_len: usize,
    ) -> Option<bool> {
        if login_opcode(op) {
            return Some(false);
        }
        if let Some(h) = *known {
            return Some(h);
        }
        let end = BHS_LEN + ahs_len;
        let Some(d) = b.get(end..end + 4) else {
            // At the end of the stream the digest cannot be there; otherwise wait for bytes.
            return ended.then_some(false);
        };
        let present = digest::crc32c(&b[..end]) == u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
        *known = Some(present);
        Some(present)
    }

    /// As [`PduFramer::header_digest_for`], for the data digest.
    fn data_digest_for(
        known: &mut Option<bool>,
        ended: bool,
        b: &[u8],
        op: Opcode,
        layout: &FrameLayout,
    ) -> Option<bool> {
        if login_opcode(op) || layout.data_len == 0 {
            return Some(false);
        }
        if let Some(d) = *known {
            return Some(d);
        }
        let start = BHS_LEN + layout.header_rest_len();
        let end = start + layout.data_len as usize + layout.pad_len;
        let Some(d) = b.get(end..end + 4) else {
            return ended.then_some(false);
        };
        let present =
            digest::crc32c(&b[start..end]) == u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
        *known = Some(present);
        Some(present)
    }

    /// Decodes the PDU at the front, if complete. The pending bytes are read where they
    /// lie: an incomplete PDU costs a header's decoding, not a copy of what is buffered.
    fn next_pdu(&mut self) -> Option<FramedPdu> {
        let b = &self.buf[self.used..];
        let head: &[u8; BHS_LEN] = b.get(..BHS_LEN)?.try_into().ok()?;
        let head = *head;
        let Ok(decoded) = Bhs::decode(&head) else {
            self.synced = false;
            return None;
        };
        let op = decoded.bhs.opcode();
        let hd =
            Self::header_digest_for(&mut self.header_digest, self.ended, b, op, decoded.ahs_len)?;
        let layout = FrameLayout::of(
            &head,
            Digests {
                header: hd,
                data: false,
            },
            MAX_DATA_SEGMENT,
        )
        .ok()?;
        let dd = Self::data_digest_for(&mut self.data_digest, self.ended, b, op, &layout)?;
        let digests = Digests {
            header: hd,
            data: dd,
        };
        let pdu = decode_pdu(b, digests, MAX_DATA_SEGMENT).ok()?;
        let offset = self.buf_offset + self.used as u64;
        let (first_ts_ns, _) = self.ts_at(offset);
        let (ts_ns, frame) = self.ts_at(offset + pdu.consumed as u64 - 1);
        let hdr_end = BHS_LEN + layout.ahs_len;
        let header_digest = DigestCheck::of(pdu.header_digest, || digest::crc32c(&b[..hdr_end]));
        let data_start = hdr_end + layout.header_digest_len;
        let data_end = data_start + layout.data_len as usize + layout.pad_len;
        let data_digest =
            DigestCheck::of(pdu.data_digest, || digest::crc32c(&b[data_start..data_end]));
        if header_digest == DigestCheck::Bad || data_digest == DigestCheck::Bad {
            self.stats.digest_errors += 1;
        }
        self.used += pdu.consumed;
        while self.marks.len() > 1 && self.marks[0].0 <= self.buf_offset + self.used as u64 {
            self.marks.pop_front();
        }
        Some(FramedPdu {
            offset,
            first_ts_ns,
            ts_ns,
            frame,
            wire_len: pdu.consumed as u64,
            bhs: pdu.pdu.bhs,
            ahs: pdu.pdu.ahs.to_vec(),
            data: pdu.pdu.data.to_vec(),
            header_digest,
            data_digest,
            iser: None,
        })
    }

    /// Whether a plausible PDU header starts at `at` (and, when its end is buffered, another
    /// one follows). `None`: more bytes are needed to tell.
    fn plausible_at(&self, at: usize) -> Option<bool> {
        let b = &self.buf[at..];
        let head: &[u8; BHS_LEN] = b.get(..BHS_LEN)?.try_into().ok()?;
        let Some(d) = plausible_header(head) else {
            return Some(false);
        };
        if d.data_len > RESYNC_MAX_DATA || d.ahs_len > 1024 {
            return Some(false);
        }
        // The next header must decode too, for one of the digest settings.
        let mut unknown = false;
        for hd in [false, true] {
            for dd in [false, true] {
                let digests = Digests {
                    header: hd,
                    data: dd,
                };
                let Ok(lay) = FrameLayout::of(head, digests, RESYNC_MAX_DATA) else {
                    continue;
                };
                let next = at + lay.total_len();
                let Some(nb) = self.buf.get(next..next + BHS_LEN) else {
                    unknown = true;
                    continue;
                };
                let nh: &[u8; BHS_LEN] = nb.try_into().ok()?;
                if plausible_header(nh).is_some() {
                    return Some(true);
                }
            }
        }
        if unknown {
            None
        } else {
            Some(false)
        }
    }

    /// Skips to the next plausible header; false when more bytes are needed. A candidate
    /// confirmed by the header after it wins over an earlier one that cannot be checked yet.
    ///
    /// A search looks at every position from the first undecided one, so it costs what is
    /// pending; after one that found nothing, the next waits until an eighth as much again
    /// has arrived (or the stream ends), so bytes arriving in small pieces cost what they
    /// are, not the square of what is pending.
    fn resync(&mut self) -> bool {
        let end = self.buf_offset + self.buf.len() as u64;
        if !self.ended && end < self.search_at {
            return false;
        }
        let mut at = self.used;
        let mut first_unknown = None;
        // Bounded by the buffer length.
        while at + BHS_LEN <= self.buf.len() {
            match self.plausible_at(at) {
                Some(true) => {
                    let skipped = (at - self.used) as u64;
                    self.stats.resyncs += 1;
                    self.stats.skipped_bytes += skipped;
                    self.used = at;
                    self.synced = true;
                    return true;
                }
                Some(false) => {}
                None => {
                    first_unknown.get_or_insert(at);
                }
            }
            at += 1;
        }
        let stop = first_unknown.unwrap_or(at);
        self.stats.skipped_bytes += (stop - self.used) as u64;
        self.used = stop;
        self.search_at = end + ((self.buf.len() - self.used) as u64 / 8).max(1);
        false
    }
}

fn tag(v: u32) -> Option<u32> {
    Some(v)
}

fn text_pairs(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn stage_name(s: iscsi_wire::Stage) -> &'static str {
    match s {
        iscsi_wire::Stage::Security => "security",
        iscsi_wire::Stage::Operational => "operational",
        iscsi_wire::Stage::FullFeature => "full-feature",
    }
}

/// Fills a record from a framed PDU (index and time are set by the caller).
pub fn record(conn: usize, dir: Dir, p: &FramedPdu) -> PduRecord {
    let op = p.bhs.opcode();
    let mut r = PduRecord {
        index: 0,
        conn,
        dir,
        transport: "tcp",
        time: 0.0,
        first_ts_ns: p.first_ts_ns,
        ts_ns: p.ts_ns,
        frame: p.frame,
        stream_offset: p.offset,
        wire_len: p.wire_len,
        opcode: op as u8,
        name: op.name(),
        immediate: false,
        final_: false,
        lun: None,
        itt: None,
        ttt: None,
        cmd_sn: None,
        exp_stat_sn: None,
        stat_sn: None,
        exp_cmd_sn: None,
        max_cmd_sn: None,
        data_sn: None,
        buffer_offset: None,
        desired_len: None,
        expected_len: None,
        data_len: p.data.len() as u32,
        cdb: None,
        lba: None,
        blocks: None,
        status: None,
        sense: None,
        residual: None,
        text: None,
        header_digest: p.header_digest,
        data_digest: p.data_digest,
        read_stag: p.iser.and_then(|h| h.read).map(|(stag, _)| stag),
        write_stag: p.iser.and_then(|h| h.write).map(|(stag, _)| stag),
        read_va: p.iser.and_then(|h| h.read).map(|(_, va)| va),
        write_va: p.iser.and_then(|h| h.write).map(|(_, va)| va),
        summary: String::new(),
    };
    let itt = p.bhs.itt();
    if itt != iscsi_wire::RESERVED_TAG || !matches!(p.bhs, Bhs::AsyncMessage(_) | Bhs::Reject(_)) {
        r.itt = Some(itt);
    }
    match &p.bhs {
        Bhs::ScsiCommand(c) => {
            r.immediate = c.immediate;
            r.final_ = c.final_;
            r.lun = Some(lun_from_wire(c.lun));
            r.cmd_sn = Some(c.cmd_sn);
            r.exp_stat_sn = Some(c.exp_stat_sn);
            r.expected_len = Some(c.expected_data_len);
            let ahs = parse_ahs(&p.ahs).unwrap_or_default();
            let full = full_cdb(c, &ahs);
            let d = cdb::describe_cdb(&full);
            let dirs = match (c.read, c.write) {
                (true, true) => " RW",
                (true, false) => " R",
                (false, true) => " W",
                _ => "",
            };
            r.summary = format!("{d} edtl {}{dirs}", c.expected_data_len);
            r.cdb = Some(d);
            if let Some((lba, blocks)) = cdb::media_range(&full) {
                r.lba = Some(lba);
                r.blocks = Some(blocks);
            }
        }
        Bhs::ScsiResponse(s) => {
            r.final_ = true;
            r.stat_sn = Some(s.stat_sn);
            r.exp_cmd_sn = Some(s.exp_cmd_sn);
            r.max_cmd_sn = Some(s.max_cmd_sn);
            r.status = Some(s.status);
            if s.overflow || s.underflow {
                r.residual = Some(s.residual);
            }
            if s.response != 0 {
                r.summary = format!("response 0x{:02x} (target failure)", s.response);
            } else {
                r.summary = cdb::status_name(s.status);
            }
            if p.data.len() >= 2 {
                let n = u16::from_be_bytes([p.data[0], p.data[1]]) as usize;
                if n > 0 {
                    let sense = &p.data[2..(2 + n).min(p.data.len())];
                    let text = cdb::describe_sense(sense);
                    r.summary.push_str(&format!(", {text}"));
                    r.sense = Some(text);
                }
            }
            if let Some(res) = r.residual {
                let kind = if s.overflow { "overflow" } else { "underflow" };
                r.summary.push_str(&format!(", {kind} residual {res}"));
            }
        }
        Bhs::DataIn(d) => {
            r.final_ = d.final_;
            r.ttt = tag(d.ttt);
            r.data_sn = Some(d.data_sn);
            r.buffer_offset = Some(d.buffer_offset);
            r.exp_cmd_sn = Some(d.exp_cmd_sn);
            r.max_cmd_sn = Some(d.max_cmd_sn);
            r.summary = format!("offset {} len {}", d.buffer_offset, p.data.len());
            if d.status_present {
                r.stat_sn = Some(d.stat_sn);
                r.status = Some(d.status);
                r.summary
                    .push_str(&format!(", status {}", cdb::status_name(d.status)));
                if d.overflow || d.underflow {
                    r.residual = Some(d.residual);
                    r.summary.push_str(&format!(", residual {}", d.residual));
                }
            }
        }
        Bhs::DataOut(d) => {
            r.final_ = d.final_;
            r.ttt = tag(d.ttt);
            r.data_sn = Some(d.data_sn);
            r.buffer_offset = Some(d.buffer_offset);
            r.exp_stat_sn = Some(d.exp_stat_sn);
            r.summary = format!("offset {} len {}", d.buffer_offset, p.data.len());
        }
        Bhs::R2t(t) => {
            r.final_ = true;
            r.ttt = tag(t.ttt);
            r.stat_sn = Some(t.stat_sn);
            r.exp_cmd_sn = Some(t.exp_cmd_sn);
            r.max_cmd_sn = Some(t.max_cmd_sn);
            r.data_sn = Some(t.r2t_sn);
            r.buffer_offset = Some(t.buffer_offset);
            r.desired_len = Some(t.desired_len);
            r.summary = format!(
                "R2TSN {} offset {} len {}",
                t.r2t_sn, t.buffer_offset, t.desired_len
            );
        }
        Bhs::NopOut(n) => {
            r.immediate = n.immediate;
            r.final_ = true;
            r.ttt = tag(n.ttt);
            r.cmd_sn = Some(n.cmd_sn);
            r.exp_stat_sn = Some(n.exp_stat_sn);
            r.summary = if n.itt == iscsi_wire::RESERVED_TAG {
                "reply to NOP-In".into()
            } else {
                "ping".into()
            };
        }
        Bhs::NopIn(n) => {
            r.final_ = true;
            r.ttt = tag(n.ttt);
            r.stat_sn = Some(n.stat_sn);
            r.exp_cmd_sn = Some(n.exp_cmd_sn);
            r.max_cmd_sn = Some(n.max_cmd_sn);
            r.summary = if n.ttt == iscsi_wire::RESERVED_TAG {
                "reply to NOP-Out".into()
            } else {
                "ping".into()
            };
        }
        Bhs::LoginRequest(l) => {
            r.immediate = true;
            r.final_ = l.transit;
            r.cmd_sn = Some(l.cmd_sn);
            r.exp_stat_sn = Some(l.exp_stat_sn);
            r.summary = format!(
                "{} -> {}{}{}",
                stage_name(l.csg),
                stage_name(l.nsg),
                if l.transit { " T" } else { "" },
                if l.cont { " C" } else { "" }
            );
            r.text = Some(text_pairs(&p.data));
        }
        Bhs::LoginResponse(l) => {
            r.final_ = l.transit;
            r.stat_sn = Some(l.stat_sn);
            r.exp_cmd_sn = Some(l.exp_cmd_sn);
            r.max_cmd_sn = Some(l.max_cmd_sn);
            r.summary = format!(
                "{} -> {}{}{} status {}/{} tsih {}",
                stage_name(l.csg),
                stage_name(l.nsg),
                if l.transit { " T" } else { "" },
                if l.cont { " C" } else { "" },
                l.status_class,
                l.status_detail,
                l.tsih
            );
            r.text = Some(text_pairs(&p.data));
        }
        Bhs::TextRequest(t) => {
            r.immediate = t.immediate;
            r.final_ = t.final_;
            r.ttt = tag(t.ttt);
            r.cmd_sn = Some(t.cmd_sn);
            r.exp_stat_sn = Some(t.exp_stat_sn);
            r.text = Some(text_pairs(&p.data));
        }
        Bhs::TextResponse(t) => {
            r.final_ = t.final_;
            r.ttt = tag(t.ttt);
            r.stat_sn = Some(t.stat_sn);
            r.exp_cmd_sn = Some(t.exp_cmd_sn);
            r.max_cmd_sn = Some(t.max_cmd_sn);
            r.text = Some(text_pairs(&p.data));
        }
        Bhs::LogoutRequest(l) => {
            r.immediate = l.immediate;
            r.final_ = true;
            r.cmd_sn = Some(l.cmd_sn);
            r.exp_stat_sn = Some(l.exp_stat_sn);
            r.summary = format!("reason {} cid {}", l.reason, l.cid);
        }
        Bhs::LogoutResponse(l) => {
            r.final_ = true;
            r.stat_sn = Some(l.stat_sn);
            r.exp_cmd_sn = Some(l.exp_cmd_sn);
            r.max_cmd_sn = Some(l.max_cmd_sn);
            r.summary = format!("response {}", l.response);
        }
        Bhs::TaskMgmtRequest(t) => {
            r.immediate = t.immediate;
            r.final_ = true;
            r.lun = Some(lun_from_wire(t.lun));
            r.cmd_sn = Some(t.cmd_sn);
            r.exp_stat_sn = Some(t.exp_stat_sn);
            r.summary = format!("function {} ref ITT 0x{:08x}", t.function, t.ref_task_tag);
        }
        Bhs::TaskMgmtResponse(t) => {
            r.final_ = true;
            r.stat_sn = Some(t.stat_sn);
            r.exp_cmd_sn = Some(t.exp_cmd_sn);
            r.max_cmd_sn = Some(t.max_cmd_sn);
            r.summary = format!("response {}", t.response);
        }
        Bhs::SnackRequest(s) => {
            r.ttt = tag(s.ttt);
            r.exp_stat_sn = Some(s.exp_stat_sn);
            r.summary = format!(
                "type {} begrun {} runlength {}",
                s.snack_type, s.beg_run, s.run_length
            );
        }
        Bhs::AsyncMessage(a) => {
            r.final_ = true;
            r.stat_sn = Some(a.stat_sn);
            r.exp_cmd_sn = Some(a.exp_cmd_sn);
            r.max_cmd_sn = Some(a.max_cmd_sn);
            r.summary = format!("event {}", a.event);
        }
        Bhs::Reject(j) => {
            r.final_ = true;
            r.stat_sn = Some(j.stat_sn);
            r.exp_cmd_sn = Some(j.exp_cmd_sn);
            r.max_cmd_sn = Some(j.max_cmd_sn);
            r.summary = format!("reason 0x{:02x}", j.reason);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use iscsi_wire::{encode_pdu, DataIn, Pdu, ScsiCommand};

    fn read10(itt: u32) -> Vec<u8> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&123u32.to_be_bytes());
        cdb[7..9].copy_from_slice(&64u16.to_be_bytes());
        let cmd = Bhs::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: 1,
            lun: 0,
            itt,
            expected_data_len: 32768,
            cmd_sn: 7,
            exp_stat_sn: 3,
            cdb,
        });
        encode_pdu(&Pdu::new(cmd, Bytes::new()), None, None)
    }

    fn data_in(itt: u32, len: usize, digests: bool) -> Vec<u8> {
        let d = Bhs::DataIn(DataIn {
            final_: true,
            ack: false,
            overflow: false,
            underflow: false,
            status_present: true,
            status: 0,
            lun: 0,
            itt,
            ttt: 0xffff_ffff,
            stat_sn: 4,
            exp_cmd_sn: 8,
            max_cmd_sn: 40,
            data_sn: 0,
            buffer_offset: 0,
            residual: 0,
        });
        let crc: &dyn Fn(&[u8]) -> u32 = &digest::crc32c;
        let data = Bytes::from(vec![0xab; len]);
        if digests {
            encode_pdu(&Pdu::new(d, data), Some(crc), Some(crc))
        } else {
            encode_pdu(&Pdu::new(d, data), None, None)
        }
    }

    fn chunk(offset: u64, data: &[u8], ts: u64) -> Chunk {
        Chunk {
            offset,
            data: data.to_vec(),
            ts_ns: ts,
            frame: ts,
            gap_before: 0,
        }
    }

    /// A 4 MiB Data-In arriving 7 bytes at a time (600,000 chunks) frames in time linear in
    /// its bytes: within 20 s, where a copy of what is pending per chunk would take minutes.
    #[test]
    fn a_large_pdu_in_small_chunks_frames_in_linear_time() {
        let mut bytes = data_in(3, 4 << 20, false);
        let pdu_len = bytes.len();
        bytes.extend(read10(4));
        let mut f = PduFramer::new(true);
        let limit = std::time::Duration::from_secs(20);
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        for (i, piece) in bytes.chunks(7).enumerate() {
            out.extend(f.push(&chunk(i as u64 * 7, piece, i as u64)));
            assert!(
                started.elapsed() < limit,
                "{} of {} bytes framed after {limit:?}",
                i * 7,
                bytes.len()
            );
        }
        assert_eq!(out.len(), 2, "the Data-In and the READ(10) after it");
        assert_eq!(out[0].wire_len as usize, pdu_len);
        assert_eq!(out[0].data.len(), 4 << 20);
        assert!(out[0].data.iter().all(|&b| b == 0xab));
        assert_eq!(out[1].offset as usize, pdu_len);
        assert_eq!(f.pending(), 0);
    }

    /// After a gap, 400 KB of bytes each of which starts a plausible header (a Data-Out
    /// of 0x050505 bytes) whose successor is not in yet, arriving 7 bytes at a time: the
    /// search for a boundary costs a bounded number of looks per byte: within 20 s, where
    /// looking again at every undecided position for every chunk would not be.
    #[test]
    fn resync_over_undecided_candidates_is_linear() {
        let mut bytes = vec![0x05u8; 400_000];
        bytes.extend(read10(9));
        bytes.extend(read10(10));
        let mut f = PduFramer::new(false);
        let limit = std::time::Duration::from_secs(20);
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        for (i, piece) in bytes.chunks(7).enumerate() {
            out.extend(f.push(&chunk(1000 + i as u64 * 7, piece, i as u64)));
            assert!(
                started.elapsed() < limit,
                "{} of {} bytes searched after {limit:?}",
                i * 7,
                bytes.len()
            );
        }
        out.extend(f.finish());
        // The first position is confirmed once the header after its 329,036 bytes is in;
        // the next "PDU" (more 0x05 bytes) never completes, so the commands stay unframed.
        let framed: Vec<_> = out
            .iter()
            .map(|p| (p.offset, p.wire_len, p.bhs.opcode()))
            .collect();
        assert_eq!(framed, [(1000, 329_036, Opcode::DataOut)]);
        assert_eq!((f.stats.resyncs, f.stats.skipped_bytes), (1, 0));
    }

    #[test]
    fn pdus_split_across_chunks() {
        let mut bytes = read10(1);
        bytes.extend(read10(2));
        let mut f = PduFramer::new(true);
        let a = f.push(&chunk(0, &bytes[..30], 1));
        assert!(a.is_empty());
        let b = f.push(&chunk(30, &bytes[30..60], 2));
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].first_ts_ns, b[0].ts_ns), (1, 2));
        let c = f.push(&chunk(60, &bytes[60..], 3));
        assert_eq!(c.len(), 1);
        let r = record(0, Dir::ToTarget, &c[0]);
        assert_eq!(r.cdb.as_deref(), Some("READ(10) LBA 123 len 64"));
        assert_eq!(r.itt, Some(2));
    }

    #[test]
    fn digests_are_detected_and_checked() {
        let mut bytes = data_in(5, 1001, true);
        bytes.extend(data_in(6, 17, true));
        let mut f = PduFramer::new(true);
        let out = f.push(&chunk(0, &bytes, 1));
        assert_eq!(out.len(), 2);
        assert_eq!(f.digests(), (Some(true), Some(true)));
        assert_eq!(out[1].header_digest, DigestCheck::Ok);
        assert_eq!(out[1].data_digest, DigestCheck::Ok);
        assert_eq!(out[0].data.len(), 1001);
        let r = record(0, Dir::ToInitiator, &out[0]);
        assert_eq!(r.status, Some(0));

        let plain = data_in(5, 10, false);
        let mut g = PduFramer::new(true);
        let out = g.push(&chunk(0, &[plain.clone(), plain].concat(), 1));
        assert_eq!(out.len(), 2);
        assert_eq!(g.digests(), (Some(false), Some(false)));
    }

    /// A data-carrying PDU that ends its stream: detection of the data digest needs 4 bytes
    /// that never come, so only the end of the stream (or the login's answer) frames it.
    #[test]
    fn the_last_pdu_of_a_stream_is_framed_when_the_stream_ends() {
        let bytes = data_in(7, 22, false);
        let mut f = PduFramer::new(true);
        assert!(f.push(&chunk(0, &bytes, 1)).is_empty());
        let out = f.finish();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data.len(), 22);
        assert_eq!(out[0].data_digest, DigestCheck::Absent);

        let mut g = PduFramer::new(true);
        g.learn_digests(false, false);
        assert_eq!(g.push(&chunk(0, &bytes, 1)).len(), 1);
        // A PDU cut short by the end of the capture stays unframed.
        let mut h = PduFramer::new(true);
        assert!(h.push(&chunk(0, &bytes[..60], 1)).is_empty());
        assert!(h.finish().is_empty());
    }

    #[test]
    fn resync_after_missing_bytes() {
        let mut bytes = data_in(1, 100, false);
        let second_at = bytes.len();
        bytes.extend(data_in(2, 100, false));
        bytes.extend(data_in(3, 100, false));
        // Mid-stream start: the first 20 bytes of PDU 1 are not in the capture.
        let mut f = PduFramer::new(false);
        let out = f.push(&chunk(20, &bytes[20..], 1));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].offset as usize, second_at);
        assert_eq!(f.stats.skipped_bytes as usize, second_at - 20);
    }

    #[test]
    fn zero_data_after_a_gap_is_not_taken_for_nop_outs() {
        // A Data-In of zeros whose first bytes were lost, then a real PDU.
        let mut zeros = data_in(1, 4096, false);
        zeros[48..].fill(0);
        let next_at = zeros.len();
        let mut bytes = zeros;
        bytes.extend(read10(2));
        bytes.extend(read10(3));
        let mut f = PduFramer::new(false);
        let out = f.push(&chunk(100, &bytes[100..], 1));
        let ops: Vec<u8> = out.iter().map(|p| p.bhs.opcode() as u8).collect();
        assert_eq!(ops, [0x01, 0x01], "only the two commands after the zeros");
        assert_eq!(out[0].offset as usize, next_at);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut f = PduFramer::new(false);
        let mut x: u32 = 12345;
        let junk: Vec<u8> = (0..20000)
            .map(|_| {
                x = x.wrapping_mul(1103515245).wrapping_add(12345);
                (x >> 16) as u8
            })
            .collect();
        for (i, c) in junk.chunks(777).enumerate() {
            f.push(&chunk((i * 777) as u64, c, i as u64));
        }
    }
}
