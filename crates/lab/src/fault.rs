//! Fault injection for the proxy, sans-IO: what to do to one relayed byte stream, and where.
//! A [`Fault`] names a connection (in accept order), a direction, a point (the Nth PDU of
//! an opcode, or a byte count) and an action: cut the connection, stall the direction,
//! drop the PDU, or flip one byte of it. A [`StreamCutter`] takes the bytes of one direction
//! as they arrive and gives back the pieces the proxy delivers, stalls and cuts.
//!
//! Cutting into PDUs needs the digests the login settled: the target's Login Responses carry
//! the answers (`HeaderDigest=CRC32C`, `DataDigest=CRC32C`) and the final one (transit to
//! full feature phase, success) switches both directions to them. Both directions share one
//! [`LoginWatch`]; the initiator cannot send a full-feature PDU before the proxy has relayed
//! that response, so the upstream direction always frames with the settled digests.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use iscsi_wire::{Digests, FrameLayout, Opcode, BHS_LEN};

/// Which direction of the relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to upstream server.
    Up,
    /// Upstream server to client.
    Down,
}

/// Where in a direction's stream a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// The `nth` (1-based) PDU of this opcode (any opcode: `None`) in the direction.
    Pdu { opcode: Option<u8>, nth: u32 },
    /// The byte at this offset (0-based) of the direction's stream.
    Byte(u64),
    /// Each PDU of this opcode (any: `None`) with probability 1/`one_in`, on every
    /// connection, again and again (a seeded generator: the same run fires at the same PDUs).
    Every { opcode: Option<u8>, one_in: u32 },
}

/// Which byte of a PDU a corruption flips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PduByte {
    /// Counted from the PDU's first byte (0..48 is the BHS).
    Pdu(usize),
    /// Counted from the first byte of the data segment.
    Data(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Close both sides of the connection (they see the end of the stream, then a reset);
    /// the bytes before the point are delivered first.
    Reset,
    /// Hold the direction's bytes from the point on for this long.
    Stall(Duration),
    /// Leave the PDU out of the stream (a PDU point only).
    Drop,
    /// Flip every bit of one byte: of the PDU at a PDU point, the byte itself at a byte point.
    Corrupt(PduByte),
}

/// One fault: `conn` is the relayed connection's place in accept order (0: the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub conn: usize,
    pub direction: Direction,
    pub at: FaultPoint,
    pub action: FaultAction,
}

/// PDU names as faults spell them.
const OPCODE_NAMES: &[(&str, u8)] = &[
    ("nop-out", Opcode::NopOut as u8),
    ("scsi-cmd", Opcode::ScsiCommand as u8),
    ("tmf-req", Opcode::TaskMgmtRequest as u8),
    ("login-req", Opcode::LoginRequest as u8),
    ("text-req", Opcode::TextRequest as u8),
    ("data-out", Opcode::DataOut as u8),
    ("logout-req", Opcode::LogoutRequest as u8),
    ("snack", Opcode::SnackRequest as u8),
    ("nop-in", Opcode::NopIn as u8),
    ("scsi-resp", Opcode::ScsiResponse as u8),
    ("tmf-resp", Opcode::TaskMgmtResponse as u8),
    ("login-resp", Opcode::LoginResponse as u8),
    ("text-resp", Opcode::TextResponse as u8),
    ("data-in", Opcode::DataIn as u8),
    ("logout-resp", Opcode::LogoutResponse as u8),
    ("r2t", Opcode::R2t as u8),
    ("async", Opcode::AsyncMessage as u8),
    ("reject", Opcode::Reject as u8),
];

