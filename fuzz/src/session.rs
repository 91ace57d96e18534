//! The whole target's session layer, fed PDUs by a hostile peer after a valid login.
//!
//! One real target (`iscsi_target::Target`: a small RAM LUN, the smallest memory budgets
//! the configuration allows, short Data-Out and NOP timeouts, ErrorRecoveryLevel up to 2)
//! is started once per process on an ephemeral loopback port, on a runtime of its own, and
//! kept for every input. Each input connects over iSCSI/TCP, logs in (one Login Request
//! straight to the operational stage, with keys the input chooses), sends the PDUs the
//! input describes, pings with an immediate NOP-Out and waits a few milliseconds for the
//! answer, then resets the connection.
//!
//! Checked for every input:
//! - every PDU the target sends has a target opcode and a data segment no longer than the
//!   MaxRecvDataSegmentLength the harness declared;
//! - afterwards the target still serves a fresh login and a TEST UNIT READY (liveness;
//!   with `IRONSAN_FUZZ_PROBE_EVERY=N` after every Nth input only; a second try 100 ms
//!   later, as a reset the input asked for may still be ending sessions), its sessions do not pile
//!   up, and the process's resident memory (VmRSS) stays under
//!   [`RSS_LIMIT_MIB`]: a peer must not be able to make the target hold memory past its
//!   budgets, or keep it after the connection is gone.
//!
//! Input: an options byte (bits 0-1 ErrorRecoveryLevel 0-2, bit 2 ImmediateData=No, bit 3
//! InitialR2T=Yes, bits 4-5 MaxBurstLength and FirstBurstLength small or large, bit 6 one
//! outstanding R2T instead of eight), then records of 16 bytes:
//!
//! | byte | meaning |
//! |---|---|
//! | 0 | kind (mod 9): SCSI Command, Data-Out, NOP-Out, Text, Task Management, Logout, SNACK, wait, raw |
//! | 1 | flags (the BHS's byte 1, by kind; for SCSI Commands bit 3 is the I bit) |
//! | 2 | task: bits 0-3 pick one of 16 ITTs, bit 6 LUN 1 (not configured), bit 7 ITT 0xffffffff |
//! | 3 | CmdSN: signed offset from the next CmdSN (0: the right one, which then advances) |
//! | 4-7 | `a`: ExpectedDataTransferLength, BufferOffset, BegRun, ReferencedTaskTag... |
//! | 8-11 | `b`: CDB choice and LBA, Target Transfer Tag, ... |
//! | 12-13 | `c`: transfer length in blocks, DataSN, RunLength, ... |
//! | 14-15 | data segment length (the harness fills the data) |
//!
//! A raw record is followed by 48 bytes sent as the BHS (its lengths set by the harness).
//! A Data-Out whose flags have bit 0 set answers the last R2T received for its ITT with the
//! R2T's Target Transfer Tag, offset and length, so whole solicited writes happen; a wait
//! record holds the sender until the target's next PDU (at most a few milliseconds), which
//! lets R2Ts arrive before the Data-Out that answers them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::Input;
use test_support::pdu::{be32, bhs, key_values, put32};

/// The target's IQN.
pub const IQN: &str = "iqn.2026-11.org.ironsan:fuzz-session";
const INITIATOR: &str = "iqn.2026-11.org.ironsan:fuzz-initiator";
/// The process's resident memory must stay under this (the target's whole write budget is
/// 64 MiB; the rest is the runtime, the LUN and libFuzzer's own corpus).
pub const RSS_LIMIT_MIB: u64 = 512;
/// The MaxRecvDataSegmentLength the harness declares: no PDU from the target may carry more.
const OUR_MRDSL: usize = 65536;
/// The target's MaxRecvDataSegmentLength: longer data segments are protocol errors.
pub(crate) const TARGET_MRDSL: u32 = 8192;
/// Most records one input sends.
pub(crate) const MAX_RECORDS: usize = 256;
/// How long the final ping may take before the harness gives up on it: the target
/// answers immediate NOP-Outs at once, so only a target busy for longer misses it.
pub(crate) const PING_WAIT: Duration = Duration::from_millis(50);
/// How long a send may wait for the target to read: a target that takes no more (a
/// command waiting for room, a full window) ends the input's sending.
const SEND_WAIT: Duration = Duration::from_millis(100);
/// How long a wait record holds the sender at most.
pub(crate) const WAIT_STEP: Duration = Duration::from_millis(5);
/// Bound on every step of the liveness check and the login: generous, as the machine
/// may be busy with other work; a target that is alive answers in microseconds.
pub(crate) const LIVENESS_WAIT: Duration = Duration::from_secs(5);
/// Sessions the target may hold between inputs: the fuzzed one (every input reinstates it:
/// one ISID), the liveness probe's, and some closing.
const MAX_SESSIONS: usize = 16;
/// The ITT of the harness's final ping.
pub(crate) const PING_ITT: u32 = 0x7fff_0000;

