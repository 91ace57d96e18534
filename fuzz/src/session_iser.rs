//! The target's session layer over iSER: the `session_tcp` harness's inputs (see
//! [`crate::session`]) sent by a raw iSER initiator on the software iWARP RNIC to a target
//! with an `iser://` portal.
//!
//! The initiator is one queue pair per input on an RNIC kept for the process, with PDUs and
//! iSER headers laid out byte by byte (RFC 7143, RFC 7145). What differs from iSCSI/TCP:
//! a SCSI Command that reads or writes advertises memory in its iSER header, which the
//! target reaches with RDMA Writes and Reads (so there are no R2Ts): a region of at most
//! 1 MiB, smaller than the command asks for when its expected length is larger (the
//! target's access past it must end the connection with a Terminate, not harm the target),
//! or with bit 5 of the record's task byte an STag that names nothing. Data segments are
//! cut at 9,216 bytes, past the target's 8,192-byte receives. The options byte's bits 0-1
//! are ignored (iSER runs at ErrorRecoveryLevel 0).
//!
//! Checked as over iSCSI/TCP: every Send from the target carries a control iSER header
//! and a whole PDU with a target opcode; afterwards a fresh initiator logs in and gets an
//! answer to TEST UNIT READY, the target holds few sessions, and VmRSS stays bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdma::{Access, ConnParams, MemoryRegion, Provider, QpState, QueuePair, WcStatus};
use rnic::Rnic;

use crate::session::{
    login_accepted, login_keys, login_request, probe_due, Fixture, Kind, Outcome, Record,
    TargetPdu, LIVENESS_WAIT, MAX_RECORDS, PING_ITT, PING_WAIT, WAIT_STEP,
};
use crate::Input;
use test_support::iser_raw::{iser_header, send_bytes, RingSizes, Rings};
use test_support::pdu::{be32, bhs, put32};

const INITIATOR: &str = "iqn.2026-11.org.ironsan:fuzz-iser-initiator";
/// Receives the initiator keeps posted, and their size: a PDU of at most our
/// InitiatorRecvDataSegmentLength (8,192) behind the headers.
const RECV_SLOTS: usize = 32;
const RECV_LEN: usize = 8192 + 256;
/// Send buffers, each big enough for a Send longer than the target's receives.
const SEND_SLOTS: usize = 32;
const SEND_LEN: usize = 76 + 9216;
const RINGS: RingSizes = RingSizes {
    recv_slots: RECV_SLOTS,
    recv_len: RECV_LEN,
    send_slots: SEND_SLOTS,
    send_len: SEND_LEN,
};
/// The largest region a command advertises.
const MAX_REGION: usize = 1 << 20;
/// Regions one input registers at most (later commands advertise an STag naming nothing).
const MAX_REGIONS: usize = 16;

/// The process's iSER target and the RNIC of its raw initiators.
struct IserFixture {
    fx: Fixture,
    rnic: Rnic,
    pd: rnic::Pd,
}

fn fixture() -> &'static IserFixture {
    static FIXTURE: OnceLock<IserFixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let fx = Fixture::start("iser://127.0.0.1:0");
        let rnic = Rnic::new().expect("a software RNIC");
        let pd = rnic.alloc_pd().expect("a protection domain");
        IserFixture { fx, rnic, pd }
    })
}

/// A raw iSER initiator: a queue pair with its receives and send buffers, and what arrived.
struct Peer {
    rings: Rings,
    /// The BHS of each PDU received and not yet looked at.
    received: VecDeque<[u8; 48]>,
    opcodes: HashMap<u8, usize>,
    violation: Option<String>,
    failed: bool,
    cmd_sn: u32,
    exp_stat_sn: u32,
    nop_ttt: Option<u32>,
    ping_answered: bool,
}

impl Peer {
    /// A connected queue pair (the MPA exchange), or None if the target refused it.
    fn connect(ifx: &IserFixture) -> Option<Peer> {
        let rings = Rings::new(&ifx.rnic, &ifx.pd, 1024, SEND_SLOTS as u32 + 8, 2, RINGS).ok()?;
        // As Linux ib_iser: the iSER word 0x80 (ZBVA not used, Send with Invalidate taken).
        let params = ConnParams {
            private_data: vec![0x80, 0, 0, 0],
            mpa_revision: 2,
            ird: 16,
            ord: 1,
            // The target is ironsan's own, which reads its socket at once: no waiting after
            // the MPA Reply (the default's 20 ms would be most of an input's time).
            first_fpdu_delay: Duration::ZERO,
            ..ConnParams::default()
        };
        rings.qp.connect(ifx.fx.addr, &params).ok()?;
        Some(Peer {
            rings,
            received: VecDeque::new(),
            opcodes: HashMap::new(),
            violation: None,
            failed: false,
            cmd_sn: 1,
            exp_stat_sn: 0,
            nop_ttt: None,
            ping_answered: false,
        })
    }

