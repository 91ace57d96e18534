//! Target-wide counters: logins accepted and refused (by reason), session reinstatements,
//! logouts, connections now and closed, and the error recovery of every connection (digest
//! errors, SNACKs, recovery R2Ts, task reassignments) summed over live and closed ones.
//! Plain atomics bumped where the event happens; an exporter reads them whole with
//! [`Target::stats`] (nothing here knows any metrics format). The LUNs' own counters are
//! the `scsi` device's ([`Target::lun_stats`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datamover::RecoveryCounters;
use iscsi_login::pdu::LoginStatus;

use crate::Target;

/// Why a login did not reach full feature phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Wrong or missing CHAP credentials (0x0201).
    Auth,
    /// Too many failed authentications lately of the name or address (the auth throttle).
    LockedOut,
    /// The initiator may not reach the target (ACL, 0x0202).
    Acl,
    /// No such target or session (0x0203, 0x0204, 0x020a).
    NotFound,
    /// A configured limit: sessions, connections, logins pending (0x0206, 0x0302).
    Limits,
    /// Anything else the initiator got wrong (other 0x02xx).
    BadRequest,
    /// A target error (0x03xx other than out of resources).
    TargetError,
    /// The login broke off: a timeout, a bad PDU, the connection lost.
    Incomplete,
}

impl Refusal {
    /// Every reason, in the order snapshots list them.
    pub const ALL: [Refusal; 8] = [
        Refusal::Auth,
        Refusal::LockedOut,
        Refusal::Acl,
        Refusal::NotFound,
        Refusal::Limits,
        Refusal::BadRequest,
        Refusal::TargetError,
        Refusal::Incomplete,
    ];

    /// The reason a login refused with `status` counts under.
    pub fn of(status: LoginStatus) -> Refusal {
        match status {
            LoginStatus::AUTHENTICATION_FAILURE => Refusal::Auth,
            LoginStatus::AUTHORIZATION_FAILURE => Refusal::Acl,
            LoginStatus::NOT_FOUND
            | LoginStatus::TARGET_REMOVED
            | LoginStatus::SESSION_DOES_NOT_EXIST => Refusal::NotFound,
            LoginStatus::TOO_MANY_CONNECTIONS | LoginStatus::OUT_OF_RESOURCES => Refusal::Limits,
            s if s.class == 3 => Refusal::TargetError,
            _ => Refusal::BadRequest,
        }
    }

    /// Its name as a label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Auth => "auth",
            Refusal::LockedOut => "locked_out",
            Refusal::Acl => "acl",
            Refusal::NotFound => "not_found",
            Refusal::Limits => "limits",
            Refusal::BadRequest => "bad_request",
            Refusal::TargetError => "target_error",
            Refusal::Incomplete => "incomplete",
        }
    }
}

/// Error recovery summed over connections (the fields of [`RecoveryCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryTotals {
    pub header_digest_errors: u64,
    pub data_digest_errors: u64,
    pub recovery_r2ts: u64,
    pub status_snacks: u64,
    pub data_snacks: u64,
    pub data_acks: u64,
    pub task_reassigns: u64,
}

impl RecoveryTotals {
    fn add(&mut self, c: &RecoveryCounters) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.header_digest_errors += get(&c.header_digest_discards);
        self.data_digest_errors += get(&c.data_digest_rejects);
        self.recovery_r2ts += get(&c.recovery_r2ts);
        self.status_snacks += get(&c.status_snacks);
        self.data_snacks += get(&c.data_snacks);
        self.data_acks += get(&c.data_acks);
        self.task_reassigns += get(&c.task_reassigns);
    }
}

/// The connections in full feature phase, and what closed ones recovered.
#[derive(Default)]
struct Connections {
    next: u64,
    live: HashMap<u64, Arc<RecoveryCounters>>,
    closed: u64,
    closed_recovery: RecoveryTotals,
}

/// The counters of one target runtime.
#[derive(Default)]
pub(crate) struct TargetStats {
    logins_accepted: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    session_reinstatements: AtomicU64,
    logouts: AtomicU64,
    connections: Mutex<Connections>,
}

