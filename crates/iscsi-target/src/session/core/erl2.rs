//! ErrorRecoveryLevel 2 in the target session core: the tasks kept until their status is
//! acknowledged ([`KeptTasks`]) — which are kept, which an acknowledged status ends, when
//! DefaultTime2Retain ends a failed connection's (time comes in as an argument), how a TASK
//! REASSIGN is answered and where it moves a task. The driver (`erl2.rs`) holds them under
//! a lock and carries out the I/O: the response kept to send again, the data phase moved to
//! another connection, the wait for reassignment.

use iscsi_wire::{tmf, Bhs};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The task whose status a retained status PDU carries (a SCSI Response, or a Data-In with
/// the status in it); `None` for status that ends no task (NOP-In, Logout Response …).
pub fn status_of(bhs: &Bhs) -> Option<u32> {
    match bhs {
        Bhs::ScsiResponse(r) => Some(r.itt),
        Bhs::DataIn(d) if d.status_present => Some(d.itt),
        _ => None,
    }
}

/// The answer to a TASK REASSIGN (in a session at level 2: below it the request is
/// answered "not supported" by `tmf_plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reassign {
    NoTask,
    /// Its connection has not failed: it may not move.
    StillAllegiant,
    /// It moves to the connection the request came on: a task that has executed has its
    /// response sent again there, a write asks for all its data again by R2T once the
    /// answer is out.
    Move,
}

impl Reassign {
    /// The Task Management Response's response code.
    pub fn response(self) -> u8 {
        match self {
            Reassign::NoTask => tmf::RSP_NO_TASK,
            Reassign::StillAllegiant => tmf::RSP_STILL_ALLEGIANT,
            Reassign::Move => tmf::RSP_COMPLETE,
        }
    }
}

/// A connection of the session as the kept tasks know it: the driver numbers each
/// connection once (a CID logged in again is another connection).
pub type ConnKey = u64;

/// One run of a kept task (an ITT is reused once its task's status went out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeptId(u64);

#[derive(Debug)]
struct Kept<P> {
    id: KeptId,
    conn: ConnKey,
    cid: u16,
    /// Its response was produced (and is kept by the driver to send again).
    executed: bool,
    payload: P,
}

/// ErrorRecoveryLevel 2: every SCSI task from its arrival until its status is acknowledged,
/// with the connection it is allegiant to, and the failed connections whose tasks wait
/// DefaultTime2Retain for TASK REASSIGN. `P` is the driver's part of a task (what it needs
/// to carry out I/O), handed back when the task is forgotten or moves.
#[derive(Debug)]
pub struct KeptTasks<P> {
    tasks: HashMap<u32, Kept<P>>,
    /// Failed connections with tasks waiting, and when DefaultTime2Retain runs out for them.
    retained: Vec<(ConnKey, Instant)>,
    time2retain: Duration,
    next_id: u64,
}

impl<P: Clone> KeptTasks<P> {
    /// Kept tasks of a session whose DefaultTime2Retain is `time2retain`.
    pub fn new(time2retain: Duration) -> Self {
        KeptTasks {
            tasks: HashMap::new(),
            retained: Vec::new(),
            time2retain,
            next_id: 0,
        }
    }

    /// Whether a command arriving under `itt` is kept: not when a task with its ITT is
    /// still in progress (the arriving one is a copy of its command, which the CmdSN window
    /// turns away). A kept task whose response went out is replaced by it: the initiator
    /// reuses an ITT only once it has the status.
    pub fn may_keep(&self, itt: u32) -> bool {
        self.tasks.get(&itt).is_none_or(|k| k.executed)
    }

    /// Keeps the task arriving under `itt` on connection `conn` (CID `cid`), as
    /// [`Self::may_keep`] allowed; `make` makes the driver's part, told the run's id.
    pub fn keep(&mut self, itt: u32, conn: ConnKey, cid: u16, make: impl FnOnce(KeptId) -> P) -> P {
        let id = KeptId(self.next_id);
        self.next_id += 1;
        let payload = make(id);
        let kept = Kept {
            id,
            conn,
            cid,
            executed: false,
            payload: payload.clone(),
        };
        self.tasks.insert(itt, kept);
        payload
    }