/// How a fault is written on the command line.
pub const FAULT_SYNTAX: &str = "DIR:POINT:ACTION[:conn=N] with DIR up|down, POINT OPCODE#N \
     (OPCODE one of nop-out scsi-cmd login-req text-req data-out logout-req snack nop-in \
     scsi-resp login-resp text-resp data-in logout-resp r2t async reject tmf-req tmf-resp any), \
     OPCODE%N (each such PDU with probability 1/N, on every connection) or byte=N, ACTION reset | stall=SECONDS | drop | corrupt=N | corrupt=data+N \
     (e.g. down:data-in#3:corrupt=data+100, up:data-out#2:reset, down:nop-in#1:stall=30)";

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = |why: &str| format!("fault {s:?}: {why}; expected {FAULT_SYNTAX}");
        let parts: Vec<&str> = s.split(':').collect();
        if !(3..=4).contains(&parts.len()) {
            return Err(bad("three or four ':'-separated parts"));
        }
        let direction = match parts[0] {
            "up" => Direction::Up,
            "down" => Direction::Down,
            _ => return Err(bad("the direction is up or down")),
        };
        let at = parse_point(parts[1])
            .ok_or_else(|| bad("the point is OPCODE#N, OPCODE%N or byte=N"))?;
        let action = parse_action(parts[2]).ok_or_else(|| bad("unknown action"))?;
        let conn = match parts.get(3) {
            None => 0,
            Some(c) => c
                .strip_prefix("conn=")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad("the fourth part is conn=N"))?,
        };
        if matches!(at, FaultPoint::Byte(_)) && action == FaultAction::Drop {
            return Err(bad("drop needs a PDU point"));
        }
        if matches!(at, FaultPoint::Byte(_))
            && matches!(action, FaultAction::Corrupt(c) if c != PduByte::Pdu(0))
        {
            return Err(bad(
                "at a byte point, corrupt flips that byte: write corrupt=0",
            ));
        }
        Ok(Fault {
            conn,
            direction,
            at,
            action,
        })
    }
}

impl std::fmt::Display for Fault {
    /// As it is parsed: `DIR:POINT:ACTION:conn=N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = match self.direction {
            Direction::Up => "up",
            Direction::Down => "down",
        };
        write!(f, "{dir}:")?;
        match self.at {
            FaultPoint::Byte(b) => write!(f, "byte={b}")?,
            FaultPoint::Pdu { opcode, nth } => write!(f, "{}#{nth}", opcode_name(opcode))?,
            FaultPoint::Every { opcode, one_in } => write!(f, "{}%{one_in}", opcode_name(opcode))?,
        }
        match self.action {
            FaultAction::Reset => write!(f, ":reset")?,
            FaultAction::Drop => write!(f, ":drop")?,
            FaultAction::Stall(d) => write!(f, ":stall={}", d.as_secs_f64())?,
            FaultAction::Corrupt(PduByte::Pdu(i)) => write!(f, ":corrupt={i}")?,
            FaultAction::Corrupt(PduByte::Data(i)) => write!(f, ":corrupt=data+{i}")?,
        }
        write!(f, ":conn={}", self.conn)
    }
}

fn opcode_name(opcode: Option<u8>) -> &'static str {
    OPCODE_NAMES
        .iter()
        .find(|(_, o)| Some(*o) == opcode)
        .map_or("any", |(n, _)| n)
}

fn parse_point(p: &str) -> Option<FaultPoint> {
    if let Some(n) = p.strip_prefix("byte=") {
        return n.parse().ok().map(FaultPoint::Byte);
    }
    let opcode_of = |name: &str| match name {
        "any" => Some(None),
        _ => Some(Some(OPCODE_NAMES.iter().find(|(n, _)| *n == name)?.1)),
    };
    if let Some((name, one_in)) = p.split_once('%') {
        let one_in: u32 = one_in.parse().ok().filter(|&n| n > 0)?;
        return Some(FaultPoint::Every {
            opcode: opcode_of(name)?,
            one_in,
        });
    }
    let (name, nth) = p.split_once('#')?;
    let nth: u32 = nth.parse().ok().filter(|&n| n > 0)?;
    Some(FaultPoint::Pdu {
        opcode: opcode_of(name)?,
        nth,
    })
}

fn parse_action(a: &str) -> Option<FaultAction> {
    Some(match a.split_once('=') {
        None if a == "reset" => FaultAction::Reset,
        None if a == "drop" => FaultAction::Drop,
        Some(("stall", secs)) => {
            FaultAction::Stall(Duration::try_from_secs_f64(secs.parse().ok()?).ok()?)
        }
        Some(("corrupt", at)) => FaultAction::Corrupt(match at.strip_prefix("data+") {
            Some(k) => PduByte::Data(k.parse().ok()?),
            None => PduByte::Pdu(at.parse().ok()?),
        }),
        _ => return None,
    })
}

/// The digests a connection's login settled, shared by its two directions.
#[derive(Debug, Default)]
pub struct LoginWatch {
    full_feature: AtomicBool,
    header: AtomicBool,
    data: AtomicBool,
}

