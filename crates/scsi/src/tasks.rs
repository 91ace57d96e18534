//! Per-LUN task set (SAM task attributes, abort) and a byte-range lock that makes
//! COMPARE AND WRITE and other read-modify-write commands atomic against writers.
//!
//! Every wait here (an ORDERED task for older tasks, any task for a range) ends as soon
//! as task management aborts the waiting task, so a peer that never lets a range go
//! stalls its own tasks only until an abort, a LUN reset or its nexus loss.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::command::{NexusId, TaskAttr};

/// What the task set remembers about a task.
pub(crate) struct TaskInfo {
    pub nexus: NexusId,
    pub tag: u64,
    attr: TaskAttr,
    abort: Arc<AbortSignal>,
}

/// A task's abort: raised once by task management, seen by the task's every wait.
#[derive(Default)]
pub(crate) struct AbortSignal {
    raised: AtomicBool,
    wake: Notify,
}

impl AbortSignal {
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.wake.notify_waiters();
    }

    /// Resolves once the signal is raised.
    async fn wait(&self) {
        loop {
            // Registered before the check, so a raise in between still wakes it.
            let woken = self.wake.notified();
            if self.is_raised() {
                return;
            }
            woken.await;
        }
    }
}

/// The task was aborted while it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Aborted;

#[derive(Default)]
struct TaskSetInner {
    next_seq: u64,
    tasks: BTreeMap<u64, TaskInfo>,
}

/// The tasks currently in the task set of one LUN, in arrival order.
#[derive(Default)]
pub(crate) struct TaskSet {
    inner: Mutex<TaskSetInner>,
    /// Number of ORDERED tasks in the set: when zero, SIMPLE tasks start without waiting.
    ordered: AtomicUsize,
    changed: Notify,
}

/// Membership of one task in the task set; leaving (drop) wakes waiters.
pub(crate) struct TaskGuard<'a> {
    set: &'a TaskSet,
    seq: u64,
    ordered: bool,
    nexus: NexusId,
    tag: u64,
    abort: Arc<AbortSignal>,
}

impl TaskGuard<'_> {
    pub fn aborted(&self) -> bool {
        self.abort.is_raised()
    }
}

impl Drop for TaskGuard<'_> {
    fn drop(&mut self) {
        self.set
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .remove(&self.seq);
        if self.ordered {
            self.set.ordered.fetch_sub(1, Ordering::AcqRel);
        }
        self.set.changed.notify_waiters();
    }
}

impl TaskSet {
    /// Enters a task and waits until its attribute lets it run: HEAD OF QUEUE at once,
    /// SIMPLE after every older ORDERED task, ORDERED after every older task.
    pub async fn enter(&self, nexus: NexusId, tag: u64, attr: TaskAttr) -> TaskGuard<'_> {
        let abort = Arc::new(AbortSignal::default());
        let ordered = attr == TaskAttr::Ordered;
        if ordered {
            self.ordered.fetch_add(1, Ordering::AcqRel);
        }
        let seq = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let seq = inner.next_seq;
            inner.next_seq += 1;
            inner.tasks.insert(
                seq,
                TaskInfo {
                    nexus,
                    tag,
                    attr,
                    abort: abort.clone(),
                },
            );
            seq
        };
        let guard = TaskGuard {
            set: self,
            seq,
            ordered,
            nexus,
            tag,
            abort,
        };
        if attr == TaskAttr::HeadOfQueue || (!ordered && self.ordered.load(Ordering::Acquire) == 0)
        {
            return guard;
        }
        loop {
            let notified = self.changed.notified();
            if self.may_run(seq, ordered) || guard.aborted() {
                return guard;
            }
            notified.await;
        }
    }

    fn may_run(&self, seq: u64, ordered: bool) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.tasks.range(..seq).all(|(_, t)| {
            // HEAD OF QUEUE tasks that arrived earlier do not block a later SIMPLE task.
            if ordered {
                false
            } else {
                t.attr != TaskAttr::Ordered
            }
        })
    }

    /// Marks every task matching `pred` aborted and waits (bounded) until they left.
    /// Returns how many were marked.
    pub async fn abort_where(&self, pred: impl Fn(&TaskInfo) -> bool) -> usize {
        let marked = self.mark_aborted(pred);
        // Tasks notice the flag at their next step; backend calls in flight finish first.
        for _ in 0..600 {
            let notified = self.changed.notified();
            let pending = {
                let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                marked.iter().any(|s| inner.tasks.contains_key(s))
            };
            if !pending {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
        marked.len()
    }

    /// Marks every task matching `pred` aborted and wakes whatever they wait for,
    /// without waiting for them to leave; returns their sequence numbers.
    pub fn mark_aborted(&self, pred: impl Fn(&TaskInfo) -> bool) -> Vec<u64> {
        let marked: Vec<u64> = {
            let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner
                .tasks
                .iter()
                .filter(|(_, t)| pred(t))
                .map(|(seq, t)| {
                    t.abort.raise();
                    *seq
                })
                .collect()
        };
        self.changed.notify_waiters();
        marked
    }

    /// Waits until the set is empty, at most `limit`; whether it is.
    pub async fn wait_empty(&self, limit: Duration) -> bool {
        let tick = Duration::from_millis(100);
        for _ in 0..=limit.as_millis() / tick.as_millis() {
            let notified = self.changed.notified();
            if self.len() == 0 {
                return true;
            }
            let _ = tokio::time::timeout(tick, notified).await;
        }
        self.len() == 0
    }

    /// Number of tasks in the set.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .len()
    }
}

