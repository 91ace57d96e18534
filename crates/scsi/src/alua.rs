//! Asymmetric logical unit access (SPC-4 5.16) for several gateways exporting the same LUNs
//! as one logical target (`[gateway]`, [`GatewayConfig`]).
//!
//! Each gateway is one target port group holding one target port. A shared LUN has an owner
//! ([`ExclusiveOwner`]: the backend's own lock, or a lock file): the gateway that owns it
//! reports its group active/optimized, the others active/non-optimized. Ownership follows
//! the host implicitly: a command that writes the medium (and, with `reads_take_over`, one
//! that reads it) arriving on a non-owner makes that gateway take the LUN over
//! (`acquire(force)`); commands meanwhile wait for the takeover, at most [`TAKEOVER_WAIT`],
//! then answer NOT READY, ASYMMETRIC ACCESS STATE TRANSITION, which hosts retry (never BUSY).
//! The old owner learns it lost the LUN at its next check (every `check_interval_ms`, and
//! at once after a failed write), lets the writes it admitted finish, releases, and for
//! `hold_down_ms` reports its group transitioning and does not take the LUN back, so a host
//! that briefly sends on both paths converges on one gateway. A gateway whose ownership calls
//! fail (storage unreachable) reports its group unavailable and serves no medium access.
//! Every change of this gateway's state for a LUN raises ASYMMETRIC ACCESS STATE CHANGED for
//! every I_T nexus (`Lun::announce_alua`).
//!
//! All blocking ownership calls of a LUN run on one thread of its own (the watcher), so they
//! never block a command and never race each other; commands and the watcher meet in a
//! mutex-guarded phase and a `watch` channel of state changes.
//!
//! A `preferred` gateway with `failback_delay_ms` takes a LUN back on its own once it has
//! been a healthy non-owner that long ([`failback`]). A new I_T nexus hears ASYMMETRIC ACCESS
//! STATE CHANGED once for every shared LUN, so a host whose path came back (to a restarted
//! gateway, say) reads the groups again rather than keep the states it saw before.
//!
//! A LUN without an owner (not shared) is active/optimized here. Peers' states in REPORT
//! TARGET PORT GROUPS are inferred: the owner's group (its lock id matched to a peer's
//! `name`) active/optimized, the rest active/non-optimized; a host asks each gateway for its
//! own state, and a peer whose state is unknown is listed active/non-optimized, never in a
//! state that would make a host fail I/O on that path without asking it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use storage::ExclusiveOwner;
use tokio::sync::watch;

use crate::cdb::{be32, op};
use crate::config::GatewayConfig;
use crate::outcome::Fail;
use crate::sense::{asc, key, Sense};

mod failback;
use failback::Failback;

/// How long a command waits for a takeover it started (or found running) before it answers
/// NOT READY, transitioning.
pub const TAKEOVER_WAIT: Duration = Duration::from_secs(2);
/// How long a stopping LUN waits for its admitted writes before it releases ownership.
const STOP_DRAIN: Duration = Duration::from_secs(30);
/// The watcher's pace while a takeover or a release is under way.
const FAST_TICK: Duration = Duration::from_millis(20);

/// SERVICE ACTION of MAINTENANCE IN: REPORT TARGET PORT GROUPS.
pub(crate) const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;

/// A target port group's asymmetric access state for a LUN (its code in RTPG).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized = 0x0,
    ActiveNonOptimized = 0x1,
    Standby = 0x2,
    Unavailable = 0x3,
    Offline = 0xE,
    Transitioning = 0xF,
}