impl LoginWatch {
    /// Digests framing the PDUs from now on (none during login).
    pub fn digests(&self) -> Digests {
        if !self.full_feature.load(Ordering::Acquire) {
            return Digests::default();
        }
        Digests {
            header: self.header.load(Ordering::Acquire),
            data: self.data.load(Ordering::Acquire),
        }
    }

    /// Reads a Login Response: its digest answers, and whether it ends the login.
    fn login_response(&self, pdu: &[u8], layout: &FrameLayout) {
        let start = BHS_LEN + layout.header_rest_len();
        let text = pdu
            .get(start..start + layout.data_len as usize)
            .unwrap_or(&[]);
        let a = iscsi_wire::login_digest_answers(pdu, text);
        if let Some(h) = a.header {
            self.header.store(h, Ordering::Release);
        }
        if let Some(d) = a.data {
            self.data.store(d, Ordering::Release);
        }
        if a.ends_login {
            self.full_feature.store(true, Ordering::Release);
        }
    }
}

/// What the proxy does with the next part of a direction.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Deliver these bytes: a whole PDU (its opcode known) or a run of stream bytes.
    Bytes { bytes: Vec<u8>, opcode: Option<u8> },
    /// Hold what follows for this long.
    Stall(Duration),
    /// Cut the connection; nothing more is delivered.
    Reset,
}

/// One direction of one connection: frames PDUs while a fault or the caller needs them, and
/// applies the faults when their points pass.
pub struct StreamCutter {
    direction: Direction,
    conn: usize,
    /// Faults not yet fired (this connection and direction only).
    faults: Vec<(FaultPoint, FaultAction)>,
    /// Faults fired since the caller last asked.
    fired: Vec<Fault>,
    /// The caller wants every PDU cut out, faults or not (the slow-target hold).
    always_frame: bool,
    /// Some fault of this connection needs PDUs framed: the login is read for its digests.
    watch_login: bool,
    login: std::sync::Arc<LoginWatch>,
    /// Bytes of an incomplete PDU.
    pending: Vec<u8>,
    /// Stream bytes taken in so far.
    offset: u64,
    /// PDUs seen, per opcode and in all.
    seen: [u32; 64],
    seen_any: u32,
    reset: bool,
    /// xorshift64 state for `Every` points (seeded by connection and direction).
    rng: u64,
}

impl StreamCutter {
    pub fn new(
        conn: usize,
        direction: Direction,
        faults: &[Fault],
        always_frame: bool,
        login: std::sync::Arc<LoginWatch>,
    ) -> StreamCutter {
        let applies = |f: &Fault| f.conn == conn || matches!(f.at, FaultPoint::Every { .. });
        let watch_login = always_frame
            || faults.iter().any(|f| {
                applies(f) && matches!(f.at, FaultPoint::Pdu { .. } | FaultPoint::Every { .. })
            });
        StreamCutter {
            direction,
            conn,
            fired: Vec::new(),
            watch_login,
            faults: faults
                .iter()
                .filter(|f| applies(f) && f.direction == direction)
                .map(|f| (f.at, f.action))
                .collect(),
            always_frame,
            login,
            pending: Vec::new(),
            offset: 0,
            seen: [0; 64],
            seen_any: 0,
            reset: false,
            rng: 0x9e37_79b9_7f4a_7c15 ^ ((conn as u64) << 1 | (direction == Direction::Up) as u64),
        }
    }

    /// The faults fired since the last call, in order.
    pub fn take_fired(&mut self) -> Vec<Fault> {
        std::mem::take(&mut self.fired)
    }

    fn record(&mut self, at: FaultPoint, action: FaultAction) {
        self.fired.push(Fault {
            conn: self.conn,
            direction: self.direction,
            at,
            action,
        });
    }

    /// Whether the cutter changes or cuts anything (if not, bytes may pass straight on).
    pub fn is_active(&self) -> bool {
        self.framing() || !self.faults.is_empty() || !self.pending.is_empty()
    }

    fn framing(&self) -> bool {
        let in_login = !self.login.full_feature.load(Ordering::Acquire);
        self.always_frame
            || self.watch_login && self.direction == Direction::Down && in_login
            || self
                .faults
                .iter()
                .any(|(at, _)| matches!(at, FaultPoint::Pdu { .. } | FaultPoint::Every { .. }))
    }

