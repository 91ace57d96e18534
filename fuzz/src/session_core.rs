//! The target's sans-IO session core (`iscsi_target::fuzzing`, what `session.rs` drives),
//! fed a hostile initiator's full feature phase without sockets, so an input costs
//! microseconds instead of a login and the target's answers.
//!
//! The harness plays the driver: it offers each PDU to the core as `session.rs` does
//! (commands through `check_command` and `order`, control PDUs through `control_order`,
//! then the NOP, Text, Logout, task management and SNACK decisions), starts and ends the
//! tasks the core runs, numbers what it sends on each connection's `StatusSeq` and
//! acknowledges it with the ExpStatSN of every PDU, fires each connection's NOP-In ping
//! timer as time advances, and at ErrorRecoveryLevel 2 has the core's kept tasks
//! (`erl2::KeptTasks`) keep each task from its arrival, end it on the acknowledgement of
//! its status, expire a failed connection's after DefaultTime2Retain and answer TASK
//! REASSIGN. Data-Out and R2T are the datamover's and never reach the core: a write's data
//! phase shows there only as its task's end.
//!
//! Two transport profiles, as the target sets them up: iSCSI/TCP (ErrorRecoveryLevel 0 to
//! 2) and iSER (level 0, which the target's login forces, no Data-Out, control PDUs cut to
//! 128 bytes).
//!
//! Checked after every step:
//! - nothing panics;
//! - the window, the task table and the counts the core holds stay within their bounds:
//!   outstanding plus queued work within the queue depth, outstanding work exactly the
//!   counted tasks running, the task table and superseded runs exactly the tasks running,
//!   immediate commands within `max_immediate_commands`, ExpCmdSN and MaxCmdSN never going
//!   back, each connection's retained status within `StatusSeq`'s bound, at most one
//!   kept task per ITT, the kept tasks and the connections they answer on as the model has
//!   them (only a failed connection's expire or move);
//! - every task that starts ends once: with its response, or answered by the ABORT TASK
//!   that claimed it (the core's `end_task` says "aborted" exactly for the runs the model
//!   saw claimed), and the core's view of the tasks on a connection is the model's;
//! - after the input all tasks end, and the core holds no task and no outstanding work;
//! - every 1,024 inputs, the process's resident memory (VmRSS) stays under
//!   [`crate::session::RSS_LIMIT_MIB`].
//!
//! Input: two option bytes, then records of 12 bytes.
//! - option 0: bit 0 iSER, bits 1-2 ErrorRecoveryLevel (TCP; mod 3), bits 3-5 queue depth
//!   1-8, bit 6 discovery session, bit 7 ping interval 1 s instead of none;
//! - option 1: bits 0-1 `max_immediate_commands` 0-3, bits 2-3 ping timeout 1-4 s.
//!
//! | kind (byte 0 mod 8) | bytes 1.. |
//! |---|---|
//! | 0 SCSI Command | flags (bit 0 I, bit 1 R, bit 2 W, bit 3 connection), ITT pick (bit 7: 0xffffffff), LUN, CmdSN offset (signed, from ExpCmdSN), ExpStatSN offset, EDTL (2) |
//! | 1 control PDU | opcode pick (bits 0-2: NOP-Out, Text, Logout, TMF, SNACK, raw opcode of byte 2; bit 4 I; bit 5 connection), byte 1 of the BHS (function, reason, SNACK type), ITT pick, CmdSN offset, ExpStatSN offset, referenced ITT pick or CID, RefCmdSN offset, BegRun, RunLength, data length (2) |
//! | 2 a task ends | which running task, bit 0 of the next byte: no response (aborted by the engine, or its connection gone) |
//! | 3 a connection fails | connection |
//! | 4 a connection logs in (again) | connection |
//! | 5 time passes | milliseconds (2), times 2^(byte 3 mod 8) |
//! | 6 ExpStatSN | connection, offset (signed 16 bits) from the next StatSN |
//! | 7 Data-Out | (TCP only) ITT pick: the oldest running task with it ends, its data in |