/// One held range of blocks.
struct Held {
    start: u64,
    end: u64,
    exclusive: bool,
    nexus: NexusId,
    tag: u64,
    /// The task has ended and its data is being sent from where it lies.
    sending: bool,
}

#[derive(Default)]
struct RangeInner {
    next_id: u64,
    held: BTreeMap<u64, Held>,
}

/// Byte-range lock over block numbers: shared holders (reads) coexist, an exclusive holder
/// (every write) excludes every overlapping holder. A read sent from where its data lies
/// holds its range until the data has left, so no write changes bytes in flight (an MPA CRC
/// taken from a RAM LUN image's block CRCs stays true) — unless task management revokes
/// it (see [`RangeLock::revoke_sending`]).
#[derive(Default)]
pub(crate) struct RangeLock {
    inner: Mutex<RangeInner>,
    changed: Notify,
}

/// A held range; owned, so a read whose data leaves from the medium where it lies can keep
/// it until the data is sent.
pub(crate) struct RangeGuard {
    lock: Arc<RangeLock>,
    id: u64,
}

impl RangeGuard {
    /// Marks the range as held only for data being sent after its task ended, which
    /// task management may revoke.
    pub fn sending(&self) {
        if let Some(h) = self.lock.inner().held.get_mut(&self.id) {
            h.sending = true;
        }
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        // A revoked range is gone already; its id is never reused.
        self.lock.inner().held.remove(&self.id);
        self.lock.changed.notify_waiters();
    }
}

impl RangeLock {
    fn inner(&self) -> std::sync::MutexGuard<'_, RangeInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks blocks `start..start+len` for `task`, waiting while an overlapping holder
    /// conflicts; gives up with [`Aborted`] as soon as the task is aborted.
    pub async fn lock(
        self: &Arc<Self>,
        start: u64,
        len: u64,
        exclusive: bool,
        task: &TaskGuard<'_>,
    ) -> Result<RangeGuard, Aborted> {
        let end = start.saturating_add(len.max(1));
        loop {
            let notified = self.changed.notified();
            if task.aborted() {
                return Err(Aborted);
            }
            if let Some(guard) = self.try_lock(start, end, exclusive, task) {
                return Ok(guard);
            }
            tokio::select! {
                _ = notified => {}
                _ = task.abort.wait() => {}
            }
        }
    }