/// One of the process's targets.
pub(crate) struct Fixture {
    pub rt: tokio::runtime::Runtime,
    pub addr: SocketAddr,
    pub target: Arc<iscsi_target::Target>,
}

impl Fixture {
    /// Starts a target on `portal` (`127.0.0.1:0` or `iser://127.0.0.1:0`).
    pub(crate) fn start(portal: &str) -> Fixture {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        // The smallest budgets the configuration takes (each must hold the largest write),
        // and timeouts short enough that a stalled write ends within the run.
        let text = format!(
            "portals = [\"{portal}\"]\nqueue_depth = 8\nmemory_mib = 64\n\
             session_memory_mib = 64\nconnection_memory_mib = 64\n\
             data_out_timeout_secs = 1\nnop_interval_secs = 1\nnop_timeout_secs = 1\n\
             max_recv_data_segment_length = {TARGET_MRDSL}\n\
             [[target]]\nname = \"{IQN}\"\nerror_recovery_level = 2\n\
             [target.lun.0]\nsize = \"4MiB\"\nbackend = \"memory\"\n"
        );
        let config = iscsi_target::Config::parse(&text, "fuzz.toml").expect("fuzz config");
        let (addr, target) = rt.block_on(async {
            // A Rust program ignores SIGPIPE before main; a libFuzzer binary has no Rust
            // main, so a write to a connection the fuzzer reset would kill it. A handler
            // (this stream, kept for the process) stands in for the ignored signal.
            let mut pipe = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::pipe())
                .expect("a SIGPIPE handler");
            tokio::spawn(async move { while pipe.recv().await.is_some() {} });
            test_support::serve(config).await
        });
        Fixture { rt, addr, target }
    }

    /// The checks after every input but the liveness probe: few sessions, bounded memory.
    pub(crate) fn check_bounds(&self) {
        let sessions = self.target.session_count();
        assert!(
            sessions <= MAX_SESSIONS,
            "the target holds {sessions} sessions after the input's connection closed"
        );
        if let Some(rss) = rss_mib() {
            assert!(
                rss < RSS_LIMIT_MIB,
                "resident memory is {rss} MiB, past {RSS_LIMIT_MIB} MiB"
            );
        }
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| Fixture::start("127.0.0.1:0"))
}