use crate::Input;
use bytes::Bytes;
use iscsi_session::status::RETAINED_MAX;
use iscsi_session::StatusSeq;
use iscsi_target::fuzzing::erl2::{KeptId, KeptTasks, Reassign};
use iscsi_target::fuzzing::{
    self as core, AfterLogout, Held, Order, PingStep, PingTimer, SessionCore, SnackPlan, TaskId,
    TmfAction, TmfPlan,
};
use iscsi_wire::serial::sn_le;
use iscsi_wire::{tmf, Bhs, LogoutRequest, SnackRequest, TaskMgmtRequest, RESERVED_TAG};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Records one input runs at most.
const MAX_RECORDS: usize = 1024;
/// Connections a session may have here (CIDs 0 and 1).
const CONNS: usize = 2;
/// The initial CmdSN and StatSN: near the wrap, so serial arithmetic is exercised.
const FIRST_SN: u32 = 0xffff_fff0;
/// DefaultTime2Retain of the sessions here.
const TIME2RETAIN: Duration = Duration::from_secs(20);
/// The initiator's MaxRecvDataSegmentLength over TCP; iSER control PDUs get 128 bytes.
const MAX_SEND_TCP: u32 = 8192;
const MAX_SEND_ISER: u32 = 128;
/// Inputs between two checks of the resident memory.
const RSS_EVERY: u64 = 1024;

/// What waits in the core's window.
#[derive(Debug)]
enum Work {
    Command {
        cid: u16,
        itt: u32,
        lun: u64,
        immediate: bool,
        /// ERL 2: kept from its arrival.
        kept: Option<KeptId>,
    },
    Control {
        cid: u16,
        bhs: Bhs,
        data_len: usize,
    },
}

/// A task the core runs.
#[derive(Debug)]
struct Run {
    itt: u32,
    id: TaskId,
    counted: bool,
    /// The connection it answers on (TASK REASSIGN moves it).
    cid: u16,
    /// An ABORT TASK claimed it: it ends without a response.
    claimed: bool,
    /// ERL 2: its run in the core's kept tasks.
    kept: Option<KeptId>,
}

/// Where a level 2 task answers (the driver's part of a kept task): the connection (its
/// generation), and whether it has executed (its response is sent again when it moves).
#[derive(Debug, Clone, Copy)]
struct Allegiance {
    itt: u32,
    conn: u32,
    executed: bool,
}

struct Conn {
    /// Which login of its CID this is (a CID logged in again is another connection).
    gen: u32,
    live: bool,
    pings: PingTimer,
    /// What was numbered: the ITT of a SCSI status, else 0xffffffff.
    status: StatusSeq<u32>,
}

/// What the inputs reached, for the replay test's look at the seeds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub started: usize,
    pub responses: usize,
    pub aborted: usize,
    pub ignored: usize,
    pub refused: usize,
    pub pings: usize,
    pub unanswered: usize,
    pub reassigned: usize,
    pub expired: usize,
    pub status_resent: usize,
    pub logouts: usize,
}

struct Harness {
    core: SessionCore<Work>,
    iser: bool,
    erl: u8,
    depth: u32,
    max_immediate: u32,
    discovery: bool,
    ping_every: Duration,
    ping_timeout: Duration,
    conns: Vec<Conn>,
    running: Vec<Run>,
    /// The core's task table as the model sees it: the latest run under each ITT until it
    /// ends.
    table: HashMap<u32, TaskId>,
    immediate_running: u32,
    /// ERL 2: the core's kept tasks, and where each answers.
    kept: KeptTasks<KeptId>,
    allegiance: HashMap<KeptId, Allegiance>,
    window: (u32, u32),
    now: Instant,
    closed: bool,
    out: Outcome,
}

/// The harness of the `session_core` target.
pub fn session_core(data: &[u8]) {
    session_core_run(data);
    static INPUTS: AtomicU64 = AtomicU64::new(0);
    if INPUTS
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(RSS_EVERY)
    {
        if let Some(rss) = crate::session::rss_mib() {
            let limit = crate::session::RSS_LIMIT_MIB;
            assert!(
                rss < limit,
                "resident memory is {rss} MiB, past {limit} MiB"
            );
        }
    }
}