impl AccessState {
    /// The name the control socket and logs use.
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active/optimized",
            AccessState::ActiveNonOptimized => "active/non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Offline => "offline",
            AccessState::Transitioning => "transitioning",
        }
    }

    /// The NOT READY sense a command this state does not serve gets.
    fn refusal(self) -> Sense {
        let code = match self {
            AccessState::Standby => asc::ALUA_STANDBY,
            AccessState::Unavailable => asc::ALUA_UNAVAILABLE,
            AccessState::Offline => asc::NOT_READY_OFFLINE,
            _ => asc::ALUA_TRANSITIONING,
        };
        Sense::new(key::NOT_READY, code)
    }

    /// Whether a port in this state serves `opcode` (SPC-4 5.16.2.4): both active states
    /// everything; standby the commands about the unit and its settings; unavailable,
    /// offline and transitioning only INQUIRY, REPORT LUNS, REQUEST SENSE and MAINTENANCE
    /// IN (REPORT TARGET PORT GROUPS, REPORT SUPPORTED OPERATION CODES).
    pub fn serves(self, opcode: u8) -> bool {
        let informational = matches!(
            opcode,
            op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE | op::MAINTENANCE_IN
        );
        match self {
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => true,
            AccessState::Standby => {
                informational
                    || matches!(
                        opcode,
                        op::MODE_SENSE_6
                            | op::MODE_SENSE_10
                            | op::MODE_SELECT_6
                            | op::MODE_SELECT_10
                            | op::LOG_SENSE
                            | op::PR_IN
                            | op::PR_OUT
                    )
            }
            _ => informational,
        }
    }
}

/// Commands that change the medium: on a non-owner they take the LUN over.
pub(crate) fn writes_medium(opcode: u8) -> bool {
    matches!(
        opcode,
        op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_ATOMIC_16
            | op::WRITE_VERIFY_10
            | op::WRITE_VERIFY_12
            | op::WRITE_VERIFY_16
            | op::ORWRITE_16
            | op::COMPARE_AND_WRITE
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
            | op::UNMAP
            | op::SANITIZE
            | op::EXTENDED_COPY
            | op::FORMAT_UNIT
    )
}

/// Commands that read the medium (they take the LUN over only with `reads_take_over`).
fn reads_medium(opcode: u8) -> bool {
    matches!(
        opcode,
        op::READ_6
            | op::READ_10
            | op::READ_12
            | op::READ_16
            | op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::PRE_FETCH_10
            | op::PRE_FETCH_16
    )
}

/// Where a shared LUN's ownership stands on this gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No owner to ask (the LUN is not shared): active/optimized for good.
    Unshared,
    /// The first ownership check has not answered yet.
    Starting,
    Owner,
    NonOwner,
    /// A command asked for the LUN; the watcher is acquiring it.
    TakingOver,
    /// Ownership was lost: admitted writes finish, then the lock is released.
    Releasing,
    /// Released; the LUN is not taken back before this instant.
    HoldDown(Instant),
    /// Ownership calls fail; `was_owner` says whether this gateway held the LUN before.
    Unreachable {
        was_owner: bool,
    },
    /// The gateway is stopping: ownership is being or has been given up.
    Stopped,
    /// Set by tests.
    #[cfg(test)]
    Forced(AccessState),
}

impl Phase {
    fn state(self) -> AccessState {
        match self {
            Phase::Unshared | Phase::Owner => AccessState::ActiveOptimized,
            Phase::NonOwner => AccessState::ActiveNonOptimized,
            Phase::Starting | Phase::TakingOver | Phase::Releasing | Phase::HoldDown(_) => {
                AccessState::Transitioning
            }
            Phase::Unreachable { .. } | Phase::Stopped => AccessState::Unavailable,
            #[cfg(test)]
            Phase::Forced(s) => s,
        }
    }

    fn same_kind(self, other: Phase) -> bool {
        std::mem::discriminant(&self) == std::mem::discriminant(&other)
    }
}

struct Inner {
    phase: Phase,
    /// When a command last asked for a takeover.
    wanted: Option<Instant>,
    /// Writes admitted while this gateway owned the LUN, not finished yet.
    writes: usize,
    /// The owner's id as last seen.
    owner_id: Option<String>,
    /// Check now rather than at the next tick.
    poke: bool,
    acquired: u64,
    lost: u64,
    last_error: Option<String>,
    failback: Failback,
}