/// Whether the liveness probe runs after this input: IRONSAN_FUZZ_PROBE_EVERY=N runs it
/// after every Nth input only (the probe costs a connection and a login).
pub(crate) fn probe_due() -> bool {
    static PROBE_EVERY: OnceLock<u64> = OnceLock::new();
    static INPUTS: AtomicU64 = AtomicU64::new(0);
    let every = *PROBE_EVERY.get_or_init(|| {
        std::env::var("IRONSAN_FUZZ_PROBE_EVERY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
            .max(1)
    });
    INPUTS.fetch_add(1, Ordering::Relaxed).is_multiple_of(every)
}

/// What the harness saw of one connection (written by its reader task).
#[derive(Default)]
struct Seen {
    /// Last R2T per ITT: (Target Transfer Tag, offset, length).
    r2t: HashMap<u32, (u32, u32, u32)>,
    /// Target Transfer Tag of the last NOP-In that asked for an answer.
    nop_ttt: Option<u32>,
    exp_stat_sn: u32,
    /// PDUs received by opcode.
    opcodes: HashMap<u8, usize>,
    ping_answered: bool,
    closed: bool,
    /// A broken rule, reported by the harness (a panic in the reader task would be lost).
    violation: Option<String>,
}

struct Shared {
    seen: Mutex<Seen>,
    news: Notify,
}

/// Reads one PDU (no digests are negotiated): the BHS and the data segment.
async fn read_pdu(r: &mut (impl AsyncReadExt + Unpin)) -> Option<([u8; 48], Vec<u8>)> {
    let mut b = [0u8; 48];
    r.read_exact(&mut b).await.ok()?;
    let len = u32::from_be_bytes([0, b[5], b[6], b[7]]) as usize;
    let mut rest = vec![0u8; b[4] as usize * 4 + len.next_multiple_of(4)];
    r.read_exact(&mut rest).await.ok()?;
    let at = b[4] as usize * 4;
    Some((b, rest[at..at + len].to_vec()))
}

/// Reads the target's PDUs until the connection ends, recording what the sender needs.
async fn reader(mut r: OwnedReadHalf, shared: Arc<Shared>) {
    while let Some((b, data)) = read_pdu(&mut r).await {
        let note = TargetPdu::read(&b);
        let mut seen = shared.seen.lock().expect("seen");
        *seen.opcodes.entry(note.op).or_default() += 1;
        if let Some(v) = note.violation {
            seen.violation.get_or_insert(v);
        }
        if data.len() > OUR_MRDSL {
            seen.violation.get_or_insert(format!(
                "a PDU with opcode 0x{:02x} carries {} bytes, past our \
                 MaxRecvDataSegmentLength {OUR_MRDSL}",
                note.op,
                data.len()
            ));
        }
        if let Some(sn) = note.exp_stat_sn {
            seen.exp_stat_sn = sn;
        }
        seen.ping_answered |= note.ping_answered;
        if note.nop_ttt.is_some() {
            seen.nop_ttt = note.nop_ttt;
        }
        if note.op == 0x31 {
            let itt = be32(&b[16..20]);
            seen.r2t
                .insert(itt, (be32(&b[20..24]), be32(&b[40..44]), be32(&b[44..48])));
        }
        drop(seen);
        shared.news.notify_waiters();
    }
    shared.seen.lock().expect("seen").closed = true;
    shared.news.notify_waiters();
}

/// Waits until `done` holds for what was seen, or `d` passes.
async fn wait_for(shared: &Shared, d: Duration, done: impl Fn(&Seen) -> bool) {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        let mut notified = std::pin::pin!(shared.news.notified());
        // Registered before the check, so no notification between the two is lost.
        notified.as_mut().enable();
        {
            let seen = shared.seen.lock().expect("seen");
            if done(&seen) || seen.closed {
                return;
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return;
        }
    }
}

/// What a PDU from the target tells the harness, over either transport.
pub(crate) struct TargetPdu {
    pub op: u8,
    /// The ExpStatSN to send next, if the PDU carried a StatSN.
    pub exp_stat_sn: Option<u32>,
    /// The answer to the harness's final ping.
    pub ping_answered: bool,
    /// The Target Transfer Tag of a NOP-In that asks for an answer.
    pub nop_ttt: Option<u32>,
    /// A rule the PDU breaks.
    pub violation: Option<String>,
}

impl TargetPdu {
    pub(crate) fn read(b: &[u8; 48]) -> TargetPdu {
        let op = b[0] & 0x3f;
        // The target's opcodes (RFC 7143 §11.1.1).
        let violation = (!matches!(op, 0x20..=0x26 | 0x31 | 0x32 | 0x3c | 0x3e | 0x3f))
            .then(|| format!("the target sent opcode 0x{op:02x}"));
        // Responses that take a StatSN (a Data-In only with its status; a NOP-In only as
        // an answer) carry it in the same place.
        let status_data_in = op == 0x25 && b[1] & 1 != 0;
        let nop_answer = op == 0x20 && be32(&b[20..24]) == u32::MAX;
        let takes_stat_sn =
            matches!(op, 0x21 | 0x22 | 0x24 | 0x26 | 0x3f) || status_data_in || nop_answer;
        let ping_answered = op == 0x20 && be32(&b[16..20]) == PING_ITT;
        TargetPdu {
            op,
            exp_stat_sn: takes_stat_sn.then(|| be32(&b[24..28]).wrapping_add(1)),
            ping_answered,
            nop_ttt: (op == 0x20 && !ping_answered && !nop_answer).then(|| be32(&b[20..24])),
            violation,
        }
    }
}

/// The keys of the harness's one-step login: those both transports send, from the input's
/// options byte, then `transport`'s own.
pub(crate) fn login_keys(initiator: &str, options: u8, transport: &[(&str, &str)]) -> Vec<u8> {
    let yes_no = |b: bool| if b { "Yes" } else { "No" };
    let (burst, first) = if options & 0x10 != 0 {
        ("16776192", "16776192")
    } else {
        ("65536", "8192")
    };
    let first = if options & 0x20 != 0 { "512" } else { first };
    let mut keys = vec![
        ("InitiatorName", initiator),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("ImmediateData", yes_no(options & 4 == 0)),
        ("InitialR2T", yes_no(options & 8 != 0)),
        ("MaxBurstLength", burst),
        ("FirstBurstLength", first),
        (
            "MaxOutstandingR2T",
            if options & 0x40 != 0 { "1" } else { "8" },
        ),
        ("DefaultTime2Wait", "0"),
    ];
    keys.extend_from_slice(transport);
    key_values(&keys)
}

/// The Login Request that carries `keys` from the operational stage straight to full
/// feature phase (no security stage: the target asks for no authentication).
pub(crate) fn login_request(isid: [u8; 6], cmd_sn: u32, keys: &[u8]) -> [u8; 48] {
    let mut b = bhs(0x43, 0x87, keys.len(), 0x4000_0000);
    b[8..14].copy_from_slice(&isid);
    b[20..22].copy_from_slice(&1u16.to_be_bytes());
    put32(&mut b, 24, cmd_sn);
    b
}

/// The (next CmdSN, ExpStatSN) a Login Response that reached full feature phase gives;
/// None if the target refused.
pub(crate) fn login_accepted(r: &[u8; 48]) -> Option<(u32, u32)> {
    if r[0] & 0x3f != 0x23 || r[36..38] != [0, 0] || r[1] & 0x83 != 0x83 {
        return None;
    }
    Some((be32(&r[28..32]), be32(&r[24..28]).wrapping_add(1)))
}

/// Sends a BHS and its data segment, padded; false if the connection failed or the target
/// stopped reading for [`SEND_WAIT`] (the input ends there).
async fn send(w: &mut (impl AsyncWriteExt + Unpin), b: &[u8; 48], data: &[u8]) -> bool {
    let mut buf = Vec::with_capacity(48 + data.len() + 3);
    buf.extend_from_slice(b);
    buf.extend_from_slice(data);
    buf.resize(48 + data.len().next_multiple_of(4), 0);
    matches!(
        tokio::time::timeout(SEND_WAIT, w.write_all(&buf)).await,
        Ok(Ok(()))
    )
}

/// A logged-in connection: (stream, next CmdSN, ExpStatSN), or None if the target refused.
async fn login(addr: SocketAddr, isid_last: u8, options: u8) -> Option<(TcpStream, u32, u32)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.set_nodelay(true).ok()?;
    // A reset instead of TIME_WAIT: thousands of connections a second would otherwise
    // use up the loopback's ports.
    s.set_zero_linger().ok()?;
    let erl = (options & 3).min(2).to_string();
    let keys = login_keys(
        INITIATOR,
        options,
        &[
            ("ErrorRecoveryLevel", &erl),
            ("MaxRecvDataSegmentLength", &OUR_MRDSL.to_string()),
            ("DefaultTime2Retain", "1"),
        ],
    );
    let b = login_request([0x80, 0, 0, 0xf0, 0x22, isid_last], 1, &keys);
    if !send(&mut s, &b, &keys).await {
        return None;
    }
    let (r, _) = read_pdu(&mut s).await?;
    let (cmd_sn, exp_stat_sn) = login_accepted(&r)?;
    Some((s, cmd_sn, exp_stat_sn))
}

