//! Per-LUN task set (SAM task attributes, abort) and a byte-range lock that makes
//! COMPARE AND WRITE and other read-modify-write commands atomic against writers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::device::{NexusId, TaskAttr};

/// What the task set remembers about a task.
pub(crate) struct TaskInfo {
    pub nexus: NexusId,
    pub tag: u64,
    attr: TaskAttr,
    abort: Arc<AtomicBool>,
}

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
    pub abort: Arc<AtomicBool>,
}

impl TaskGuard<'_> {
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
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
        let abort = Arc::new(AtomicBool::new(false));
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
        let marked: Vec<u64> = {
            let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner
                .tasks
                .iter()
                .filter(|(_, t)| pred(t))
                .map(|(seq, t)| {
                    t.abort.store(true, Ordering::Release);
                    *seq
                })
                .collect()
        };
        self.changed.notify_waiters();
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

    /// Number of tasks in the set (for tests and diagnostics).
    #[allow(dead_code)]
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .len()
    }
}

#[derive(Default)]
struct RangeInner {
    next_id: u64,
    held: BTreeMap<u64, (u64, u64, bool)>,
}

/// Byte-range lock over block numbers: shared holders (reads) coexist, an exclusive holder
/// (every write) excludes every overlapping holder. A read sent from where its data lies
/// holds its range until the data has left, so no write changes bytes in flight (an MPA CRC
/// taken from a RAM LUN image's block CRCs stays true).
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

impl Drop for RangeGuard {
    fn drop(&mut self) {
        self.lock
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held
            .remove(&self.id);
        self.lock.changed.notify_waiters();
    }
}

impl RangeLock {
    /// Locks blocks `start..start+len`.
    pub async fn lock(self: &Arc<Self>, start: u64, len: u64, exclusive: bool) -> RangeGuard {
        let end = start.saturating_add(len.max(1));
        loop {
            let notified = self.changed.notified();
            {
                let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                let conflict = inner
                    .held
                    .values()
                    .any(|&(s, e, x)| s < end && start < e && (x || exclusive));
                if !conflict {
                    let id = inner.next_id;
                    inner.next_id += 1;
                    inner.held.insert(id, (start, end, exclusive));
                    return RangeGuard {
                        lock: self.clone(),
                        id,
                    };
                }
            }
            notified.await;
        }
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
        let lock = Arc::new(RangeLock::default());
        let x = lock.lock(10, 5, true).await;
        let _other = lock.lock(20, 5, false).await; // no overlap: immediate
        let lock2 = lock.clone();
        let w = tokio::spawn(async move {
            let _g = lock2.lock(12, 1, false).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!w.is_finished());
        drop(x);
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap();
    }
}
