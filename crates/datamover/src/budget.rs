//! Memory a peer can make the target hold, counted before it is committed. A [`Budget`] is
//! one account (a connection, a session, the whole target) with a limit and an optional
//! parent; a [`Reservation`] holds bytes in an account and every account above it, all or
//! none, and gives them back when dropped. A transport reserves a write's buffer before it
//! allocates it, so a flood of commands from a peer costs at most its budget, never the
//! lengths the commands announce.

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// One account: at most `limit` bytes reserved at once in it and in the accounts below it.
#[derive(Debug)]
pub struct Budget {
    name: &'static str,
    limit: u64,
    used: AtomicU64,
    parent: Option<Arc<Budget>>,
    /// Woken when bytes of this account are given back while reservations wait for room.
    freed: Notify,
    /// Reservations waiting for room in this account.
    waiting: AtomicUsize,
}

/// Why a reservation was refused: the account that had no room, and its state then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {account} memory budget has {free} of {limit} bytes free, {wanted} wanted")]
pub struct OverBudget {
    pub account: &'static str,
    pub limit: u64,
    pub free: u64,
    pub wanted: u64,
}

/// Bytes held in an account and every account above it; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Option<Arc<Budget>>,
    bytes: u64,
}

impl Budget {
    /// A top-level account of `limit` bytes, named for log lines (`"target"`).
    pub fn root(name: &'static str, limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            name,
            limit,
            used: AtomicU64::new(0),
            parent: None,
            freed: Notify::new(),
            waiting: AtomicUsize::new(0),
        })
    }

    /// An account of `limit` bytes whose reservations also count in this one.
    pub fn child(self: &Arc<Self>, name: &'static str, limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            name,
            limit,
            used: AtomicU64::new(0),
            parent: Some(self.clone()),
            freed: Notify::new(),
            waiting: AtomicUsize::new(0),
        })
    }

    /// An account with no limit and no parent (tests, tools that budget nothing).
    pub fn unlimited() -> Arc<Budget> {
        Budget::root("unlimited", u64::MAX)
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes reserved now in this account (its own and those of the accounts below it).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Takes `bytes` in this account and every one above it if each has room; otherwise
    /// nothing is taken and the error names the first account without room.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, OverBudget> {
        self.take_all(bytes).map_err(|(_, e)| e)?;
        Ok(self.held(bytes))
    }

    /// As [`Budget::try_reserve`], waiting up to `wait` for room to be given back.
    pub async fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        wait: Duration,
    ) -> Result<Reservation, OverBudget> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let full = match self.take_all(bytes) {
                Ok(()) => return Ok(self.held(bytes)),
                // More than the account can ever hold: waiting cannot help.
                Err((_, e)) if e.wanted > e.limit => return Err(e),
                Err((full, _)) => full,
            };
            let freed = full.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            full.waiting.fetch_add(1, Ordering::SeqCst);
            // Room may have come back before this waiter was counted.
            let retried = self.take_all(bytes);
            let woken = match retried {
                Ok(()) => None,
                Err(_) if tokio::time::Instant::now() >= deadline => None,
                Err(_) => Some(tokio::time::timeout_at(deadline, freed).await.is_ok()),
            };
            full.waiting.fetch_sub(1, Ordering::SeqCst);
            match (retried, woken) {
                (Ok(()), _) => return Ok(self.held(bytes)),
                (Err(_), Some(true)) => continue,
                (Err(_), _) => return self.try_reserve(bytes),
            }
        }
    }

    /// A reservation of `bytes` already taken at every level.
    fn held(self: &Arc<Self>, bytes: u64) -> Reservation {
        Reservation {
            budget: (bytes > 0).then(|| self.clone()),
            bytes,
        }
    }

    /// Takes `bytes` at every level from this one up, or at none: the level without room
    /// and why.
    fn take_all(&self, bytes: u64) -> Result<(), (&Budget, OverBudget)> {
        if bytes == 0 {
            return Ok(());
        }
        let mut level = Some(self);
        while let Some(b) = level {
            if let Err(e) = b.take(bytes) {
                // Give back what the levels below it took.
                let mut undo = Some(self);
                while let Some(u) = undo.filter(|u| !std::ptr::eq(*u, b)) {
                    u.give_back(bytes);
                    undo = u.parent.as_deref();
                }
                return Err((b, e));
            }
            level = b.parent.as_deref();
        }
        Ok(())
    }

    fn take(&self, bytes: u64) -> Result<(), OverBudget> {
        self.used
            // Sequentially consistent with `give_back`'s look at `waiting`: a waiter counted
            // after a release looked sees that release's room when it tries again.
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .map(|_| ())
            .map_err(|used| OverBudget {
                account: self.name,
                limit: self.limit,
                free: self.limit.saturating_sub(used),
                wanted: bytes,
            })
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        // Waking is a lock in `Notify`: only when a reservation waits here.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }

    /// Gives `bytes` back at every level from this one up.
    fn give_back_all(&self, bytes: u64) {
        let mut level = Some(self);
        while let Some(b) = level {
            b.give_back(bytes);
            level = b.parent.as_deref();
        }
    }
}