/// A CDB from the record's `b` (top byte: which command; the rest: the LBA) and `c` (the
/// transfer length): the commands that move data or manage space on the LUN, and a few
/// that do not.
fn cdb(b: u32, c: u16) -> [u8; 16] {
    const OPS: [u8; 16] = [
        0x00, // TEST UNIT READY
        0x12, // INQUIRY
        0x25, // READ CAPACITY(10)
        0x28, // READ(10)
        0x2a, // WRITE(10)
        0x88, // READ(16)
        0x8a, // WRITE(16)
        0x93, // WRITE SAME(16)
        0x42, // UNMAP
        0x89, // COMPARE AND WRITE
        0x35, // SYNCHRONIZE CACHE(10)
        0xa0, // REPORT LUNS
        0x2e, // WRITE AND VERIFY(10)
        0x83, // EXTENDED COPY
        0x5f, // PERSISTENT RESERVE OUT
        0x1a, // MODE SENSE(6)
    ];
    let op = OPS[(b >> 24) as usize % OPS.len()];
    let lba = b & 0x00ff_ffff;
    let mut cdb = [0u8; 16];
    cdb[0] = op;
    match op {
        0x28 | 0x2a | 0x2e | 0x35 | 0x42 => {
            cdb[2..6].copy_from_slice(&lba.to_be_bytes());
            cdb[7..9].copy_from_slice(&c.to_be_bytes());
        }
        0x88 | 0x8a | 0x93 => {
            cdb[6..10].copy_from_slice(&lba.to_be_bytes());
            cdb[10..14].copy_from_slice(&u32::from(c).to_be_bytes());
        }
        // COMPARE AND WRITE: NUMBER OF LOGICAL BLOCKS is one byte.
        0x89 => {
            cdb[6..10].copy_from_slice(&lba.to_be_bytes());
            cdb[13] = c as u8;
        }
        0xa0 | 0x83 | 0x5f => cdb[6..10].copy_from_slice(&u32::from(c).to_be_bytes()),
        0x12 => cdb[3..5].copy_from_slice(&c.to_be_bytes()),
        0x1a => cdb[4] = c as u8,
        _ => {}
    }
    cdb
}

