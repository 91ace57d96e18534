//! A cap on connections still being set up (sorted by their first bytes, or logging in). One
//! more past the cap drops the one that has waited longest, so idle and stalled clients hold a
//! bounded number of descriptors and tasks and never keep out a client that logs in promptly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The connections being set up at one place (a portal's sorting, the target's logins).
pub struct Admission {
    cap: usize,
    inner: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    next: u64,
    /// By arrival: the first entry has waited longest.
    by_arrival: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One connection being set up; it leaves the count when dropped.
pub struct Admitted {
    id: u64,
    admission: Arc<Admission>,
    evicted: oneshot::Receiver<()>,
}

impl Admission {
    /// At most `cap` connections (at least one) are set up at once.
    pub fn new(cap: usize) -> Arc<Admission> {
        Arc::new(Admission {
            cap: cap.max(1),
            inner: Mutex::new(Waiting::default()),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Counts a new connection in; past the cap, the longest-waiting one is told to go (its
    /// [`Admitted::evicted`] resolves).
    pub fn admit(self: &Arc<Self>) -> Admitted {
        let (tx, evicted) = oneshot::channel();
        let mut w = self.inner.lock().expect("admission");
        if w.by_arrival.len() >= self.cap {
            if let Some((_, oldest)) = w.by_arrival.pop_first() {
                let _ = oldest.send(());
            }
        }
        let id = w.next;
        w.next += 1;
        w.by_arrival.insert(id, tx);
        Admitted {
            id,
            admission: self.clone(),
            evicted,
        }
    }

    /// Connections being set up now.
    pub fn waiting(&self) -> usize {
        self.inner.lock().expect("admission").by_arrival.len()
    }
}

impl Admitted {
    /// Resolves when this connection is dropped to make room for a newer one.
    pub async fn evicted(&mut self) {
        // Either way the entry is gone: sent to, or dropped with the admission.
        let _ = (&mut self.evicted).await;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission
            .inner
            .lock()
            .expect("admission")
            .by_arrival
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn past_the_cap_the_longest_waiting_goes_and_finished_ones_free_their_place() {
        let a = Admission::new(2);
        let mut first = a.admit();
        let second = a.admit();
        drop(second); // finished: its place is free again
        let mut third = a.admit();
        assert_eq!(a.waiting(), 2);
        let no = tokio::time::timeout(Duration::from_millis(20), first.evicted()).await;
        assert!(no.is_err(), "nobody is evicted while within the cap");
        let _fourth = a.admit();
        tokio::time::timeout(Duration::from_secs(1), first.evicted())
            .await
            .expect("the longest waiting is told to go");
        let no = tokio::time::timeout(Duration::from_millis(20), third.evicted()).await;
        assert!(no.is_err(), "the newer one stays");
        assert_eq!(a.waiting(), 2);
    }
}