impl Reservation {
    /// A reservation of nothing.
    pub fn none() -> Reservation {
        Reservation {
            budget: None,
            bytes: 0,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back what this reservation holds beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            return;
        }
        if let Some(b) = &self.budget {
            b.give_back_all(self.bytes - bytes);
        }
        self.bytes = bytes;
    }

    /// `data` as `Bytes` (no copy) that hold this reservation until the last of them is
    /// dropped: the memory stays counted for as long as anyone keeps it.
    pub fn travel_with<T: AsRef<[u8]> + Send + 'static>(self, data: T) -> Bytes {
        if self.bytes == 0 {
            return Bytes::from_owner(data);
        }
        Bytes::from_owner(Held {
            data,
            _reservation: self,
        })
    }

    /// Adds `other`'s bytes to this reservation (both must be of the same account, or one
    /// of them empty).
    pub fn merge(&mut self, mut other: Reservation) {
        if other.bytes == 0 {
            return;
        }
        if self.bytes == 0 {
            std::mem::swap(self, &mut other);
            return;
        }
        let same = match (&self.budget, &other.budget) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        assert!(same, "reservations of different accounts merged");
        self.bytes += other.bytes;
        other.bytes = 0;
    }
}

/// Data and the reservation that counts it.
struct Held<T> {
    data: T,
    _reservation: Reservation,
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Held<T> {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give_back_all(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_counts_at_every_level_and_is_given_back_when_dropped() {
        let target = Budget::root("target", 100);
        let session = target.child("session", 60);
        let conn = session.child("connection", 50);
        let r = conn.try_reserve(40).unwrap();
        assert_eq!((conn.used(), session.used(), target.used()), (40, 40, 40));
        drop(r);
        assert_eq!((conn.used(), session.used(), target.used()), (0, 0, 0));
    }

    #[test]
    fn a_refusal_names_the_full_account_and_takes_nothing() {
        let target = Budget::root("target", 100);
        let session = target.child("session", 60);
        let a = session.child("connection", 50);
        let b = session.child("connection", 50);
        let _held = a.try_reserve(50).unwrap();
        let e = b.try_reserve(20).unwrap_err();
        assert_eq!(e.account, "session");
        assert_eq!((e.free, e.wanted), (10, 20));
        assert_eq!((b.used(), session.used(), target.used()), (0, 50, 50));
        let _fits = b.try_reserve(10).unwrap();
        assert_eq!(target.used(), 60);
    }

    #[test]
    fn merged_reservations_give_back_their_sum() {
        let target = Budget::root("target", 100);
        let mut r = Reservation::none();
        r.merge(target.try_reserve(30).unwrap());
        r.merge(target.try_reserve(20).unwrap());
        assert_eq!((r.bytes(), target.used()), (50, 50));
        drop(r);
        assert_eq!(target.used(), 0);
    }

    #[test]
    fn a_shrunk_reservation_gives_back_the_excess_and_data_holds_the_rest() {
        let target = Budget::root("target", 100);
        let conn = target.child("connection", 100);
        let mut r = conn.try_reserve(64).unwrap();
        r.shrink_to(10);
        assert_eq!((conn.used(), target.used()), (10, 10));
        let data = r.travel_with(vec![7u8; 10]);
        let copy = data.clone();
        drop(data);
        assert_eq!(target.used(), 10, "a copy still holds it");
        assert_eq!(&copy[..], &[7u8; 10]);
        drop(copy);
        assert_eq!((conn.used(), target.used()), (0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_taking_turns_are_never_left_asleep() {
        // Four tasks each want 60 of 100 bytes, 200 times: every turn must be had by a
        // wake-up long before the 5 s wait, or a release was missed.
        let target = Budget::root("target", 100);
        let conn = target.child("connection", 100);
        let start = std::time::Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    for _ in 0..200 {
                        let r = conn.reserve(60, Duration::from_secs(5)).await.unwrap();
                        tokio::task::yield_now().await;
                        drop(r);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a wake-up was missed"
        );
        assert_eq!(target.used(), 0);
    }

    #[tokio::test]
    async fn a_waiting_reservation_gets_room_given_back_and_one_past_its_wait_is_refused() {
        let target = Budget::root("target", 100);
        let held = target.try_reserve(80).unwrap();
        let waiter = {
            let target = target.clone();
            tokio::spawn(async move { target.reserve(50, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "reserved without room");
        drop(held);
        let r = waiter.await.unwrap().expect("room was given back");
        assert_eq!(r.bytes(), 50);
        let start = std::time::Instant::now();
        let e = target
            .reserve(60, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(e.account, "target");
        assert!(start.elapsed() >= Duration::from_millis(50));
        // More than the account holds is refused at once.
        let start = std::time::Instant::now();
        target
            .reserve(101, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