/// Runs one input; what it reached.
pub fn session_core_run(data: &[u8]) -> Outcome {
    let mut inp = Input::new(data);
    let (o0, o1) = (inp.u8(), inp.u8());
    let mut h = Harness::new(o0, o1);
    for _ in 0..MAX_RECORDS {
        if inp.is_empty() {
            break;
        }
        let r: [u8; 12] = inp.array();
        h.step(&r);
        h.check();
    }
    h.finish();
    h.out
}

fn itt_pick(b: u8) -> u32 {
    if b & 0x80 != 0 {
        RESERVED_TAG
    } else {
        u32::from(b & 0x0f)
    }
}

impl Harness {
    fn new(o0: u8, o1: u8) -> Harness {
        let iser = o0 & 1 != 0;
        let erl = if iser { 0 } else { ((o0 >> 1) & 3) % 3 };
        let depth = u32::from((o0 >> 3) & 7) + 1;
        let ping_every = Duration::from_secs(u64::from(o0 >> 7));
        let ping_timeout = Duration::from_secs(u64::from((o1 >> 2) & 3) + 1);
        let now = Instant::now();
        let mut core = SessionCore::new(FIRST_SN, depth, o0 & 0x40 != 0);
        let window = core.window();
        let conns = (0..CONNS)
            .map(|c| Conn {
                gen: c as u32,
                live: true,
                pings: PingTimer::new(ping_every, ping_timeout, now),
                status: StatusSeq::new(FIRST_SN),
            })
            .collect();
        Harness {
            core,
            iser,
            erl,
            depth,
            max_immediate: u32::from(o1 & 3),
            discovery: o0 & 0x40 != 0,
            ping_every,
            ping_timeout,
            conns,
            running: Vec::new(),
            table: HashMap::new(),
            immediate_running: 0,
            kept: KeptTasks::new(TIME2RETAIN),
            allegiance: HashMap::new(),
            window,
            now,
            closed: false,
            out: Outcome::default(),
        }
    }

    fn max_send(&self) -> u32 {
        if self.iser {
            MAX_SEND_ISER
        } else {
            MAX_SEND_TCP
        }
    }

    fn step(&mut self, r: &[u8; 12]) {
        match r[0] % 8 {
            0 => self.command(r),
            1 => self.control(r),
            2 => {
                if !self.running.is_empty() {
                    let i = usize::from(r[1]) % self.running.len();
                    self.end(i, r[2] & 1 == 0);
                }
            }
            3 => self.fail(usize::from(r[1] & 1)),
            4 => self.login(usize::from(r[1] & 1)),
            5 => {
                let ms = u64::from(u16::from_be_bytes([r[1], r[2]])) << (r[3] % 8);
                self.advance(Duration::from_millis(ms));
            }
            6 => {
                let c = usize::from(r[1] & 1);
                let off = i16::from_be_bytes([r[2], r[3]]);
                let exp = self.conns[c].status.next().wrapping_add(off as i32 as u32);
                self.acknowledge(c, exp);
            }
            _ => {
                let itt = itt_pick(r[1]);
                if !self.iser {
                    if let Some(i) = self.running.iter().position(|t| t.itt == itt) {
                        self.end(i, true);
                    }
                }
            }
        }
    }

    /// A PDU arrived on connection `c` (live, session open): the peer was heard from, and
    /// its ExpStatSN acknowledges.
    fn arrived(&mut self, c: usize, exp_stat_sn: u32) {
        let _ = self.conns[c].pings.heard(self.now);
        self.acknowledge(c, exp_stat_sn);
    }

    fn open(&self, c: usize) -> bool {
        !self.closed && self.conns[c].live
    }

    fn exp_stat_sn(&self, c: usize, off: u8) -> u32 {
        self.conns[c]
            .status
            .next()
            .wrapping_add(off as i8 as i32 as u32)
    }