/// What commands and the watcher share.
struct Shared {
    inner: Mutex<Inner>,
    wake: Condvar,
    /// The number of state changes so far, published on every change.
    changes: watch::Sender<u64>,
    /// Set by the watcher once it released ownership and ended.
    done: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves to `next`; counts and publishes a change of the reported state (the first
    /// answer after start is no change a host saw).
    fn set(&self, inner: &mut Inner, next: Phase) {
        let before = inner.phase;
        inner.phase = next;
        inner.failback.phase_changed(before, next);
        if next.state() != before.state() && before != Phase::Starting {
            self.changes.send_modify(|n| *n += 1);
        }
        self.wake.notify_all();
    }
}

/// What [`LunAlua::status`] tells about one LUN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AluaStatus {
    /// This gateway's state for the LUN.
    pub state: AccessState,
    /// Whether the LUN is shared (has an owner to ask).
    pub shared: bool,
    /// The owner's id as last seen.
    pub owner: Option<String>,
    /// Times this gateway acquired the LUN, and lost it.
    pub acquired: u64,
    pub lost: u64,
    /// Times this gateway took the LUN back as the preferred gateway (failback).
    pub failbacks: u64,
    /// The last failed ownership call.
    pub last_error: Option<String>,
}

/// A LUN's ALUA side on this gateway.
pub(crate) struct LunAlua {
    gateway: Arc<GatewayConfig>,
    shared: Arc<Shared>,
}

/// A write admitted while this gateway owned the LUN: ownership is not released before it
/// is dropped.
pub(crate) struct AdmittedWrite(Arc<Shared>);

impl Drop for AdmittedWrite {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.writes -= 1;
        if inner.writes == 0 {
            self.0.wake.notify_all();
        }
    }
}

