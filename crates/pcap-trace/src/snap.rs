//! Traces that stay small on long runs (`--trace-snap N`): each direction of a connection is
//! cut at its iSCSI PDU boundaries, and of a SCSI Command's, Data-Out's or Data-In's data
//! segment only the first N bytes are kept; the rest (payload, padding, data digest) is left
//! out of the captured bytes, as tcpdump's snap length leaves out the end of a packet, while
//! the frame's original length still counts it. Headers, and every other PDU whole (login,
//! text, responses, NOPs), are kept, so the trace decodes and its byte counts are right.
//!
//! Sans IO: [`PduSnap::split`] maps stream bytes to kept and left-out runs. The digests the
//! login settles (read from the Login Responses, whichever direction carries them) are shared
//! by the two directions of the connection through [`Negotiated`].

use iscsi_wire::{Digests, FrameLayout, Opcode, BHS_LEN};

/// The digests a connection's login settled, once it ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct Negotiated {
    full_feature: bool,
    header: bool,
    data: bool,
}

impl Negotiated {
    fn digests(&self) -> Digests {
        if !self.full_feature {
            return Digests::default();
        }
        Digests {
            header: self.header,
            data: self.data,
        }
    }

    /// A whole Login Response: its digest answers, and whether the login ends with it.
    fn login_response(&mut self, bhs: &[u8], text: &[u8]) {
        let a = iscsi_wire::login_digest_answers(bhs, text);
        self.header = a.header.unwrap_or(self.header);
        self.data = a.data.unwrap_or(self.data);
        self.full_feature |= a.ends_login;
    }
}

/// A run of stream bytes: kept in the trace, or left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub len: usize,
    pub kept: bool,
}

/// One direction of one connection.
#[derive(Debug)]
pub struct PduSnap {
    snap: usize,
    /// The current PDU's header bytes so far (BHS, AHS, header digest).
    header: Vec<u8>,
    /// Header bytes the current PDU has (BHS_LEN until the BHS is known).
    header_len: usize,
    /// Of the current PDU's data part (payload, padding, data digest): bytes still to keep,
    /// then bytes still to leave out.
    keep_left: usize,
    leave_left: usize,
    /// A Login Response's text, gathered to read its digest answers.
    login_text: Option<Vec<u8>>,
}

/// PDUs whose data segment is bulk data, cut to the snap length.
fn bulk(opcode: u8) -> bool {
    [Opcode::ScsiCommand, Opcode::DataOut, Opcode::DataIn]
        .iter()
        .any(|&o| o as u8 == opcode)
}

impl PduSnap {
    /// Keeps `snap` bytes of each bulk data segment.
    pub fn new(snap: usize) -> PduSnap {
        PduSnap {
            snap,
            header: Vec::with_capacity(BHS_LEN),
            header_len: BHS_LEN,
            keep_left: 0,
            leave_left: 0,
            login_text: None,
        }
    }

    /// The runs `bytes` (the next bytes of the stream) fall into, in order.
    pub fn split(&mut self, bytes: &[u8], negotiated: &mut Negotiated) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        let mut push = |len: usize, kept: bool| {
            if len == 0 {
                return;
            }
            match runs.last_mut() {
                Some(r) if r.kept == kept => r.len += len,
                _ => runs.push(Run { len, kept }),
            }
        };
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            if self.keep_left > 0 {
                let n = self.keep_left.min(rest.len());
                if let Some(text) = self.login_text.as_mut() {
                    text.extend_from_slice(&rest[..n]);
                }
                push(n, true);
                self.keep_left -= n;
                at += n;
                if self.keep_left == 0 && self.leave_left == 0 {
                    self.end_pdu(negotiated);
                }
                continue;
            }
            if self.leave_left > 0 {
                let n = self.leave_left.min(rest.len());
                push(n, false);
                self.leave_left -= n;
                at += n;
                if self.leave_left == 0 {
                    self.end_pdu(negotiated);
                }
                continue;
            }
            // In the header.
            let n = (self.header_len - self.header.len()).min(rest.len());
            self.header.extend_from_slice(&rest[..n]);
            push(n, true);
            at += n;
            if self.header.len() == BHS_LEN && self.header_len == BHS_LEN {
                self.header_len = BHS_LEN + self.layout(negotiated).header_rest_len();
            }
            if self.header.len() == self.header_len {
                self.start_data(negotiated);
            }
        }
        runs
    }

    /// The current PDU's layout (its BHS is complete). No data segment length is refused:
    /// a trace records whatever the peers sent.
    fn layout(&self, negotiated: &Negotiated) -> FrameLayout {
        let bhs: &[u8; BHS_LEN] = self.header[..BHS_LEN].try_into().expect("BHS_LEN bytes");
        FrameLayout::of(bhs, negotiated.digests(), u32::MAX).expect("no length exceeds u32::MAX")
    }

    /// The header is complete: how much of the data part to keep and leave out.
    fn start_data(&mut self, negotiated: &mut Negotiated) {
        let layout = self.layout(negotiated);
        let data_part = layout.data_part_len();
        let opcode = self.header[0] & 0x3f;
        self.keep_left = if bulk(opcode) {
            self.snap.min(data_part)
        } else {
            data_part
        };
        self.leave_left = data_part - self.keep_left;
        if opcode == Opcode::LoginResponse as u8 {
            self.login_text = Some(Vec::with_capacity(layout.data_len as usize));
        }
        if data_part == 0 {
            self.end_pdu(negotiated);
        }
    }

    fn end_pdu(&mut self, negotiated: &mut Negotiated) {
        if let Some(text) = self.login_text.take() {
            negotiated.login_response(&self.header, &text);
        }
        self.header.clear();
        self.header_len = BHS_LEN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use iscsi_wire::testing::pdu_bytes as pdu;

    #[test]
    fn bulk_data_is_left_out_after_the_snap_and_headers_and_login_are_kept() {
        let mut login = pdu(
            0x23,
            b"HeaderDigest=CRC32C\0DataDigest=CRC32C\0",
            Digests::default(),
        );
        login[1] = 0x87;
        let d = Digests {
            header: true,
            data: true,
        };
        let data_in = pdu(0x25, &[7; 1001], d);
        let status = pdu(0x21, &[], d);
        let stream = [login.clone(), data_in.clone(), status.clone()].concat();
        let mut negotiated = Negotiated::default();
        let mut snap = PduSnap::new(16);
        // Any cut of the stream into reads gives the same runs.
        let mut runs: Vec<Run> = Vec::new();
        for chunk in stream.chunks(37) {
            for r in snap.split(chunk, &mut negotiated) {
                match runs.last_mut() {
                    Some(l) if l.kept == r.kept => l.len += r.len,
                    _ => runs.push(r),
                }
            }
        }
        let data_in_header = BHS_LEN + 4;
        assert_eq!(
            runs,
            [
                Run {
                    len: login.len() + data_in_header + 16,
                    kept: true
                },
                Run {
                    len: data_in.len() - data_in_header - 16,
                    kept: false
                },
                Run {
                    len: status.len(),
                    kept: true
                },
            ]
        );
        assert_eq!(negotiated.digests(), d);
    }

    #[test]
    fn a_pdu_that_is_not_bulk_data_is_kept_whole_whatever_its_length() {
        let mut negotiated = Negotiated::default();
        let mut snap = PduSnap::new(0);
        let mut junk = vec![0xffu8; 200];
        junk[4] = 0;
        let runs = snap.split(&junk, &mut negotiated);
        assert_eq!(
            runs,
            [Run {
                len: 200,
                kept: true
            }]
        );
    }
}