    fn cmd_sn(&mut self, off: u8) -> u32 {
        self.core.window().0.wrapping_add(off as i8 as i32 as u32)
    }

    fn command(&mut self, r: &[u8; 12]) {
        let c = usize::from(r[1] >> 3 & 1);
        if !self.open(c) {
            return;
        }
        let exp = self.exp_stat_sn(c, r[5]);
        self.arrived(c, exp);
        let immediate = r[1] & 1 != 0;
        let itt = itt_pick(r[2]);
        let lun = iscsi_wire::lun_to_wire(u16::from(r[3] & 1));
        if let Err((reason, _)) = self.core.check_command(immediate, self.max_immediate) {
            assert!(
                self.discovery || (immediate && self.immediate_running >= self.max_immediate),
                "command refused (reason {reason:#x}) within its limits"
            );
            self.out.refused += 1;
            self.send_status(c, RESERVED_TAG); // the Reject
            return;
        }
        if immediate {
            self.immediate_running += 1;
        }
        // ERL 2: kept from its arrival, unless a task with its ITT is still in progress.
        let kept = (self.erl == 2 && self.kept.may_keep(itt)).then(|| {
            let gen = self.conns[c].gen;
            let id = self.kept.keep(itt, u64::from(gen), c as u16, |id| id);
            let a = Allegiance {
                itt,
                conn: gen,
                executed: false,
            };
            // It replaces a kept task with its ITT whose response went out.
            self.allegiance.retain(|_, a| a.itt != itt);
            self.allegiance.insert(id, a);
            id
        });
        let cmd_sn = self.cmd_sn(r[4]);
        let work = Work::Command {
            cid: c as u16,
            itt,
            lun,
            immediate,
            kept,
        };
        let orders = self.core.order(immediate, cmd_sn, work);
        self.carry_out(orders);
    }

    fn carry_out(&mut self, orders: Vec<Order<Work>>) {
        for order in orders {
            match order {
                Order::Run { work, counted } => self.dispatch(work, counted),
                Order::Ignored { work, .. } => {
                    self.out.ignored += 1;
                    if let Work::Command {
                        immediate,
                        kept,
                        itt,
                        ..
                    } = work
                    {
                        assert!(!immediate, "an immediate command ignored by the window");
                        if let Some(id) = kept {
                            self.forget(itt, id);
                        }
                    }
                }
            }
        }
    }

    fn dispatch(&mut self, work: Work, counted: bool) {
        match work {
            Work::Command {
                cid,
                itt,
                lun,
                immediate,
                kept,
            } => {
                assert_eq!(counted, !immediate, "a command's window slot");
                // At level 2 it may have moved while it waited for its turn.
                let cid = match kept.and_then(|id| self.allegiance.get(&id)) {
                    Some(a) => (a.conn as usize % CONNS) as u16,
                    None => cid,
                };
                let id = self.core.start_task(itt, cid, lun);
                self.table.insert(itt, id);
                self.running.push(Run {
                    itt,
                    id,
                    counted,
                    cid,
                    claimed: false,
                    kept,
                });
                self.out.started += 1;
            }
            Work::Control { cid, bhs, data_len } => {
                self.control_pdu(usize::from(cid), &bhs, data_len);
                if counted {
                    self.core.complete();
                }
            }
        }
    }

    /// Forgets kept run `id` of `itt` in the core (and its allegiance here).
    fn forget(&mut self, itt: u32, id: KeptId) {
        let _ = self.kept.forget(itt, id);
        self.allegiance.remove(&id);
    }

    /// Forgets the kept task `itt`; whether there was one.
    fn forget_itt(&mut self, itt: u32) -> bool {
        let gone = self.kept.forget_itt(itt);
        if let Some(id) = gone {
            self.allegiance.remove(&id);
        }
        gone.is_some()
    }