impl LunAlua {
    /// The ALUA side of LUN `lun`; with an owner, its watcher thread starts at once.
    pub fn new(
        gateway: Arc<GatewayConfig>,
        lun: u64,
        owner: Option<Arc<dyn ExclusiveOwner>>,
    ) -> LunAlua {
        let phase = if owner.is_some() {
            Phase::Starting
        } else {
            Phase::Unshared
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                phase,
                wanted: None,
                writes: 0,
                owner_id: None,
                poke: false,
                acquired: 0,
                lost: 0,
                last_error: None,
                failback: Failback::default(),
            }),
            wake: Condvar::new(),
            changes: watch::Sender::new(0),
            done: AtomicBool::new(owner.is_none()),
        });
        if let Some(owner) = owner {
            let watcher = Watcher {
                shared: shared.clone(),
                owner,
                interval: Duration::from_millis(gateway.check_interval_ms),
                hold_down: Duration::from_millis(gateway.hold_down_ms),
                failback: (gateway.preferred && gateway.failback_delay_ms > 0)
                    .then(|| Duration::from_millis(gateway.failback_delay_ms)),
                lun,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("alua-lun{lun}"))
                .spawn(move || watcher.run());
            if let Err(e) = spawned {
                let mut inner = shared.lock();
                inner.last_error = Some(format!("cannot start the ownership watcher: {e}"));
                shared.set(&mut inner, Phase::Unreachable { was_owner: false });
            }
        }
        LunAlua { gateway, shared }
    }

    /// How many times the state changed so far (for the unit attention).
    pub fn changes(&self) -> u64 {
        *self.shared.changes.borrow()
    }

    pub fn status(&self) -> AluaStatus {
        let inner = self.shared.lock();
        AluaStatus {
            state: inner.phase.state(),
            shared: inner.phase != Phase::Unshared,
            owner: inner.owner_id.clone(),
            acquired: inner.acquired,
            lost: inner.lost,
            failbacks: inner.failback.count,
            last_error: inner.last_error.clone(),
        }
    }

    /// Asks the watcher to check ownership now (a write failed: the LUN may be lost).
    pub fn poke(&self) {
        let mut inner = self.shared.lock();
        inner.poke = true;
        self.shared.wake.notify_all();
    }

    /// Gives ownership up for good (the gateway is stopping): the state becomes unavailable
    /// at once, and the watcher releases once admitted writes are done.
    pub fn stop(&self) {
        let mut inner = self.shared.lock();
        if inner.phase != Phase::Unshared {
            self.shared.set(&mut inner, Phase::Stopped);
        }
    }

    /// Whether the LUN has an owner to ask (a new nexus hears of its state).
    pub fn shared(&self) -> bool {
        self.shared.lock().phase != Phase::Unshared
    }

    /// Whether ownership was given up after [`LunAlua::stop`] (or there was none).
    pub fn stopped(&self) -> bool {
        self.shared.done.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub fn force(&self, state: AccessState) {
        let mut inner = self.shared.lock();
        self.shared.set(&mut inner, Phase::Forced(state));
    }

    /// Whether `opcode` may run now; a medium write on a non-owner starts a takeover and
    /// waits for it (at most [`TAKEOVER_WAIT`]). A write admitted while this gateway owns
    /// the LUN comes back as an [`AdmittedWrite`] to hold until it is done.
    pub async fn admit(&self, opcode: u8) -> Result<Option<AdmittedWrite>, Fail> {
        let write = writes_medium(opcode);
        let takes_over = write || (self.gateway.reads_take_over && reads_medium(opcode));
        // Set up only when the command has to wait: the admitted path costs one lock.
        let mut wait: Option<(tokio::time::Instant, watch::Receiver<u64>)> = None;
        loop {
            {
                let mut inner = self.shared.lock();
                let state = inner.phase.state();
                match inner.phase {
                    Phase::Unshared => return Ok(None),
                    Phase::Owner if write => {
                        inner.writes += 1;
                        return Ok(Some(AdmittedWrite(self.shared.clone())));
                    }
                    Phase::NonOwner if takes_over => {
                        inner.wanted = Some(Instant::now());
                        self.shared.set(&mut inner, Phase::TakingOver);
                    }
                    Phase::Starting | Phase::TakingOver if !state.serves(opcode) => {
                        if takes_over {
                            inner.wanted = Some(Instant::now());
                        }
                    }
                    _ if state.serves(opcode) => return Ok(None),
                    _ => return Err(state.refusal().into()),
                }
                // Subscribed under the lock the state changes under, so no change after
                // this check goes unseen.
                wait.get_or_insert_with(|| {
                    let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
                    (deadline, self.shared.changes.subscribe())
                });
            }
            let (deadline, changes) = wait.as_mut().expect("set above");
            match tokio::time::timeout_at(*deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Err(AccessState::Transitioning.refusal().into()),
            }
        }
    }

    /// For EXTENDED COPY writing into this LUN on another's behalf: served only while this
    /// gateway owns the LUN (a takeover is asked for, not waited for).
    pub fn copy_check(&self, write: bool) -> Option<Fail> {
        let mut inner = self.shared.lock();
        let state = inner.phase.state();
        match inner.phase {
            Phase::Unshared | Phase::Owner => None,
            Phase::NonOwner if !write => None,
            Phase::NonOwner => {
                inner.wanted = Some(Instant::now());
                self.shared.set(&mut inner, Phase::TakingOver);
                Some(AccessState::Transitioning.refusal().into())
            }
            _ if state.serves(op::READ_16) && !write => None,
            _ => Some(state.refusal().into()),
        }
    }

    /// This gateway's port group's state and each peer's, inferred from ownership, as
    /// (group id, relative port, preferred, state), ascending by group.
    fn groups(&self) -> Vec<(u16, u16, bool, AccessState)> {
        let (own, owner_id, owned) = {
            let inner = self.shared.lock();
            let owned = matches!(inner.phase, Phase::Owner | Phase::Unshared);
            (inner.phase.state(), inner.owner_id.clone(), owned)
        };
        let g = &self.gateway;
        let mut groups = vec![(g.port_group, g.relative_port, g.preferred, own)];
        for p in &g.peers {
            let owns = !owned && owner_id.as_deref() == Some(p.name.as_str());
            let state = if owns {
                AccessState::ActiveOptimized
            } else {
                AccessState::ActiveNonOptimized
            };
            groups.push((p.port_group, p.relative_port, p.preferred, state));
        }
        groups.sort_by_key(|g| g.0);
        groups
    }

    /// REPORT TARGET PORT GROUPS (MAINTENANCE IN, service action 0Ah): the length-only
    /// header (PARAMETER DATA FORMAT 000b) or the extended one (001b, with the implicit
    /// transition time), then one descriptor per group, cut to the allocation length.
    pub fn report_target_port_groups(&self, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let format = cdb[1] >> 5;
        if format > 1 {
            return Err(Sense::invalid_cdb_field(1, Some(7)));
        }
        let alloc = be32(cdb, 6) as usize;
        let mut d = vec![0u8; if format == 1 { 8 } else { 4 }];
        if format == 1 {
            d[4] = 0x10; // FORMAT TYPE 001b
            d[5] = self.implicit_transition_secs();
        }
        let implicit = {
            let inner = self.shared.lock();
            inner.acquired + inner.lost > 0
        };
        for (group, port, preferred, state) in self.groups() {
            d.push(if preferred { 0x80 } else { 0 } | state as u8);
            // Supported: T_SUP, U_SUP, AN_SUP, AO_SUP.
            d.push(0x80 | 0x08 | 0x02 | 0x01);
            d.extend_from_slice(&group.to_be_bytes());
            d.push(0);
            // STATUS CODE: 02h, altered by implicit behaviour, once ownership ever moved.
            d.push(if implicit { 0x02 } else { 0 });
            d.push(0);
            d.push(1); // TARGET PORT COUNT
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&port.to_be_bytes());
        }
        let len = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&len.to_be_bytes());
        d.truncate(alloc);
        Ok(d)
    }

    /// Seconds an implicit transition may take: a hold-down, the checks around it and a
    /// takeover wait, rounded up (at most 255).
    fn implicit_transition_secs(&self) -> u8 {
        let ms = self.gateway.hold_down_ms
            + 2 * self.gateway.check_interval_ms
            + TAKEOVER_WAIT.as_millis() as u64;
        ms.div_ceil(1000).min(255) as u8
    }

    /// VPD 0x83's target port designators: relative target port (type 4h) and target port
    /// group (type 5h), both iSCSI (PIV) and associated with the target port.
    pub fn designators(&self) -> [u8; 16] {
        let port = self.gateway.relative_port.to_be_bytes();
        let group = self.gateway.port_group.to_be_bytes();
        [
            0x51, 0x94, 0x00, 0x04, 0, 0, port[0], port[1], // relative target port
            0x51, 0x95, 0x00, 0x04, 0, 0, group[0], group[1], // target port group
        ]
    }
}