    /// Takes every waiting completion: received Sends are checked and queued (their
    /// buffers posted again), Sends counted. Returns how many there were.
    fn poll(&mut self) -> usize {
        let mut sends = Vec::new();
        let n = self.rings.poll(|wc, bytes| {
            if wc.status != WcStatus::Success {
                self.failed = true;
            }
            sends.extend(bytes);
        });
        for bytes in sends {
            self.take(&bytes);
        }
        n
    }

    /// One Send from the target: an iSER control header and a whole PDU.
    fn take(&mut self, bytes: &[u8]) {
        if bytes.len() < 76 || bytes[0] & 0xf0 != 0x10 {
            self.violation.get_or_insert(format!(
                "the target sent a Send of {} bytes without a control iSER header and a BHS",
                bytes.len()
            ));
            return;
        }
        let b: [u8; 48] = bytes[28..76].try_into().expect("48 bytes");
        let note = TargetPdu::read(&b);
        let len = u32::from_be_bytes([0, b[5], b[6], b[7]]) as usize;
        let start = 76 + b[4] as usize * 4;
        if start + len > bytes.len() {
            self.violation.get_or_insert(format!(
                "a Send from the target of {} bytes holds a PDU (opcode 0x{:02x}) of {}",
                bytes.len(),
                note.op,
                start + len
            ));
            return;
        }
        if let Some(v) = note.violation {
            self.violation.get_or_insert(v);
        }
        *self.opcodes.entry(note.op).or_default() += 1;
        if let Some(sn) = note.exp_stat_sn {
            self.exp_stat_sn = sn;
        }
        self.ping_answered |= note.ping_answered;
        if note.nop_ttt.is_some() {
            self.nop_ttt = note.nop_ttt;
        }
        self.received.push_back(b);
    }

    fn broken(&self) -> bool {
        self.failed || self.rings.qp.state() == QpState::Error
    }

