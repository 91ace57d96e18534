//! The target's status numbering for one connection (RFC 7143 §4.2.2.2): every
//! status-bearing PDU (SCSI Response, Data-In with status, TMF/Text/Logout responses, Reject,
//! Async Message, a NOP-In answering a NOP-Out) takes the next StatSN; the initiator
//! acknowledges with ExpStatSN, and until then the target keeps each status so that a later
//! error recovery level can resend it (status SNACK). The runtime assigns the number and
//! queues the PDU to its transport under one ordering lock, so StatSNs reach the wire in order.

use iscsi_wire::serial::sn_lt;
use std::collections::VecDeque;

/// Status kept for retransmission at most (older entries are dropped first: at ERL 0
/// nothing asks for them, and an initiator that never acknowledges must not grow memory).
pub const RETAINED_MAX: usize = 1024;

/// Statuses dropped unacknowledged waiting to be handed over by the next
/// [`StatusSeq::acknowledge_each`] at most (every PDU an initiator sends that can cause a
/// status also acknowledges, so this is only ever reached by absurd bursts).
const DROPPED_MAX: usize = RETAINED_MAX;

/// StatSN assignment and retention of unacknowledged status for one connection. `T` is
/// what the runtime keeps to resend a status (a PDU).
#[derive(Debug)]
pub struct StatusSeq<T> {
    next: u32,
    retained: VecDeque<(u32, T)>,
    /// Statuses dropped past [`RETAINED_MAX`] before their acknowledgement: they can no
    /// longer be acknowledged, so [`StatusSeq::acknowledge_each`] hands them over with the
    /// acknowledged ones (at ErrorRecoveryLevel 2 what they ended must not be kept forever).
    dropped: Vec<T>,
}

impl<T> StatusSeq<T> {
    /// Numbering that continues after login: `next` is the StatSN of the first status in
    /// full feature phase.
    pub fn new(next: u32) -> Self {
        StatusSeq {
            next,
            retained: VecDeque::new(),
            dropped: Vec::new(),
        }
    }

    /// The StatSN the next status takes (also what non-status PDUs carry).
    pub fn next(&self) -> u32 {
        self.next
    }

    /// Takes the next StatSN for a status and keeps `status` until it is acknowledged.
    pub fn assign(&mut self, status: T) -> u32 {
        let sn = self.next;
        self.next = self.next.wrapping_add(1);
        if self.retained.len() == RETAINED_MAX {
            if let Some((_, old)) = self.retained.pop_front() {
                if self.dropped.len() < DROPPED_MAX {
                    self.dropped.push(old);
                }
            }
        }
        self.retained.push_back((sn, status));
        sn
    }

    /// The initiator's ExpStatSN: every status numbered below it was received. A value
    /// beyond what was sent is ignored (the initiator is wrong, not us).
    pub fn acknowledge(&mut self, exp_stat_sn: u32) {
        self.acknowledge_each(exp_stat_sn, |_| {});
    }

    /// [`StatusSeq::acknowledge`], handing each status it forgets to `forgotten` (at
    /// ErrorRecoveryLevel 2 a task is kept until its status is acknowledged), and first
    /// those dropped unacknowledged since the last call.
    pub fn acknowledge_each(&mut self, exp_stat_sn: u32, mut forgotten: impl FnMut(T)) {
        for t in self.dropped.drain(..) {
            forgotten(t);
        }
        if sn_lt(self.next, exp_stat_sn) {
            return;
        }
        while self
            .retained
            .front()
            .is_some_and(|(sn, _)| sn_lt(*sn, exp_stat_sn))
        {
            if let Some((_, t)) = self.retained.pop_front() {
                forgotten(t);
            }
        }
    }

    /// The retained status numbered `stat_sn`, if still kept (for a status SNACK).
    pub fn retained(&self, stat_sn: u32) -> Option<&T> {
        self.retained
            .iter()
            .find(|(sn, _)| *sn == stat_sn)
            .map(|(_, t)| t)
    }

    /// The retained status numbered `stat_sn`, to change what a later Status SNACK resends
    /// (an R-Data SNACK's tag).
    pub fn retained_mut(&mut self, stat_sn: u32) -> Option<&mut T> {
        self.retained
            .iter_mut()
            .find(|(sn, _)| *sn == stat_sn)
            .map(|(_, t)| t)
    }

    /// The oldest StatSN still retained (`next()` when none is).
    pub fn first_retained(&self) -> u32 {
        self.retained.front().map_or(self.next, |(sn, _)| *sn)
    }

    /// Statuses sent and not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.retained.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_order_and_forgets_what_is_acknowledged() {
        let mut s = StatusSeq::new(u32::MAX - 1);
        let a = s.assign("a");
        let b = s.assign("b");
        let c = s.assign("c");
        assert_eq!((a, b, c), (u32::MAX - 1, u32::MAX, 0), "serial wrap");
        assert_eq!(s.next(), 1);
        s.acknowledge(u32::MAX);
        assert_eq!(s.unacknowledged(), 2);
        assert_eq!(s.retained(u32::MAX), Some(&"b"));
        assert_eq!(s.retained(u32::MAX - 1), None);
        // An acknowledgement past what was sent is ignored.
        s.acknowledge(5);
        assert_eq!(s.unacknowledged(), 2);
        s.acknowledge(1);
        assert_eq!(s.unacknowledged(), 0);
    }

    #[test]
    fn acknowledging_hands_over_what_is_forgotten_in_order() {
        let mut s = StatusSeq::new(7);
        for t in ["a", "b", "c"] {
            s.assign(t);
        }
        let mut gone = Vec::new();
        s.acknowledge_each(9, |t| gone.push(t));
        assert_eq!(gone, ["a", "b"]);
        s.acknowledge_each(20, |t| gone.push(t)); // beyond what was sent: ignored
        assert_eq!(gone, ["a", "b"]);
    }

    #[test]
    fn retention_is_bounded() {
        let mut s = StatusSeq::new(0);
        for i in 0..RETAINED_MAX as u32 + 10 {
            s.assign(i);
        }
        assert_eq!(s.unacknowledged(), RETAINED_MAX);
        assert_eq!(s.retained(9), None);
        assert_eq!(s.retained(10), Some(&10));
        // Those dropped are handed over by the next acknowledgement, even one of nothing.
        let mut gone = Vec::new();
        s.acknowledge_each(0, |t| gone.push(t));
        assert_eq!(gone, (0..10).collect::<Vec<u32>>());
        s.acknowledge_each(0, |t| gone.push(t));
        assert_eq!(gone.len(), 10, "handed over once");
    }
}