impl Drop for LunAlua {
    fn drop(&mut self) {
        let mut inner = self.shared.lock();
        if inner.phase != Phase::Unshared {
            self.shared.set(&mut inner, Phase::Stopped);
        }
    }
}

/// The thread that makes a LUN's blocking ownership calls.
struct Watcher {
    shared: Arc<Shared>,
    owner: Arc<dyn ExclusiveOwner>,
    interval: Duration,
    hold_down: Duration,
    /// `failback_delay_ms` on a preferred gateway.
    failback: Option<Duration>,
    lun: u64,
}

impl Watcher {
    fn run(self) {
        loop {
            let phase = self.next_phase();
            if phase == Phase::Stopped {
                self.give_up();
                return;
            }
            self.step(phase);
        }
    }

    /// Waits for the next tick (or a poke, or a change a command made), and returns the
    /// phase to act on.
    fn next_phase(&self) -> Phase {
        let mut inner = self.shared.lock();
        let tick = match inner.phase {
            Phase::Starting => Duration::ZERO,
            Phase::TakingOver | Phase::Releasing => FAST_TICK,
            _ => self.interval,
        };
        let seen = inner.phase;
        if !tick.is_zero() && !inner.poke {
            let (guard, _) = self
                .shared
                .wake
                .wait_timeout_while(inner, tick, |i| {
                    !i.poke && i.phase == seen && !(i.phase == Phase::Releasing && i.writes == 0)
                })
                .unwrap_or_else(|e| e.into_inner());
            inner = guard;
        }
        inner.poke = false;
        inner.phase
    }

    /// Moves from `from` to `next` unless a command or a stop changed the phase meanwhile.
    fn move_from(&self, from: Phase, next: Phase, what: impl FnOnce(&mut Inner)) {
        let mut inner = self.shared.lock();
        if inner.phase.same_kind(from) {
            what(&mut inner);
            if inner.phase != next {
                tracing::info!(
                    lun = self.lun,
                    from = inner.phase.state().name(),
                    to = next.state().name(),
                    owner = self.owner.id(),
                    "ALUA state of this gateway"
                );
            }
            self.shared.set(&mut inner, next);
        }
    }

    fn unreachable(&self, from: Phase, was_owner: bool, e: std::io::Error) {
        tracing::warn!(lun = self.lun, error = %e, "LUN ownership unknown: storage unreachable");
        self.move_from(from, Phase::Unreachable { was_owner }, |i| {
            i.last_error = Some(e.to_string())
        });
    }