    /// Task `running[i]` ends: with its response unless `respond` is false (the engine
    /// aborted it, or it ran for no one).
    fn end(&mut self, i: usize, respond: bool) {
        let run = self.running.remove(i);
        let aborted = self.core.end_task(run.itt, run.id, run.counted);
        assert_eq!(
            aborted, run.claimed,
            "task {:?} (ITT {:#x}) ends as aborted only when an ABORT TASK claimed it",
            run.id, run.itt
        );
        if self.table.get(&run.itt) == Some(&run.id) {
            self.table.remove(&run.itt);
        }
        if !run.counted {
            self.immediate_running -= 1;
        }
        if aborted {
            self.out.aborted += 1;
        }
        let kept = run.kept.filter(|id| self.kept.holds(run.itt, *id));
        if respond && !aborted {
            // At level 2 the response goes where the task is allegiant now, if that
            // connection is still up.
            let to = match kept {
                Some(id) => {
                    let conn = self.kept.executed(run.itt, id).expect("held");
                    let a = self.allegiance.get_mut(&id).expect("an allegiance");
                    assert_eq!(u64::from(a.conn), conn, "where run {id:?} answers");
                    a.executed = true;
                    let gen = a.conn;
                    self.cid_of(gen)
                }
                None => Some(run.cid),
            };
            self.out.responses += 1;
            if let Some(cid) = to.filter(|cid| self.open(usize::from(*cid))) {
                self.send_status(usize::from(cid), run.itt);
            }
        } else if let Some(id) = kept {
            self.forget(run.itt, id);
        }
    }

    /// A status-bearing PDU goes out on connection `c` and takes its StatSN.
    fn send_status(&mut self, c: usize, itt: u32) {
        self.conns[c].status.assign(itt);
    }

    /// ExpStatSN `exp` on connection `c`: acknowledged status is forgotten, and at level 2
    /// the kept tasks it ends.
    fn acknowledge(&mut self, c: usize, exp: u32) {
        let mut done = Vec::new();
        self.conns[c]
            .status
            .acknowledge_each(exp, |itt| done.push(itt));
        for itt in done {
            if itt == RESERVED_TAG {
                continue;
            }
            let gen = self.conns[c].gen;
            if let Some(id) = self.kept.acknowledged(itt, u64::from(gen)) {
                let a = self.allegiance.remove(&id).expect("an allegiance");
                assert!(a.conn == gen && a.executed, "acknowledged on {gen}: {a:?}");
            }
        }
    }

    fn fail(&mut self, c: usize) {
        if !self.conns[c].live {
            return;
        }
        self.conns[c].live = false;
        // The driver aborts the data phases of the tasks on it.
        let mut on = self.core.tasks_on(c as u16);
        let mut model: Vec<u32> = self
            .table
            .iter()
            .filter(|(_, id)| self.run(**id).is_some_and(|r| usize::from(r.cid) == c))
            .map(|(itt, _)| *itt)
            .collect();
        on.sort_unstable();
        model.sort_unstable();
        assert_eq!(on, model, "the tasks on connection {c}");
        let gen = self.conns[c].gen;
        let waiting = self.kept.connection_failed(u64::from(gen), self.now);
        let model = self.allegiance.values().filter(|a| a.conn == gen).count();
        assert_eq!(waiting, model, "tasks kept on connection {gen}");
    }

    /// The CID of connection generation `gen` while it is up.
    fn cid_of(&self, gen: u32) -> Option<u16> {
        (0..CONNS)
            .find(|c| self.conns[*c].gen == gen && self.conns[*c].live)
            .map(|c| c as u16)
    }

    fn run(&self, id: TaskId) -> Option<&Run> {
        self.running.iter().find(|r| r.id == id)
    }