impl TargetStats {
    /// A login was refused (or broke off) for `why`.
    pub fn refused(&self, why: Refusal) {
        let i = Refusal::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.refused[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A login was refused with `status`.
    pub fn refused_with(&self, status: LoginStatus) {
        self.refused(Refusal::of(status));
    }

    pub fn session_reinstated(&self) {
        self.session_reinstatements.fetch_add(1, Ordering::Relaxed);
    }

    pub fn logout(&self) {
        self.logouts.fetch_add(1, Ordering::Relaxed);
    }

    /// A login completed and its connection entered full feature phase, recovering into
    /// `recovery`: it counts as live until the returned guard drops.
    pub fn connection_started(
        self: &Arc<Self>,
        recovery: &Arc<RecoveryCounters>,
    ) -> LiveConnection {
        self.logins_accepted.fetch_add(1, Ordering::Relaxed);
        let mut c = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let id = c.next;
        c.next += 1;
        c.live.insert(id, recovery.clone());
        LiveConnection {
            stats: self.clone(),
            id,
        }
    }

    fn snapshot(&self) -> (u64, u64, RecoveryTotals) {
        let c = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let mut recovery = c.closed_recovery;
        for r in c.live.values() {
            recovery.add(r);
        }
        (c.live.len() as u64, c.closed, recovery)
    }
}

/// A connection in full feature phase (see [`TargetStats::connection_started`]); dropping
/// it moves the connection's recovery counts to the closed connections' totals.
pub(crate) struct LiveConnection {
    stats: Arc<TargetStats>,
    id: u64,
}

impl Drop for LiveConnection {
    fn drop(&mut self) {
        let mut c = self
            .stats
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(r) = c.live.remove(&self.id) {
            c.closed += 1;
            c.closed_recovery.add(&r);
        }
    }
}

/// A target's counters as read (see [`Target::stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatsSnapshot {
    /// Sessions open now (normal and discovery).
    pub sessions: u64,
    /// Connections in full feature phase now.
    pub connections: u64,
    /// Connections that left full feature phase, for any reason.
    pub connections_closed: u64,
    /// Logins that reached full feature phase.
    pub logins_accepted: u64,
    /// Logins refused or broken off, by reason.
    pub logins_refused: Vec<(Refusal, u64)>,
    /// Sessions closed by a login of the same initiator, ISID and target.
    pub session_reinstatements: u64,
    /// Logout Requests answered.
    pub logouts: u64,
    /// Error recovery of all connections, live and closed.
    pub recovery: RecoveryTotals,
}

impl Target {
    /// The target's counters now.
    pub fn stats(&self) -> TargetStatsSnapshot {
        let s = &self.stats;
        let (connections, connections_closed, recovery) = s.snapshot();
        TargetStatsSnapshot {
            sessions: self.session_count() as u64,
            connections,
            connections_closed,
            logins_accepted: s.logins_accepted.load(Ordering::Relaxed),
            logins_refused: Refusal::ALL
                .iter()
                .zip(&s.refused)
                .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
                .collect(),
            session_reinstatements: s.session_reinstatements.load(Ordering::Relaxed),
            logouts: s.logouts.load(Ordering::Relaxed),
            recovery,
        }
    }

    /// The LUN counters of every target serving now: (target name, LUN, counters).
    pub fn lun_stats(&self) -> Vec<(String, u64, scsi::LunStatsSnapshot)> {
        let devices: Vec<Arc<scsi::Device>> = self
            .devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let mut all: Vec<_> = devices
            .iter()
            .flat_map(|d| {
                let name = d.target_name().to_string();
                d.lun_stats()
                    .into_iter()
                    .map(move |(lun, s)| (name.clone(), lun, s))
            })
            .collect();
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_follow_the_login_status() {
        assert_eq!(
            Refusal::of(LoginStatus::AUTHENTICATION_FAILURE),
            Refusal::Auth
        );
        assert_eq!(
            Refusal::of(LoginStatus::AUTHORIZATION_FAILURE),
            Refusal::Acl
        );
        assert_eq!(Refusal::of(LoginStatus::NOT_FOUND), Refusal::NotFound);
        assert_eq!(Refusal::of(LoginStatus::OUT_OF_RESOURCES), Refusal::Limits);
        assert_eq!(
            Refusal::of(LoginStatus::MISSING_PARAMETER),
            Refusal::BadRequest
        );
        assert_eq!(
            Refusal::of(LoginStatus::SERVICE_UNAVAILABLE),
            Refusal::TargetError
        );
    }

    #[test]
    fn recovery_of_live_and_closed_connections_adds_up() {
        let stats = Arc::new(TargetStats::default());
        let a = Arc::new(RecoveryCounters::default());
        let b = Arc::new(RecoveryCounters::default());
        let live_a = stats.connection_started(&a);
        let live_b = stats.connection_started(&b);
        RecoveryCounters::bump(&a.header_digest_discards);
        RecoveryCounters::add(&b.data_snacks, 3);
        assert_eq!(stats.snapshot().0, 2);
        drop(live_a);
        // Counted once, whether a connection is live or closed.
        let (live, closed, r) = stats.snapshot();
        assert_eq!((live, closed), (1, 1));
        assert_eq!(r.header_digest_errors, 1);
        assert_eq!(r.data_snacks, 3);
        drop(live_b);
        let (live, closed, r) = stats.snapshot();
        assert_eq!((live, closed), (0, 2));
        assert_eq!((r.header_digest_errors, r.data_snacks), (1, 3));
        assert_eq!(stats.logins_accepted.load(Ordering::Relaxed), 2);
        stats.refused(Refusal::Limits);
        stats.refused_with(LoginStatus::TOO_MANY_CONNECTIONS);
        assert_eq!(stats.refused[4].load(Ordering::Relaxed), 2);
    }
}
