//! SYNCHRONIZE CACHE batched across commands: concurrent flushes of one backend share
//! fdatasyncs. One sync runs at a time; a flush that arrives while one is running waits for
//! the next, which starts after it arrived and so covers every write completed before it,
//! and all the flushes waiting meanwhile are answered by that one sync. A flush is only
//! acknowledged by a sync that started after it arrived (a running sync may have passed the
//! pages of its writes already), and a failed sync fails every flush it answers.

use std::future::Future;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// One backend's flushes (see the module comment).
#[derive(Default)]
pub(crate) struct FlushBatch {
    /// Held while a sync runs; waiters queue on it in arrival order.
    turn: tokio::sync::Mutex<()>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Syncs started so far; the next one is number `started + 1`.
    started: u64,
    /// Number of the last sync that finished (they run one at a time, in order).
    done: u64,
    /// Number of the last sync that failed (0: none), and its error.
    failed: u64,
    error: Option<(io::ErrorKind, Option<i32>, String)>,
}

impl FlushBatch {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every write completed before this call durable: `sync` (an fdatasync) is run,
    /// or another flush's run that started after this call is shared.
    pub(crate) async fn flush<F, Fut>(&self, sync: F) -> io::Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = io::Result<()>>,
    {
        // Any sync numbered `want` or later starts after this point.
        let want = self.counts().started + 1;
        let _turn = self.turn.lock().await;
        let seq = {
            let mut c = self.counts();
            if c.done >= want {
                return match &c.error {
                    Some((kind, os, msg)) if c.failed >= want => Err(copy(*kind, *os, msg)),
                    _ => Ok(()),
                };
            }
            c.started += 1;
            c.started
        };
        // A flush dropped here (its command aborted) leaves `done` behind: the next
        // waiter finds its sync not done and runs one of its own.
        let result = sync().await;
        let mut c = self.counts();
        c.done = seq;
        if let Err(e) = &result {
            c.failed = seq;
            c.error = Some((e.kind(), e.raw_os_error(), e.to_string()));
        }
        result
    }

    /// Syncs run so far.
    #[cfg(test)]
    pub(crate) fn syncs(&self) -> u64 {
        self.counts().started
    }
}

/// The error a shared sync failed with, for each flush it answered.
fn copy(kind: io::ErrorKind, os: Option<i32>, msg: &str) -> io::Error {
    match os {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(kind, msg.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// Gates for the syncs, in order: each sync waits for its gate and returns what it
    /// carries.
    type Gates = Arc<Mutex<Vec<oneshot::Receiver<io::Result<()>>>>>;

    fn gated(n: usize) -> (Gates, Vec<oneshot::Sender<io::Result<()>>>) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| oneshot::channel()).unzip();
        let mut rxs = rxs;
        rxs.reverse();
        (Arc::new(Mutex::new(rxs)), txs)
    }

    async fn flush_gated(batch: &FlushBatch, gates: &Gates) -> io::Result<()> {
        batch
            .flush(|| async {
                let gate = gates.lock().unwrap().pop().expect("a gate per sync");
                gate.await.unwrap_or(Ok(()))
            })
            .await
    }

    /// Polls `f` for a while (bounded): true if it finished.
    async fn finishes<F: Future>(f: &mut std::pin::Pin<Box<F>>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f.as_mut())
            .await
            .is_ok()
    }

    /// Flushes arriving while a sync runs are not answered by it, but all by the next one:
    /// two syncs for five flushes; and a failed sync fails every flush it answers.
    #[tokio::test]
    async fn flushes_arriving_during_a_sync_share_the_next_one() {
        for fail_second in [false, true] {
            let batch = Arc::new(FlushBatch::default());
            let (gates, mut txs) = gated(2);
            let mut first = Box::pin(flush_gated(&batch, &gates));
            assert!(!finishes(&mut first).await, "sync 1 is running");
            let mut later: Vec<_> = (0..4)
                .map(|_| Box::pin(flush_gated(&batch, &gates)))
                .collect();
            for f in later.iter_mut() {
                assert!(!finishes(f).await);
            }
            txs.remove(0).send(Ok(())).unwrap();
            assert!(first.await.is_ok());
            for f in later.iter_mut() {
                assert!(!finishes(f).await, "sync 1 started before this flush");
            }
            let second = if fail_second {
                Err(io::Error::from_raw_os_error(5))
            } else {
                Ok(())
            };
            txs.remove(0).send(second).unwrap();
            for f in later {
                let r = f.await;
                match fail_second {
                    false => assert!(r.is_ok()),
                    true => assert_eq!(r.unwrap_err().raw_os_error(), Some(5)),
                }
            }
            assert_eq!(batch.syncs(), 2);
            // A flush after that runs a sync of its own.
            let (gates, txs) = gated(1);
            txs.into_iter().for_each(|t| t.send(Ok(())).unwrap());
            assert!(flush_gated(&batch, &gates).await.is_ok());
            assert_eq!(batch.syncs(), 3);
        }
    }

    /// A flush whose future is dropped during its sync: the next flush runs its own.
    #[tokio::test]
    async fn a_dropped_flush_leaves_the_next_one_its_own_sync() {
        let batch = FlushBatch::default();
        let (gates, txs) = gated(2);
        let mut first = Box::pin(flush_gated(&batch, &gates));
        assert!(!finishes(&mut first).await);
        let mut second = Box::pin(flush_gated(&batch, &gates));
        assert!(!finishes(&mut second).await);
        drop(first);
        for t in txs {
            let _ = t.send(Ok(()));
        }
        assert!(second.await.is_ok());
        assert_eq!(batch.syncs(), 2);
    }
}