    /// Connection `c` logs in (again: a live one is reinstated, failing first).
    fn login(&mut self, c: usize) {
        if self.closed {
            return;
        }
        self.fail(c);
        self.conns[c] = Conn {
            gen: self.conns[c].gen + CONNS as u32,
            live: true,
            pings: PingTimer::new(self.ping_every, self.ping_timeout, self.now),
            status: StatusSeq::new(self.conns[c].status.next()),
        };
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        for c in 0..CONNS {
            if !self.open(c) {
                continue;
            }
            // Bounded: a ping goes out at most once per firing.
            for _ in 0..4 {
                match self.conns[c].pings.fired(self.now) {
                    PingStep::Wait(at) => {
                        assert!(at > self.now, "a ping timer set for the past");
                        break;
                    }
                    PingStep::Ping(nop) => {
                        assert_eq!(nop.itt, RESERVED_TAG);
                        self.out.pings += 1;
                        let next = self.conns[c].pings.ping_sent(self.now);
                        assert!(next > self.now);
                    }
                    PingStep::Unanswered => {
                        self.out.unanswered += 1;
                        self.fail(c);
                        break;
                    }
                }
            }
        }
        // ERL 2: a failed connection's kept tasks go after DefaultTime2Retain.
        for id in self.kept.expire(self.now) {
            let a = self.allegiance.remove(&id).expect("an allegiance");
            assert!(
                self.cid_of(a.conn).is_none(),
                "a live connection's task expired"
            );
            self.out.expired += 1;
        }
    }

    /// A control PDU described by record `r` arrives.
    fn control(&mut self, r: &[u8; 12]) {
        let c = usize::from(r[1] >> 5 & 1);
        if !self.open(c) {
            return;
        }
        let opcode = match r[1] & 7 {
            0 => 0x00,     // NOP-Out
            1 => 0x04,     // Text
            2 => 0x06,     // Logout
            3 | 4 => 0x02, // Task Management
            5 => 0x10,     // SNACK
            _ => r[2] & 0x3f,
        };
        let mut b = [0u8; 48];
        b[0] = opcode | if r[1] & 0x10 != 0 { 0x40 } else { 0 };
        b[1] = if r[1] & 7 == 6 { 0x80 } else { r[2] };
        if opcode == 0x02 && r[1] & 7 == 4 {
            // The task management functions the target carries out, in turn.
            b[1] = 0x80 | (r[2] % 9);
        }
        let data_len = usize::from(u16::from_be_bytes([r[10], r[11]]));
        b[5..8].copy_from_slice(&(data_len as u32).to_be_bytes()[1..]);
        b[8..16].copy_from_slice(&iscsi_wire::lun_to_wire(u16::from(r[2] >> 7)).to_be_bytes());
        b[16..20].copy_from_slice(&itt_pick(r[3]).to_be_bytes());
        // Referenced Task Tag, Target Transfer Tag, or the CID (Logout) in its first half.
        let reference = if opcode == 0x06 {
            u32::from(r[6] & 3) << 16
        } else {
            itt_pick(r[6])
        };
        b[20..24].copy_from_slice(&reference.to_be_bytes());
        let cmd_sn = self.cmd_sn(r[4]);
        b[24..28].copy_from_slice(&cmd_sn.to_be_bytes());
        let exp = self.exp_stat_sn(c, r[5]);
        b[28..32].copy_from_slice(&exp.to_be_bytes());
        let ref_cmd_sn = self.cmd_sn(r[7]);
        b[32..36].copy_from_slice(&ref_cmd_sn.to_be_bytes());
        let next = self.conns[c].status.next();
        b[40..44].copy_from_slice(&next.wrapping_sub(u32::from(r[8])).to_be_bytes());
        b[44..48].copy_from_slice(&u32::from(r[9] % 8).to_be_bytes());
        let Ok(decoded) = Bhs::decode(&b) else {
            return; // the datamover's Reject; the core never sees it
        };
        let bhs = decoded.bhs;
        match &bhs {
            // Only a discovery session's datamover hands a command up as control; Data-Out
            // is the datamover's.
            Bhs::ScsiCommand(_) if !self.discovery => return,
            Bhs::DataOut(_) => return,
            _ => {}
        }
        self.arrived(c, exp);
        let Some((immediate, sn)) = core::control_order(&bhs) else {
            return; // a ping answer or an ExpStatSN update
        };
        let work = Work::Control {
            cid: c as u16,
            bhs,
            data_len,
        };
        let orders = self.core.order(immediate, sn, work);
        self.carry_out(orders);
    }