    /// Whether run `id` of `itt` is still kept (not forgotten by task management, an
    /// acknowledgement or DefaultTime2Retain).
    pub fn holds(&self, itt: u32, id: KeptId) -> bool {
        self.tasks.get(&itt).is_some_and(|k| k.id == id)
    }

    /// Run `id` of `itt` executed: its status, once acknowledged on the connection it is
    /// allegiant to, ends it. Returns that connection (where the response goes).
    pub fn executed(&mut self, itt: u32, id: KeptId) -> Option<ConnKey> {
        let k = self.tasks.get_mut(&itt).filter(|k| k.id == id)?;
        k.executed = true;
        Some(k.conn)
    }

    /// Forgets run `id` of `itt` (it ended without a response, or was turned away).
    pub fn forget(&mut self, itt: u32, id: KeptId) -> Option<P> {
        if !self.holds(itt, id) {
            return None;
        }
        self.tasks.remove(&itt).map(|k| k.payload)
    }

    /// Forgets the task `itt` (task management aborted it).
    pub fn forget_itt(&mut self, itt: u32) -> Option<P> {
        self.tasks.remove(&itt).map(|k| k.payload)
    }

    /// Forgets every task (the session was logged out).
    pub fn forget_all(&mut self) -> Vec<P> {
        self.retained.clear();
        self.tasks.drain().map(|(_, k)| k.payload).collect()
    }

    /// The initiator acknowledged on `conn` the status of task `itt`: it ends when `conn` is
    /// the connection it is allegiant to and its response was produced (a reassigned task's
    /// first status is not its status now). Returns what is released.
    pub fn acknowledged(&mut self, itt: u32, conn: ConnKey) -> Option<P> {
        let done = self
            .tasks
            .get(&itt)
            .is_some_and(|k| k.conn == conn && k.executed);
        if !done {
            return None;
        }
        self.tasks.remove(&itt).map(|k| k.payload)
    }

    /// Connection `conn` failed at `now`: its tasks wait DefaultTime2Retain for
    /// reassignment. Returns how many wait (none: nothing is retained).
    pub fn connection_failed(&mut self, conn: ConnKey, now: Instant) -> usize {
        let waiting = self.count_on(conn);
        if waiting > 0 {
            self.retained.push((conn, now + self.time2retain));
        }
        waiting
    }

    /// Forgets at `now` every task still allegiant to a failed connection whose
    /// DefaultTime2Retain has run out.
    pub fn expire(&mut self, now: Instant) -> Vec<P> {
        let due: Vec<ConnKey> = self
            .retained
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(conn, _)| *conn)
            .collect();
        self.retained.retain(|(_, at)| *at > now);
        let mut gone = Vec::new();
        self.tasks.retain(|_, k| {
            let stays = !due.contains(&k.conn);
            if !stays {
                gone.push(k.payload.clone());
            }
            stays
        });
        gone
    }

    /// Decides a TASK REASSIGN of task `itt` arriving on connection `to` (CID `cid`), given
    /// which connections are still in the session; the task moves there when it may, and
    /// its driver's part comes back with the answer.
    pub fn reassign(
        &mut self,
        itt: u32,
        to: ConnKey,
        cid: u16,
        live: impl Fn(ConnKey) -> bool,
    ) -> (Reassign, Option<P>) {
        let Some(k) = self.tasks.get_mut(&itt) else {
            return (Reassign::NoTask, None);
        };
        if live(k.conn) {
            return (Reassign::StillAllegiant, None);
        }
        k.conn = to;
        k.cid = cid;
        (Reassign::Move, Some(k.payload.clone()))
    }

    /// Whether any task is kept.
    pub fn any(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// Whether a task is allegiant to a connection with CID `cid`.
    pub fn any_on_cid(&self, cid: u16) -> bool {
        self.tasks.values().any(|k| k.cid == cid)
    }

    /// Tasks allegiant to `conn`.
    pub fn count_on(&self, conn: ConnKey) -> usize {
        self.tasks.values().filter(|k| k.conn == conn).count()
    }

    /// Tasks kept.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn count(&self) -> usize {
        self.tasks.len()
    }
}