/// Bytes for a data segment.
pub(crate) fn fill(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// What a record asks for (byte 0 mod 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Command,
    DataOut,
    NopOut,
    Text,
    TaskManagement,
    Logout,
    Snack,
    Wait,
    Raw,
}

/// One record of an input (see the module's documentation).
pub(crate) struct Record {
    pub kind: Kind,
    pub seed: u8,
    pub flags: u8,
    /// Byte 2 as it came (its bits 0-3, 6 and 7 are `itt` and `lun`).
    pub task: u8,
    pub itt: u32,
    pub lun: u8,
    pub delta: i8,
    pub a: u32,
    pub b: u32,
    pub c: u16,
    pub dlen: usize,
    /// The BHS of a raw record.
    pub raw: [u8; 48],
}

impl Record {
    pub(crate) fn next(inp: &mut Input) -> Record {
        let r: [u8; 16] = inp.array();
        let kind = [
            Kind::Command,
            Kind::DataOut,
            Kind::NopOut,
            Kind::Text,
            Kind::TaskManagement,
            Kind::Logout,
            Kind::Snack,
            Kind::Wait,
            Kind::Raw,
        ][usize::from(r[0] % 9)];
        let task = r[2];
        Record {
            kind,
            seed: r[0],
            flags: r[1],
            task,
            itt: if task & 0x80 != 0 {
                u32::MAX
            } else {
                0x10 + u32::from(task & 15)
            },
            lun: u8::from(task & 0x40 != 0),
            delta: r[3] as i8,
            a: be32(&r[4..8]),
            b: be32(&r[8..12]),
            c: u16::from_be_bytes([r[12], r[13]]),
            dlen: usize::from(u16::from_be_bytes([r[14], r[15]])),
            raw: if kind == Kind::Raw {
                inp.array()
            } else {
                [0; 48]
            },
        }
    }