    /// The driver's `Session::control`, its decisions checked.
    fn control_pdu(&mut self, c: usize, bhs: &Bhs, data_len: usize) {
        if !self.open(c) {
            return; // its connection went while it waited for its turn
        }
        match bhs {
            Bhs::NopOut(n) => {
                let data = Bytes::from(vec![0u8; data_len.min(1 << 16)]);
                if let Some(reply) = core::nop_reply(n, &data, self.max_send()) {
                    assert!(reply.data.len() <= self.max_send() as usize);
                    self.send_status(c, RESERVED_TAG);
                }
            }
            Bhs::TextRequest(_) => self.send_status(c, RESERVED_TAG),
            Bhs::LogoutRequest(l) => self.logout(c, l),
            Bhs::TaskMgmtRequest(t) => self.task_management(c, t),
            Bhs::SnackRequest(s) => self.snack(c, s),
            other => {
                assert!(
                    core::refuse_control(other).is_some(),
                    "{other:?} neither answered nor refused"
                );
                self.send_status(c, RESERVED_TAG);
            }
        }
    }

    fn logout(&mut self, c: usize, l: &LogoutRequest) {
        let cid = usize::from(l.cid);
        let cx = core::LogoutContext {
            joined: cid < CONNS && self.conns[cid].live,
            tasks_kept: u16::try_from(cid).is_ok_and(|cid| self.kept.any_on_cid(cid)),
            erl2: self.erl == 2,
            time2wait: 2,
            time2retain: TIME2RETAIN.as_secs() as u16,
        };
        let plan = core::logout(l, cx);
        assert_eq!(plan.response.itt, l.itt);
        self.out.logouts += 1;
        self.send_status(c, RESERVED_TAG);
        match plan.after {
            AfterLogout::CloseSession => {
                self.closed = true;
                self.kept.forget_all();
                self.allegiance.clear();
            }
            AfterLogout::RemoveConnection(cid) => {
                assert_eq!(plan.response.response, 0);
                if usize::from(cid) < CONNS {
                    self.fail(usize::from(cid));
                }
            }
            AfterLogout::Nothing => assert_ne!(plan.response.response, 0),
        }
    }

    fn task_management(&mut self, c: usize, t: &TaskMgmtRequest) {
        let luns = [0u64];
        let device = (!self.discovery).then_some(((), &luns[..]));
        let response = match core::tmf_plan(t, self.erl == 2, device) {
            TmfPlan::Answer(code) => code,
            TmfPlan::Reassign => self.reassign(c, t),
            TmfPlan::Act((), TmfAction::AbortTask) => self.abort_task(t),
            TmfPlan::Act((), action) => {
                let lun = match action {
                    TmfAction::AbortTaskSet(l)
                    | TmfAction::ClearTaskSet(l)
                    | TmfAction::LunReset(l) => Some(l),
                    _ => None,
                };
                let matching = self.core.tasks_matching(|_, wire| {
                    lun.is_none_or(|l| u64::from(iscsi_wire::lun_from_wire(wire)) == l)
                });
                for (itt, _) in &matching {
                    assert!(self.table.contains_key(itt), "ITT {itt:#x} is no task");
                    self.forget_itt(*itt);
                }
                tmf::RSP_COMPLETE
            }
        };
        assert!(
            response <= tmf::RSP_NOT_SUPPORTED,
            "task management response {response}"
        );
        self.send_status(c, RESERVED_TAG);
    }

    fn abort_task(&mut self, t: &TaskMgmtRequest) -> u8 {
        let itt = t.ref_task_tag;
        let claimed = self.core.claim_for_abort(itt);
        // The model: the latest run under the ITT, if it has not ended, unless claimed.
        let expected = match self.table.get(&itt).copied() {
            Some(id) => {
                let run = self
                    .running
                    .iter_mut()
                    .find(|r| r.id == id)
                    .expect("the table names running tasks only");
                !std::mem::replace(&mut run.claimed, true)
            }
            None => false,
        };
        assert_eq!(claimed, expected, "ABORT TASK of ITT {itt:#x}");
        let kept = self.forget_itt(itt);
        let exp = self.core.window().0;
        core::abort_task(t, claimed, kept, exp)
    }