    fn try_lock(
        self: &Arc<Self>,
        start: u64,
        end: u64,
        exclusive: bool,
        task: &TaskGuard<'_>,
    ) -> Option<RangeGuard> {
        let mut inner = self.inner();
        let conflict = inner
            .held
            .values()
            .any(|h| h.start < end && start < h.end && (h.exclusive || exclusive));
        if conflict {
            return None;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let held = Held {
            start,
            end,
            exclusive,
            nexus: task.nexus,
            tag: task.tag,
            sending: false,
        };
        inner.held.insert(id, held);
        Some(RangeGuard {
            lock: self.clone(),
            id,
        })
    }

    /// Releases the ranges held for data still being sent by ended tasks that match
    /// `pred(nexus, tag)`, and wakes the waiters. Task management calls it for the tasks
    /// it aborts: the initiator takes such a task as aborted and discards its data, so
    /// a write may change those bytes while they are still being sent (the peer gets
    /// them at worst torn, for a task it no longer expects). Without this, a peer that
    /// never drains its data would keep every writer of the range waiting for good.
    /// Returns how many ranges were released.
    pub fn revoke_sending(&self, pred: impl Fn(NexusId, u64) -> bool) -> usize {
        let revoked = {
            let mut inner = self.inner();
            let before = inner.held.len();
            inner
                .held
                .retain(|_, h| !(h.sending && pred(h.nexus, h.tag)));
            before - inner.held.len()
        };
        if revoked > 0 {
            self.changed.notify_waiters();
        }
        revoked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ordered_waits_for_older_simple() {
        let set = Arc::new(TaskSet::default());
        let a = set.enter(NexusId(1), 1, TaskAttr::Simple).await;
        let set2 = set.clone();
        let waiter = tokio::spawn(async move {
            let _g = set2.enter(NexusId(1), 2, TaskAttr::Ordered).await;
            7
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "ORDERED must wait for the older SIMPLE task"
        );
        // A head-of-queue task still runs immediately.
        let h = set.enter(NexusId(1), 3, TaskAttr::HeadOfQueue).await;
        drop(h);
        drop(a);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .unwrap()
                .unwrap(),
            7
        );
        assert_eq!(set.len(), 0);
    }

    #[tokio::test]
    async fn abort_marks_and_waits() {
        let set = Arc::new(TaskSet::default());
        let g = set.enter(NexusId(1), 42, TaskAttr::Simple).await;
        let set2 = set.clone();
        let aborter = tokio::spawn(async move { set2.abort_where(|t| t.tag == 42).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(g.aborted());
        drop(g);
        assert_eq!(aborter.await.unwrap(), 1);
    }

    #[tokio::test]
    async fn exclusive_range_excludes_overlap_only() {
        let set = Arc::new(TaskSet::default());
        let lock = Arc::new(RangeLock::default());
        let task = set.enter(NexusId(1), 1, TaskAttr::Simple).await;
        let x = lock.lock(10, 5, true, &task).await.unwrap();
        let _other = lock.lock(20, 5, false, &task).await.unwrap(); // no overlap: immediate
        let (set2, lock2) = (set.clone(), lock.clone());
        let w = tokio::spawn(async move {
            let task = set2.enter(NexusId(1), 2, TaskAttr::Simple).await;
            lock2.lock(12, 1, false, &task).await.is_ok()
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!w.is_finished());
        drop(x);
        let locked = tokio::time::timeout(Duration::from_secs(5), w).await;
        assert!(locked.unwrap().unwrap());
    }

    /// Spawns a task of `nexus`/`tag` that waits for blocks 0..8 exclusively and
    /// reports whether it got them.
    fn spawn_writer(
        set: &Arc<TaskSet>,
        lock: &Arc<RangeLock>,
        nexus: u64,
        tag: u64,
    ) -> tokio::task::JoinHandle<Result<(), Aborted>> {
        let (set, lock) = (set.clone(), lock.clone());
        tokio::spawn(async move {
            let task = set.enter(NexusId(nexus), tag, TaskAttr::Simple).await;
            lock.lock(0, 8, true, &task).await.map(drop)
        })
    }

    #[tokio::test]
    async fn an_aborted_waiter_stops_waiting_for_a_range() {
        let set = Arc::new(TaskSet::default());
        let lock = Arc::new(RangeLock::default());
        let reader = set.enter(NexusId(1), 1, TaskAttr::Simple).await;
        let _held = lock.lock(0, 8, false, &reader).await.unwrap();
        let waiter = spawn_writer(&set, &lock, 2, 7);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the writer waits for the held range");
        assert_eq!(set.mark_aborted(|t| t.tag == 7).len(), 1);
        let outcome = tokio::time::timeout(Duration::from_secs(1), waiter).await;
        assert_eq!(outcome.expect("ends within 1 s").unwrap(), Err(Aborted));
    }

    #[tokio::test]
    async fn revoking_releases_only_matching_ranges_of_data_being_sent() {
        let set = Arc::new(TaskSet::default());
        let lock = Arc::new(RangeLock::default());
        let running = set.enter(NexusId(1), 1, TaskAttr::Simple).await;
        let in_use = lock.lock(0, 8, false, &running).await.unwrap();
        let ended = set.enter(NexusId(2), 2, TaskAttr::Simple).await;
        let sent = lock.lock(0, 8, false, &ended).await.unwrap();
        sent.sending();
        drop(ended);
        // Another nexus's range is not revoked; a running task's never is.
        assert_eq!(lock.revoke_sending(|n, _| n == NexusId(1)), 0);
        assert_eq!(lock.revoke_sending(|n, _| n == NexusId(2)), 1);
        assert_eq!(lock.revoke_sending(|_, _| true), 0);
        let waiter = spawn_writer(&set, &lock, 3, 3);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "the running task still holds its range"
        );
        drop(in_use);
        let outcome = tokio::time::timeout(Duration::from_secs(1), waiter).await;
        assert_eq!(outcome.expect("ends within 1 s").unwrap(), Ok(()));
        // Dropping the revoked guard afterwards releases nothing else.
        drop(sent);
        assert!(lock.inner().held.is_empty());
    }
}
