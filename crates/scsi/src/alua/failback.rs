//! Failback: a `preferred` gateway takes its LUNs back from a peer once it has been a
//! healthy non-owner for `failback_delay_ms`, without waiting for a host to send it a write.
//!
//! The move is an ordinary forced takeover (the watcher's `TakingOver`), so the old owner
//! sees its hold broken, lets the writes it admitted finish, releases, and sits out its
//! hold-down, and both gateways announce the change. Against ping-pong: a host that keeps
//! writing to the peer makes the peer take the LUN over again only after that hold-down,
//! and a failback undone that way is not retried until this gateway owns the LUN by other
//! means (a host's write, a free lock) or restarts: the host has shown it wants the peer.

use std::time::{Duration, Instant};

use super::{Phase, Watcher};

/// One LUN's failback bookkeeping (in the watcher's and the commands' shared state).
#[derive(Debug, Default)]
pub(super) struct Failback {
    /// Since when this gateway has been a non-owner whose ownership calls succeed.
    healthy_since: Option<Instant>,
    /// The takeover under way was started by failback.
    pending: bool,
    /// This gateway's current ownership came from a failback.
    owns_by_failback: bool,
    /// A peer took the LUN over again after a failback: none is tried until this gateway
    /// owns the LUN by other means.
    undone: bool,
    /// Failbacks that succeeded.
    pub(super) count: u64,
}

impl Failback {
    /// Follows a phase change (every change goes through `Shared::set`).
    pub(super) fn phase_changed(&mut self, before: Phase, next: Phase) {
        match next {
            Phase::NonOwner if before != Phase::NonOwner => {
                self.healthy_since = Some(Instant::now())
            }
            Phase::NonOwner => {}
            _ => self.healthy_since = None,
        }
        if next != Phase::TakingOver && next != Phase::Owner {
            self.pending = false;
        }
    }

    /// This gateway became the owner (before the phase changes to `Owner`).
    pub(super) fn acquired(&mut self) {
        self.owns_by_failback = self.pending;
        if self.pending {
            self.count += 1;
        } else {
            self.undone = false;
        }
        self.pending = false;
    }

    /// This gateway lost the LUN to a peer.
    pub(super) fn lost(&mut self) {
        if std::mem::take(&mut self.owns_by_failback) {
            self.undone = true;
        }
    }
}

impl Watcher {
    /// On a healthy non-owner that is preferred: starts the takeover once the delay passed.
    pub(super) fn maybe_fail_back(&self, delay: Duration) {
        let mut inner = self.shared.lock();
        let due = inner.phase == Phase::NonOwner
            && inner.owner_id.is_some()
            && !inner.failback.undone
            && inner
                .failback
                .healthy_since
                .is_some_and(|t| t.elapsed() >= delay);
        if !due {
            return;
        }
        tracing::info!(
            lun = self.lun,
            owner = inner.owner_id.as_deref().unwrap_or(""),
            "failback: this preferred gateway takes the LUN back"
        );
        inner.wanted = Some(Instant::now());
        inner.failback.pending = true;
        self.shared.set(&mut inner, Phase::TakingOver);
    }
}