    fn reassign(&mut self, c: usize, t: &TaskMgmtRequest) -> u8 {
        let itt = t.ref_task_tag;
        let live: Vec<u64> = self
            .conns
            .iter()
            .filter(|c| c.live)
            .map(|c| u64::from(c.gen))
            .collect();
        let gen = self.conns[c].gen;
        let (decision, moved) = self
            .kept
            .reassign(itt, u64::from(gen), c as u16, |k| live.contains(&k));
        if let Some(id) = moved {
            assert_eq!(decision, Reassign::Move);
            self.out.reassigned += 1;
            let a = self.allegiance.get_mut(&id).expect("an allegiance");
            assert!(
                !live.contains(&u64::from(a.conn)),
                "moved from a live connection"
            );
            a.conn = gen;
            let executed = a.executed;
            self.core.move_task(itt, c as u16);
            if let Some(id) = self.table.get(&itt) {
                let id = *id;
                if let Some(r) = self.running.iter_mut().find(|r| r.id == id) {
                    r.cid = c as u16;
                }
            }
            if executed {
                self.send_status(c, itt); // its response again
            }
        }
        decision.response()
    }

    fn snack(&mut self, c: usize, s: &SnackRequest) {
        match core::snack(s, self.erl) {
            SnackPlan::Reject { .. } => self.send_status(c, RESERVED_TAG),
            SnackPlan::Status => {
                let status = &self.conns[c].status;
                let run = core::status_run(s, status.first_retained(), status.next(), |sn| {
                    status.retained(sn).copied()
                });
                match run {
                    Ok(pdus) => {
                        assert!(pdus.len() <= RETAINED_MAX);
                        self.out.status_resent += pdus.len();
                    }
                    Err(_) => self.send_status(c, RESERVED_TAG),
                }
            }
            // The datamover's: Data-In resent or acknowledged.
            SnackPlan::DataR2t { .. } | SnackPlan::DataAck { .. } | SnackPlan::RData { .. } => {
                assert!(self.erl > 0)
            }
        }
    }

    /// The bounds checked after every step.
    fn check(&mut self) {
        let held: Held = self.core.held();
        let counted = self.running.iter().filter(|r| r.counted).count() as u32;
        assert_eq!(held.outstanding, counted, "outstanding work: {held:?}");
        assert!(
            held.outstanding as usize + held.queued <= self.depth as usize,
            "window past its depth {}: {held:?}",
            self.depth
        );
        assert_eq!(
            held.tasks + held.superseded,
            self.running.len(),
            "task table: {held:?}"
        );
        assert_eq!(held.tasks, self.table.len(), "task table: {held:?}");
        assert_eq!(held.immediate, self.immediate_running, "{held:?}");
        assert!(held.immediate <= self.max_immediate, "{held:?}");
        for conn in &self.conns {
            assert!(conn.status.unacknowledged() <= RETAINED_MAX);
        }
        // Kept tasks: one per ITT at most (16 and 0xffffffff), each with its allegiance.
        assert!(self.kept.count() <= 17, "{} tasks kept", self.kept.count());
        assert_eq!(self.kept.count(), self.allegiance.len(), "kept tasks");
        let (exp, max) = self.core.window();
        assert!(sn_le(self.window.0, exp), "ExpCmdSN went back");
        assert!(sn_le(self.window.1, max), "MaxCmdSN went back");
        self.window = (exp, max);
        if let Some(now) = self.core.window_update() {
            assert_eq!(now, (exp, max));
        }
    }

    /// Every task still running ends; then the core holds none.
    fn finish(&mut self) {
        while !self.running.is_empty() {
            self.end(0, true);
            self.check();
        }
        let held = self.core.held();
        assert_eq!((held.tasks, held.superseded, held.immediate), (0, 0, 0));
        assert_eq!(held.outstanding, 0);
    }
}