    /// Takes the next bytes of the stream; returns what to deliver, stall and cut, in order.
    pub fn push(&mut self, input: &[u8]) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.reset {
            return out;
        }
        let start = self.offset;
        self.offset += input.len() as u64;
        // Byte points inside this chunk, in stream order.
        let mut fired: Vec<(u64, FaultAction)> = Vec::new();
        self.faults.retain(|&(at, action)| match at {
            FaultPoint::Byte(b) if b >= start && b < start + input.len() as u64 => {
                fired.push((b - start, action));
                false
            }
            _ => true,
        });
        fired.sort_by_key(|&(at, _)| at);
        // A copy only when a byte of this chunk is to be flipped.
        let mut input = std::borrow::Cow::Borrowed(input);
        let mut from = 0usize;
        for (at, action) in fired {
            self.record(FaultPoint::Byte(start + at), action);
            let at = at as usize;
            match action {
                FaultAction::Corrupt(_) => input.to_mut()[at] ^= 0xff,
                FaultAction::Stall(d) => {
                    self.take(&input[from..at], &mut out);
                    out.push(Piece::Stall(d));
                    from = at;
                }
                FaultAction::Reset => {
                    self.take(&input[from..at], &mut out);
                    self.cut(&mut out);
                    return out;
                }
                FaultAction::Drop => {}
            }
        }
        self.take(&input[from..], &mut out);
        out
    }

    fn cut(&mut self, out: &mut Vec<Piece>) {
        if !self.pending.is_empty() {
            out.push(Piece::Bytes {
                bytes: std::mem::take(&mut self.pending),
                opcode: None,
            });
        }
        out.push(Piece::Reset);
        self.reset = true;
    }

    /// Frames `bytes` (when needed) and applies PDU faults.
    fn take(&mut self, bytes: &[u8], out: &mut Vec<Piece>) {
        if self.reset || bytes.is_empty() {
            return;
        }
        if !self.framing() && self.pending.is_empty() {
            out.push(Piece::Bytes {
                bytes: bytes.to_vec(),
                opcode: None,
            });
            return;
        }
        self.pending.extend_from_slice(bytes);
        while let Some(head) = self.pending.get(..BHS_LEN) {
            let head: [u8; BHS_LEN] = head.try_into().expect("BHS_LEN bytes");
            let Ok(layout) = FrameLayout::of(&head, self.login.digests(), u32::MAX) else {
                break;
            };
            let len = layout.total_len();
            if self.pending.len() < len {
                break;
            }
            let mut pdu: Vec<u8> = self.pending.drain(..len).collect();
            let opcode = pdu[0] & 0x3f;
            if opcode == Opcode::LoginResponse as u8 {
                self.login.login_response(&pdu, &layout);
            }
            if !self.apply_pdu_faults(opcode, &mut pdu, &layout, out) {
                return;
            }
            if !self.framing() {
                // Nothing left to frame for: the rest of the stream passes as it comes.
                if !self.pending.is_empty() {
                    out.push(Piece::Bytes {
                        bytes: std::mem::take(&mut self.pending),
                        opcode: None,
                    });
                }
                return;
            }
        }
    }

    /// Counts the PDU and applies the faults whose point it is; false once the connection is
    /// cut. The PDU (unless dropped) is pushed to `out`.
    fn apply_pdu_faults(
        &mut self,
        opcode: u8,
        pdu: &mut Vec<u8>,
        layout: &FrameLayout,
        out: &mut Vec<Piece>,
    ) -> bool {
        self.seen[opcode as usize] += 1;
        self.seen_any += 1;
        let (of_opcode, any) = (self.seen[opcode as usize], self.seen_any);
        let mut actions = Vec::new();
        let mut rng = self.rng;
        self.faults.retain(|&(at, action)| match at {
            FaultPoint::Every { opcode: o, one_in } if o.is_none_or(|o| o == opcode) => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if rng.is_multiple_of(one_in as u64) {
                    actions.push((at, action));
                }
                true // fires again later
            }
            FaultPoint::Pdu {
                opcode: Some(o),
                nth,
            } if o == opcode && nth == of_opcode => {
                actions.push((at, action));
                false
            }
            FaultPoint::Pdu { opcode: None, nth } if nth == any => {
                actions.push((at, action));
                false
            }
            _ => true,
        });
        self.rng = rng;
        let mut keep = true;
        for (at, action) in actions {
            self.record(at, action);
            match action {
                FaultAction::Reset => {
                    // What follows the PDU is after the point: never delivered.
                    self.pending.clear();
                    self.cut(out);
                    return false;
                }
                FaultAction::Stall(d) => out.push(Piece::Stall(d)),
                FaultAction::Drop => keep = false,
                FaultAction::Corrupt(which) => {
                    let i = match which {
                        PduByte::Pdu(i) => i,
                        PduByte::Data(i) => BHS_LEN + layout.header_rest_len() + i,
                    };
                    // A point past the PDU's end flips its last byte, so the fault still fires.
                    let i = i.min(pdu.len() - 1);
                    pdu[i] ^= 0xff;
                }
            }
        }
        if keep {
            out.push(Piece::Bytes {
                bytes: std::mem::take(pdu),
                opcode: Some(opcode),
            });
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    use iscsi_wire::testing::pdu_bytes as pdu;

    /// A final Login Response that settles both digests.
    fn final_login_response() -> Vec<u8> {
        let mut p = pdu(
            0x23,
            b"HeaderDigest=CRC32C\0DataDigest=CRC32C\0",
            Digests::default(),
        );
        p[1] = 0x87; // transit, CSG 1, NSG 3
        p
    }

    fn cutter(faults: &[&str], dir: Direction, watch: &Arc<LoginWatch>) -> StreamCutter {
        let faults: Vec<Fault> = faults.iter().map(|f| f.parse().unwrap()).collect();
        StreamCutter::new(0, dir, &faults, false, watch.clone())
    }

    fn bytes_of(pieces: &[Piece]) -> Vec<u8> {
        pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Bytes { bytes, .. } => bytes.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn faults_parse_and_say_what_is_wrong() {
        let f: Fault = "down:data-in#3:corrupt=data+100".parse().unwrap();
        assert_eq!(
            f,
            Fault {
                conn: 0,
                direction: Direction::Down,
                at: FaultPoint::Pdu {
                    opcode: Some(0x25),
                    nth: 3
                },
                action: FaultAction::Corrupt(PduByte::Data(100)),
            }
        );
        let f: Fault = "up:byte=4096:stall=1.5:conn=2".parse().unwrap();
        assert_eq!(f.conn, 2);
        assert_eq!(f.at, FaultPoint::Byte(4096));
        assert_eq!(f.action, FaultAction::Stall(Duration::from_millis(1500)));
        for spec in [
            "down:data-in#3:corrupt=data+100:conn=0",
            "up:any#2:stall=0.5:conn=4",
        ] {
            assert_eq!(spec.parse::<Fault>().unwrap().to_string(), spec);
        }
        for bad in [
            "sideways:data-in#1:reset",
            "down:data-in#0:reset",
            "down:data-inn#1:reset",
            "down:byte=5:drop",
            "down:any#1:explode",
            "down:any#1:reset:conn=x",
            "down:any#1",
        ] {
            let e = bad.parse::<Fault>().unwrap_err();
            assert!(e.contains(bad) && e.contains("expected DIR:POINT"), "{e}");
        }
    }

    #[test]
    fn digests_settled_at_login_frame_the_full_feature_pdus() {
        let watch = Arc::new(LoginWatch::default());
        let mut down = cutter(&["down:data-in#2:corrupt=data+1"], Direction::Down, &watch);
        let d = Digests {
            header: true,
            data: true,
        };
        let first = pdu(0x25, &[1, 2, 3, 4, 5], d);
        let second = pdu(0x25, &[6, 7, 8], d);
        let stream = [final_login_response(), first.clone(), second.clone()].concat();
        // One byte at a time: framing never depends on how reads cut the stream.
        let mut out = Vec::new();
        for b in &stream {
            out.extend(down.push(std::slice::from_ref(b)));
        }
        assert_eq!(watch.digests(), d);
        let opcodes: Vec<_> = out
            .iter()
            .map(|p| match p {
                Piece::Bytes { opcode, .. } => *opcode,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(opcodes, [Some(0x23), Some(0x25), Some(0x25)]);
        let mut want = second.clone();
        want[BHS_LEN + 4 + 1] ^= 0xff; // after the header digest
        assert_eq!(
            bytes_of(&out),
            [final_login_response(), first, want].concat()
        );
        assert!(!down.is_active(), "every fault fired: bytes pass through");
        let fired: Vec<String> = down.take_fired().iter().map(|f| f.to_string()).collect();
        assert_eq!(fired, ["down:data-in#2:corrupt=data+1:conn=0"]);
    }

    #[test]
    fn a_rate_point_fires_about_one_in_n_on_every_connection_again_and_again() {
        let f: Fault = "up:data-out%50:corrupt=data+0".parse().unwrap();
        assert_eq!(f.to_string(), "up:data-out%50:corrupt=data+0:conn=0");
        let watch = Arc::new(LoginWatch::default());
        watch.full_feature.store(true, Ordering::Release);
        let d = Digests::default();
        let (data_out, nop) = (pdu(0x05, &[0; 4], d), pdu(0x00, &[0; 4], d));
        let mut counts = Vec::new();
        for conn in [0, 3] {
            let mut up = StreamCutter::new(conn, Direction::Up, &[f], false, watch.clone());
            let mut flipped = 0;
            for _ in 0..5000 {
                let stream = [data_out.clone(), nop.clone()].concat();
                for piece in up.push(&stream) {
                    if let Piece::Bytes { bytes, opcode } = piece {
                        assert!(opcode != Some(0x00) || bytes == nop, "only Data-Out");
                        flipped += usize::from(opcode == Some(0x05) && bytes != data_out);
                    }
                }
            }
            assert_eq!(up.take_fired().len(), flipped);
            counts.push(flipped);
        }
        for n in &counts {
            assert!((60..=140).contains(n), "about 5000/50 fired: {counts:?}");
        }
        assert_ne!(counts[0], counts[1], "each connection draws its own");
    }

    #[test]
    fn reset_delivers_what_came_before_and_nothing_after() {
        let watch = Arc::new(LoginWatch::default());
        watch.full_feature.store(true, Ordering::Release);
        let mut up = cutter(&["up:data-out#2:reset"], Direction::Up, &watch);
        let d = Digests::default();
        let stream = [
            pdu(0x01, &[], d),
            pdu(0x05, &[9; 8], d),
            pdu(0x05, &[7; 8], d),
        ]
        .concat();
        let out = up.push(&stream);
        assert_eq!(out.last(), Some(&Piece::Reset));
        assert_eq!(bytes_of(&out), stream[..2 * BHS_LEN + 8]);
        assert!(up.push(&stream).is_empty(), "nothing after the cut");
    }

    #[test]
    fn byte_points_split_the_stream_without_framing() {
        let watch = Arc::new(LoginWatch::default());
        watch.full_feature.store(true, Ordering::Release);
        let mut up = cutter(
            &[
                "up:byte=10:corrupt=0",
                "up:byte=20:stall=2",
                "up:byte=30:reset",
            ],
            Direction::Up,
            &watch,
        );
        let stream: Vec<u8> = (0..50).collect();
        let mut out = up.push(&stream[..15]);
        out.extend(up.push(&stream[15..]));
        let mut want = stream[..30].to_vec();
        want[10] ^= 0xff;
        assert_eq!(bytes_of(&out), want);
        let stall_at = out
            .iter()
            .position(|p| *p == Piece::Stall(Duration::from_secs(2)))
            .unwrap();
        assert_eq!(bytes_of(&out[..stall_at]), want[..20]);
        assert_eq!(out.last(), Some(&Piece::Reset));
    }

    #[test]
    fn a_dropped_pdu_is_left_out_and_other_connections_are_untouched() {
        let watch = Arc::new(LoginWatch::default());
        watch.full_feature.store(true, Ordering::Release);
        let faults: Vec<Fault> = ["down:scsi-resp#1:drop:conn=1"]
            .iter()
            .map(|f| f.parse().unwrap())
            .collect();
        let d = Digests::default();
        let stream = [pdu(0x25, &[1; 4], d), pdu(0x21, &[], d), pdu(0x20, &[], d)].concat();
        let mut first = StreamCutter::new(0, Direction::Down, &faults, false, watch.clone());
        assert!(!first.is_active());
        assert_eq!(bytes_of(&first.push(&stream)), stream);
        let mut second = StreamCutter::new(1, Direction::Down, &faults, false, watch);
        let out = second.push(&stream);
        assert_eq!(
            bytes_of(&out),
            [pdu(0x25, &[1; 4], d), pdu(0x20, &[], d)].concat()
        );
    }
}
