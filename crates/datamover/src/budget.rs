//! Memory a peer can make the target hold, counted before it is committed. A [`Budget`] is
//! one account (a connection, a session, the whole target) with a limit and an optional
//! parent; a [`Reservation`] holds bytes in an account and every account above it, all or
//! none, and gives them back when dropped. A transport reserves a write's buffer before it
//! allocates it, so a flood of commands from a peer costs at most its budget, never the
//! lengths the commands announce.

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Woken whenever bytes of this account are given back.
    freed: Notify,
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
        self.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` in this account and every one above it if each has room; otherwise
    /// nothing is taken and the error names the first account without room.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, OverBudget> {
        if bytes == 0 {
            return Ok(Reservation::none());
        }
        let mut taken: Vec<&Budget> = Vec::new();
        let mut level = Some(self.as_ref());
        while let Some(b) = level {
            if let Err(e) = b.take(bytes) {
                for t in taken {
                    t.give_back(bytes);
                }
                return Err(e);
            }
            taken.push(b);
            level = b.parent.as_deref();
        }
        Ok(Reservation {
            budget: Some(self.clone()),
            bytes,
        })
    }

    /// As [`Budget::try_reserve`], waiting up to `wait` for room to be given back.
    pub async fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        wait: Duration,
    ) -> Result<Reservation, OverBudget> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let refused = match self.try_reserve(bytes) {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            // More than the account can ever hold: waiting cannot help.
            if refused.wanted > refused.limit {
                return Err(refused);
            }
            let full = self.level_named(refused.account);
            let freed = full.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            // Room may have come back between the refusal and `enable`.
            match self.try_reserve(bytes) {
                Ok(r) => return Ok(r),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return self.try_reserve(bytes);
            }
        }
    }

    fn level_named(&self, name: &'static str) -> &Budget {
        let mut level = self;
        while level.name != name {
            match level.parent.as_deref() {
                Some(p) => level = p,
                None => return self,
            }
        }
        level
    }

    fn take(&self, bytes: u64) -> Result<(), OverBudget> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
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
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.freed.notify_waiters();
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
        let excess = self.bytes - bytes;
        let mut level = self.budget.as_deref();
        while let Some(b) = level {
            b.give_back(excess);
            level = b.parent.as_deref();
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
        let mut level = self.budget.as_deref();
        while let Some(b) = level {
            b.give_back(self.bytes);
            level = b.parent.as_deref();
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
