//! The target's command window: admits non-immediate commands in CmdSN order across all
//! connections of a session, silently drops those outside [ExpCmdSN, MaxCmdSN], and
//! computes the MaxCmdSN to advertise so that at most `depth` commands are outstanding.

use iscsi_wire::serial::{sn_in_window, sn_lt};
use std::collections::VecDeque;

/// What happened to a command offered to the window.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Queued; call `pop_ready` to take the commands that are now in order.
    Queued,
    /// CmdSN outside the window: the standard says to ignore it silently.
    OutOfWindow,
    /// A command with this CmdSN is already queued.
    Duplicate,
}

/// CmdSN ordering for one session.
#[derive(Debug)]
pub struct CmdWindow<T> {
    exp_cmd_sn: u32,
    advertised_max: u32,
    depth: u32,
    outstanding: u32,
    /// Slot i holds the command with CmdSN exp_cmd_sn + i.
    slots: VecDeque<Option<T>>,
}

impl<T> CmdWindow<T> {
    /// A window starting at the CmdSN of the leading login, allowing `depth` outstanding
    /// commands (at least 1).
    pub fn new(initial_cmd_sn: u32, depth: u32) -> Self {
        let depth = depth.max(1);
        CmdWindow {
            exp_cmd_sn: initial_cmd_sn,
            advertised_max: initial_cmd_sn.wrapping_add(depth - 1),
            depth,
            outstanding: 0,
            slots: VecDeque::new(),
        }
    }

    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }

    /// The MaxCmdSN to put in the next response. Never moves backwards: commands the
    /// initiator sent under an older, larger window are still accepted.
    pub fn max_cmd_sn(&mut self) -> u32 {
        let free = self
            .depth
            .saturating_sub(self.outstanding + self.slots.len() as u32);
        let candidate = self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1);
        if sn_lt(self.advertised_max, candidate) {
            self.advertised_max = candidate;
        }
        self.advertised_max
    }

    /// Offer a non-immediate command.
    pub fn admit(&mut self, cmd_sn: u32, item: T) -> Admission {
        match self.offer(cmd_sn, item) {
            Ok(()) => Admission::Queued,
            Err((why, _)) => why,
        }
    }

    /// Offer a non-immediate command; one not queued is handed back with the reason, so
    /// that its owner can free what it holds.
    pub fn offer(&mut self, cmd_sn: u32, item: T) -> Result<(), (Admission, T)> {
        if !sn_in_window(cmd_sn, self.exp_cmd_sn, self.advertised_max) {
            return Err((Admission::OutOfWindow, item));
        }
        let idx = cmd_sn.wrapping_sub(self.exp_cmd_sn) as usize;
        if self.slots.len() <= idx {
            self.slots.resize_with(idx + 1, || None);
        }
        if self.slots[idx].is_some() {
            return Err((Admission::Duplicate, item));
        }
        self.slots[idx] = Some(item);
        Ok(())
    }

    /// Take the next command that is in order, advancing ExpCmdSN. Each taken command
    /// counts as outstanding until `complete` is called for it.
    pub fn pop_ready(&mut self) -> Option<T> {
        match self.slots.front() {
            Some(Some(_)) => {
                let item = self.slots.pop_front().flatten();
                self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
                self.outstanding += 1;
                item
            }
            _ => None,
        }
    }

    /// Consume a CmdSN without a command to run (a Reject'ed PDU or a non-immediate NOP,
    /// Text or Logout handled inline): advances ExpCmdSN when it is the next one.
    pub fn consume(&mut self, cmd_sn: u32) -> bool {
        if cmd_sn == self.exp_cmd_sn && self.slots.front().is_none_or(|s| s.is_none()) {
            self.slots.pop_front();
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            true
        } else {
            false
        }
    }

    /// A command taken with `pop_ready` has finished.
    pub fn complete(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// Commands taken with `pop_ready` and not completed yet.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Commands waiting for a CmdSN gap to fill.
    pub fn queued(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn orders_across_gaps_and_drops_outside() {
        let mut w = CmdWindow::new(10, 4);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(12, "c"), Admission::Queued);
        assert_eq!(w.admit(11, "b"), Admission::Queued);
        assert_eq!(w.pop_ready(), None, "10 is missing");
        assert_eq!(w.admit(14, "x"), Admission::OutOfWindow);
        assert_eq!(w.admit(9, "old"), Admission::OutOfWindow);
        assert_eq!(w.admit(11, "b2"), Admission::Duplicate);
        assert_eq!(w.admit(10, "a"), Admission::Queued);
        assert_eq!(w.pop_ready(), Some("a"));
        assert_eq!(w.pop_ready(), Some("b"));
        assert_eq!(w.pop_ready(), Some("c"));
        assert_eq!(w.pop_ready(), None);
        assert_eq!(w.exp_cmd_sn(), 13);
        // Three outstanding of four: only 13 may come; the advertised max never shrinks.
        assert_eq!(w.max_cmd_sn(), 13);
        w.complete();
        w.complete();
        assert_eq!(w.max_cmd_sn(), 15);
    }

    #[test]
    fn wraps_at_u32_max() {
        let mut w = CmdWindow::new(u32::MAX, 3);
        assert_eq!(w.admit(1, 2), Admission::Queued);
        assert_eq!(w.admit(u32::MAX, 0), Admission::Queued);
        assert_eq!(w.admit(0, 1), Admission::Queued);
        assert_eq!(
            (w.pop_ready(), w.pop_ready(), w.pop_ready()),
            (Some(0), Some(1), Some(2))
        );
        assert_eq!(w.exp_cmd_sn(), 2);
    }

    #[test]
    fn consume_advances_only_in_order() {
        let mut w: CmdWindow<()> = CmdWindow::new(5, 8);
        assert!(!w.consume(6));
        assert!(w.consume(5));
        assert_eq!(w.exp_cmd_sn(), 6);
    }

    proptest! {
        #[test]
        fn any_arrival_order_delivers_in_cmdsn_order(start in any::<u32>(), perm in Just((0u32..32).collect::<Vec<_>>()).prop_shuffle()) {
            let mut w = CmdWindow::new(start, 64);
            let mut out = Vec::new();
            for off in perm {
                prop_assert_eq!(w.admit(start.wrapping_add(off), off), Admission::Queued);
                while let Some(x) = w.pop_ready() { out.push(x); }
            }
            prop_assert_eq!(out, (0u32..32).collect::<Vec<_>>());
        }
    }
}