    /// The PDU (BHS and data segment) of any record but a wait. `cmd_sn` is the next CmdSN
    /// (advanced when the record carries it and is not immediate); `r2t` the last R2T of the
    /// record's task, `nop_ttt` the last NOP-In that asked for an answer.
    pub(crate) fn pdu(
        &self,
        cmd_sn: &mut u32,
        exp_stat_sn: u32,
        r2t: Option<(u32, u32, u32)>,
        nop_ttt: Option<u32>,
    ) -> ([u8; 48], Vec<u8>) {
        let (flags, itt, a, b, c) = (self.flags, self.itt, self.a, self.b, self.c);
        // The CmdSN to carry: the right one (which then advances unless immediate), or one
        // off by `delta`.
        let mut next_cmd_sn = |immediate: bool| {
            let sn = cmd_sn.wrapping_add(self.delta as i32 as u32);
            if self.delta == 0 && !immediate {
                *cmd_sn = cmd_sn.wrapping_add(1);
            }
            sn
        };
        let mut payload = fill(self.dlen, self.seed);
        let mut pdu = match self.kind {
            Kind::Command => {
                let immediate = flags & 0x08 != 0;
                let mut p = bhs(
                    0x01 | if immediate { 0x40 } else { 0 },
                    flags & 0xe7,
                    0,
                    itt,
                );
                put32(&mut p, 20, a);
                put32(&mut p, 24, next_cmd_sn(immediate));
                p[32..48].copy_from_slice(&cdb(b, c));
                p
            }
            // Answering the last R2T of its task, or as the record says.
            Kind::DataOut => {
                let (ttt, offset, len) = match r2t {
                    Some((ttt, off, len)) if flags & 1 != 0 => {
                        payload = fill(len.min(TARGET_MRDSL) as usize, self.seed);
                        (ttt, off, len)
                    }
                    _ => (b, a, self.dlen as u32),
                };
                let last = flags & 0x80 != 0 || (flags & 1 != 0 && len <= TARGET_MRDSL);
                let mut p = bhs(0x05, if last { 0x80 } else { 0 }, 0, itt);
                put32(&mut p, 20, ttt);
                put32(&mut p, 36, u32::from(c));
                put32(&mut p, 40, offset);
                p
            }
            // A ping of our own, or the answer to the target's.
            Kind::NopOut => {
                let answer = flags & 1 != 0 && nop_ttt.is_some();
                let immediate = answer || flags & 0x40 != 0;
                let (itt, ttt) = match nop_ttt {
                    Some(t) if answer => (u32::MAX, t),
                    _ => (itt, b),
                };
                let mut p = bhs(if immediate { 0x40 } else { 0 }, 0x80, 0, itt);
                put32(&mut p, 20, ttt);
                put32(&mut p, 24, next_cmd_sn(immediate));
                p
            }
            // Discovery from a normal session, a negotiation, or junk.
            Kind::Text => {
                payload = match c % 4 {
                    0 => key_values(&[("SendTargets", "All")]),
                    1 => key_values(&[("SendTargets", IQN)]),
                    2 => key_values(&[("MaxBurstLength", "4096"), ("X-ironsan-fuzz", "1")]),
                    _ => payload,
                };
                let immediate = flags & 0x08 != 0;
                let mut p = bhs(
                    0x04 | if immediate { 0x40 } else { 0 },
                    flags & 0xc0,
                    0,
                    itt,
                );
                put32(&mut p, 20, b);
                put32(&mut p, 24, next_cmd_sn(immediate));
                p
            }
            // The function from the flags, on one of our tasks (or any tag).
            Kind::TaskManagement => {
                let mut p = bhs(0x42, 0x80 | (flags & 0x7f), 0, itt);
                put32(&mut p, 20, if a & 0x100 != 0 { a } else { 0x10 + (a & 15) });
                put32(&mut p, 24, next_cmd_sn(true));
                put32(&mut p, 32, cmd_sn.wrapping_sub(b & 0xff));
                payload.clear();
                p
            }
            // The reason from the flags.
            Kind::Logout => {
                let mut p = bhs(0x46, 0x80 | (flags & 0x7f), 0, itt);
                p[20..22].copy_from_slice(&c.to_be_bytes());
                put32(&mut p, 24, next_cmd_sn(true));
                payload.clear();
                p
            }
            // The type from the flags.
            Kind::Snack => {
                let mut p = bhs(0x10, 0x80 | (flags & 0x0f), 0, itt);
                put32(&mut p, 20, b);
                put32(&mut p, 40, a);
                put32(&mut p, 44, u32::from(c));
                payload.clear();
                p
            }
            // Any BHS the fuzzer makes (without AHS: the harness sends none).
            Kind::Raw | Kind::Wait => {
                let mut p = self.raw;
                p[4] = 0;
                p
            }
        };
        if self.kind != Kind::Raw {
            pdu[9] = self.lun;
            put32(&mut pdu, 28, exp_stat_sn);
        }
        pdu[5..8].copy_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        (pdu, payload)
    }
}

/// What one input did (after its login).
#[derive(Debug, Default)]
pub struct Outcome {
    /// PDUs received, by opcode.
    pub opcodes: HashMap<u8, usize>,
    /// The target ended the connection (or, over iSER, the queue pair failed) before the
    /// harness closed it.
    pub closed: bool,
}

/// Runs one input against the target and checks it; returns what came back.
pub fn session_tcp_run(data: &[u8]) -> Outcome {
    // One input at a time (the replay test runs targets on several threads): inputs share
    // the fuzzed ISID and the probe's, so two at once would reinstate each other's session.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fx = fixture();
    let outcome = fx.rt.block_on(run_input(fx.addr, data));
    check_after(fx);
    outcome
}