    fn became_owner(&self, from: Phase) {
        let id = self.owner.id().to_string();
        self.move_from(from, Phase::Owner, |i| {
            i.failback.acquired();
            i.acquired += 1;
            i.owner_id = Some(id);
            i.last_error = None;
        });
    }

    fn step(&self, phase: Phase) {
        match phase {
            Phase::Starting => match self.owner.acquire(false) {
                Ok(true) => self.became_owner(phase),
                Ok(false) => self.observe(phase),
                Err(e) => self.unreachable(phase, false, e),
            },
            Phase::Owner => match self.owner.is_owner() {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(lun = self.lun, "LUN ownership lost to another gateway");
                    self.move_from(phase, Phase::Releasing, |i| {
                        i.lost += 1;
                        i.owner_id = None;
                        i.failback.lost();
                    })
                }
                Err(e) => self.unreachable(phase, true, e),
            },
            Phase::NonOwner => {
                self.observe(phase);
                if let Some(delay) = self.failback {
                    self.maybe_fail_back(delay);
                }
            }
            Phase::TakingOver => self.take_over(phase),
            Phase::Releasing => {
                if self.shared.lock().writes == 0 {
                    if let Err(e) = self.owner.release() {
                        tracing::debug!(lun = self.lun, error = %e, "release after losing the LUN");
                    }
                    let until = Instant::now() + self.hold_down;
                    self.move_from(phase, Phase::HoldDown(until), |_| {});
                }
            }
            Phase::HoldDown(until) => {
                if Instant::now() >= until {
                    self.observe(phase);
                } else {
                    self.learn_owner();
                }
            }
            Phase::Unreachable { was_owner } => match self.owner.is_owner() {
                Ok(true) => self.move_from(phase, Phase::Owner, |i| i.last_error = None),
                Ok(false) if was_owner => self.move_from(phase, Phase::Releasing, |i| {
                    i.lost += 1;
                    i.last_error = None;
                    i.failback.lost();
                }),
                Ok(false) => self.observe(phase),
                Err(_) => {}
            },
            #[cfg(test)]
            Phase::Forced(_) => {}
            Phase::Unshared | Phase::Stopped => {}
        }
    }

    /// Not the owner: learns who is, and takes the LUN if nobody holds it.
    fn observe(&self, from: Phase) {
        match self.owner.owner() {
            Ok(Some(id)) => self.move_from(from, Phase::NonOwner, |i| {
                i.owner_id = Some(id);
                i.last_error = None;
            }),
            Ok(None) => match self.owner.acquire(false) {
                Ok(true) => self.became_owner(from),
                Ok(false) => self.move_from(from, Phase::NonOwner, |i| i.owner_id = None),
                Err(e) => self.unreachable(from, false, e),
            },
            Err(e) => self.unreachable(from, false, e),
        }
    }

    fn learn_owner(&self) {
        if let Ok(id) = self.owner.owner() {
            self.shared.lock().owner_id = id;
        }
    }

    /// A command asked for the LUN: forces acquisition while commands keep asking.
    fn take_over(&self, phase: Phase) {
        let wanted = self.shared.lock().wanted;
        if wanted.is_none_or(|w| w.elapsed() > TAKEOVER_WAIT + self.interval) {
            // Nobody asks any more: the host went elsewhere.
            return self.observe(phase);
        }
        match self.owner.acquire(true) {
            Ok(true) => {
                tracing::info!(lun = self.lun, "LUN taken over by this gateway");
                self.became_owner(phase)
            }
            Ok(false) => {}
            Err(e) => self.unreachable(phase, false, e),
        }
    }

    /// The gateway stops: admitted writes finish (bounded), then ownership is released.
    fn give_up(&self) {
        let deadline = Instant::now() + STOP_DRAIN;
        let mut inner = self.shared.lock();
        while inner.writes > 0 && Instant::now() < deadline {
            inner = self
                .shared
                .wake
                .wait_timeout(inner, FAST_TICK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(inner);
        if let Err(e) = self.owner.release() {
            tracing::debug!(lun = self.lun, error = %e, "release at stop");
        }
        self.shared.done.store(true, Ordering::Release);
    }
}