    /// Polls until `done` holds, the connection fails, or `d` passes.
    fn wait(&mut self, d: Duration, done: impl Fn(&Peer) -> bool) {
        let deadline = Instant::now() + d;
        while !done(self) && !self.broken() && Instant::now() < deadline {
            if self.poll() == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Posts one Send: the iSER header, the BHS, the data padded to 4 (cut to fit a send
    /// buffer, the BHS's length with it). False if the connection failed first.
    fn post(&mut self, header: &[u8; 28], pdu: &[u8; 48], data: &[u8]) -> bool {
        let data = &data[..data.len().min(SEND_LEN - 76)];
        let mut pdu = *pdu;
        pdu[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        let bytes = send_bytes(header, &pdu, data);
        self.wait(LIVENESS_WAIT, |p| !p.rings.full());
        if self.broken() || self.rings.full() {
            return false;
        }
        self.rings.post_send(&bytes)
    }

    /// Logs in to full feature phase in one Login Request (operational stage); false if
    /// the target refused.
    fn login(&mut self, isid_last: u8, options: u8) -> bool {
        let keys = login_keys(
            INITIATOR,
            options,
            &[
                ("RDMAExtensions", "Yes"),
                ("ErrorRecoveryLevel", "0"),
                ("InitiatorRecvDataSegmentLength", "8192"),
                ("TargetRecvDataSegmentLength", "8192"),
                ("DefaultTime2Retain", "0"),
            ],
        );
        let b = login_request([0x80, 0, 0, 0xf0, 0x3e, isid_last], self.cmd_sn, &keys);
        if !self.post(&iser_header(None, None), &b, &keys) {
            return false;
        }
        self.wait(LIVENESS_WAIT, |p| !p.received.is_empty());
        let Some(r) = self.received.pop_front() else {
            return false;
        };
        let Some((cmd_sn, exp_stat_sn)) = login_accepted(&r) else {
            return false;
        };
        self.cmd_sn = cmd_sn;
        self.exp_stat_sn = exp_stat_sn;
        self.opcodes.clear();
        true
    }
}

/// Runs one input against the iSER target and checks it; returns what came back.
pub fn session_iser_run(data: &[u8]) -> Outcome {
    // One input at a time: inputs share the fuzzed ISID and the probe's.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ifx = fixture();
    let outcome = run_input(ifx, data);
    if probe_due() {
        probe(ifx);
    }
    ifx.fx.check_bounds();
    outcome
}

/// [`session_iser_run`] without the outcome: the fuzz target.
pub fn session_iser(data: &[u8]) {
    session_iser_run(data);
}

fn run_input(ifx: &IserFixture, data: &[u8]) -> Outcome {
    let mut inp = Input::new(data);
    let options = inp.u8();
    let Some(mut p) = Peer::connect(ifx) else {
        panic!("the fuzzed iSER connection was refused");
    };
    assert!(
        p.login(1, options),
        "the fuzzed iSER connection cannot log in"
    );
    let mut regions: Vec<rnic::Mr> = Vec::new();
    for _ in 0..MAX_RECORDS {
        if inp.is_empty() || p.broken() {
            break;
        }
        let r = Record::next(&mut inp);
        if r.kind == Kind::Wait {
            let before = p.received.len();
            p.wait(WAIT_STEP, |p| p.received.len() > before);
            p.received.clear();
            continue;
        }
        p.poll();
        p.received.clear();
        let mut cmd_sn = p.cmd_sn;
        let (pdu, payload) = r.pdu(&mut cmd_sn, p.exp_stat_sn, None, p.nop_ttt);
        p.cmd_sn = cmd_sn;
        let mut header = iser_header(None, None);
        if r.kind == Kind::Command {
            // The memory a command that moves data advertises.
            let edtl = be32(&pdu[20..24]) as usize;
            let bogus = r.task & 0x20 != 0 || regions.len() >= MAX_REGIONS;
            let mut region = |access| {
                if bogus {
                    return Some((r.b | 0x100, u64::from(r.a)));
                }
                let mr = ifx
                    .rnic
                    .reg_mr(&ifx.pd, edtl.clamp(1, MAX_REGION), access)
                    .ok()?;
                let at = (mr.rkey(), mr.addr());
                regions.push(mr);
                Some(at)
            };
            let write = if pdu[1] & 0x20 != 0 {
                region(Access::REMOTE_READ)
                    .map(|(stag, va)| (stag, va.wrapping_add(payload.len() as u64)))
            } else {
                None
            };
            let read = if pdu[1] & 0x40 != 0 {
                region(Access::REMOTE_WRITE)
            } else {
                None
            };
            header = iser_header(write, read);
        }
        p.post(&header, &pdu, &payload);
    }
    // An immediate ping: once it is answered, the target has taken everything before it.
    let mut ping = bhs(0x40, 0x80, 0, PING_ITT);
    put32(&mut ping, 20, u32::MAX);
    put32(&mut ping, 24, p.cmd_sn);
    put32(&mut ping, 28, p.exp_stat_sn);
    if p.post(&iser_header(None, None), &ping, &[]) {
        p.wait(PING_WAIT, |p| p.ping_answered);
    }
    p.poll();
    if let Some(v) = p.violation.take() {
        panic!("{v}");
    }
    let closed = p.broken();
    let opcodes = std::mem::take(&mut p.opcodes);
    // The queue pair goes (disconnecting) before the regions it advertised.
    drop(p);
    drop(regions);
    Outcome { opcodes, closed }
}

/// A fresh initiator logs in and gets an answer to TEST UNIT READY: a TARGET WARM or COLD
/// RESET from the input ends every session of the target and may still be doing so, so a
/// refused probe is tried once more after a moment.
fn probe(ifx: &IserFixture) {
    if let Err(first) = probe_once(ifx) {
        std::thread::sleep(Duration::from_millis(100));
        if let Err(second) = probe_once(ifx) {
            panic!("after the input, {first}; and again 100 ms later, {second}");
        }
    }
}

fn probe_once(ifx: &IserFixture) -> Result<(), &'static str> {
    let mut p = Peer::connect(ifx).ok_or("the target refused a fresh iSER connection")?;
    if !p.login(2, 0) {
        return Err("the target refused a fresh iSER login");
    }
    let mut b = bhs(0x01, 0x80, 0, 1);
    put32(&mut b, 24, p.cmd_sn);
    put32(&mut b, 28, p.exp_stat_sn);
    if !p.post(&iser_header(None, None), &b, &[]) {
        return Err("the probe's connection failed");
    }
    let answered = |p: &Peer| {
        p.received
            .iter()
            .any(|r| r[0] & 0x3f == 0x21 && be32(&r[16..20]) == 1)
    };
    p.wait(LIVENESS_WAIT, answered);
    if answered(&p) {
        Ok(())
    } else {
        Err("the target did not answer TEST UNIT READY on a fresh iSER login")
    }
}