/// [`session_tcp_run`] without the outcome: the fuzz target.
pub fn session_tcp(data: &[u8]) {
    session_tcp_run(data);
}

async fn run_input(addr: SocketAddr, data: &[u8]) -> Outcome {
    let mut inp = Input::new(data);
    let options = inp.u8();
    let login = tokio::time::timeout(LIVENESS_WAIT, login(addr, 1, options)).await;
    let Ok(Some((stream, mut cmd_sn, exp_stat_sn))) = login else {
        panic!("the fuzzed connection cannot log in");
    };
    let (rd, mut wr) = stream.into_split();
    let shared = Arc::new(Shared {
        seen: Mutex::new(Seen {
            exp_stat_sn,
            ..Seen::default()
        }),
        news: Notify::new(),
    });
    let reading = tokio::spawn(reader(rd, shared.clone()));
    let mut sent_ok = true;
    for _ in 0..MAX_RECORDS {
        if inp.is_empty() || !sent_ok {
            break;
        }
        let r = Record::next(&mut inp);
        if r.kind == Kind::Wait {
            let before: usize = shared.seen.lock().expect("seen").opcodes.values().sum();
            wait_for(&shared, WAIT_STEP, |s| {
                s.opcodes.values().sum::<usize>() > before
            })
            .await;
            continue;
        }
        let (stat, nop_ttt, r2t) = {
            let seen = shared.seen.lock().expect("seen");
            (
                seen.exp_stat_sn,
                seen.nop_ttt,
                seen.r2t.get(&r.itt).copied(),
            )
        };
        let (pdu, payload) = r.pdu(&mut cmd_sn, stat, r2t, nop_ttt);
        sent_ok = send(&mut wr, &pdu, &payload).await;
    }
    // An immediate ping: once it is answered, the target has read everything before it.
    let mut ping = bhs(0x40, 0x80, 0, PING_ITT);
    put32(&mut ping, 20, u32::MAX);
    put32(&mut ping, 24, cmd_sn);
    put32(&mut ping, 28, shared.seen.lock().expect("seen").exp_stat_sn);
    if send(&mut wr, &ping, &[]).await {
        wait_for(&shared, PING_WAIT, |s| s.ping_answered).await;
    }
    drop(wr);
    reading.abort();
    let _ = reading.await;
    let seen = std::mem::take(&mut *shared.seen.lock().expect("seen"));
    if let Some(v) = seen.violation {
        panic!("{v}");
    }
    Outcome {
        opcodes: seen.opcodes,
        closed: seen.closed,
    }
}

/// After an input: the target answers a fresh login and a TEST UNIT READY, holds few
/// sessions, and the process's memory is bounded.
fn check_after(fx: &Fixture) {
    if probe_due() {
        probe_or_panic(fx);
    }
    fx.check_bounds();
}

fn probe_or_panic(fx: &Fixture) {
    let status = fx.rt.block_on(async {
        tokio::time::timeout(LIVENESS_WAIT, async {
            // A TARGET WARM or COLD RESET from the input ends every session of the target,
            // and may still be doing so when the probe logs in: one more try after a
            // moment. A target that refuses both is not serving.
            match probe(fx.addr).await {
                Some(status) => Some(status),
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    probe(fx.addr).await
                }
            }
        })
        .await
    });
    match status {
        Ok(Some(_)) => {}
        Ok(None) => panic!("the target refused a fresh login or TEST UNIT READY after the input"),
        Err(_) => panic!("the target did not answer a fresh login and TEST UNIT READY in time"),
    }
}

/// Logs in (its own ISID) and runs TEST UNIT READY; returns the SCSI status.
async fn probe(addr: SocketAddr) -> Option<u8> {
    let (s, cmd_sn, exp_stat_sn) = login(addr, 2, 0).await?;
    let (mut rd, mut wr) = s.into_split();
    let mut b = bhs(0x01, 0x80, 0, 1);
    put32(&mut b, 24, cmd_sn);
    put32(&mut b, 28, exp_stat_sn);
    if !send(&mut wr, &b, &[]).await {
        return None;
    }
    loop {
        let (r, _) = read_pdu(&mut rd).await?;
        // Skip a NOP-In ping or an asynchronous message that comes first.
        if r[0] & 0x3f == 0x21 && be32(&r[16..20]) == 1 {
            return Some(r[3]);
        }
    }
}

/// VmRSS of this process in MiB (None where /proc is not there).
pub fn rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}
