//! One log line per backend fault, not one per failed command: a truncated file or a
//! vanished device fails every command that touches it, and at queue depth 32 a line per
//! command would bury the one that says what happened. The first failure of an episode is
//! logged with its cause; later ones are counted and summarised at most every
//! [`SUMMARY_EVERY`]; the first success afterwards closes the episode with one line.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a still-failing backend goes without a log line.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Episode {
    started: Instant,
    last_line: Instant,
    /// Failures since the last line.
    unlogged: u64,
    total: u64,
}

/// A LUN's backend faults, as log lines.
#[derive(Debug, Default)]
pub(crate) struct FaultLog {
    /// True during an episode: lets a success skip the lock.
    failing: AtomicBool,
    episode: Mutex<Option<Episode>>,
}

/// What [`FaultLog::failed`] did, for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Logged {
    /// The first failure of an episode: logged with its cause.
    First,
    /// Counted without a line.
    Counted,
    /// A summary line of the failures since the last one.
    Summary,
}

impl FaultLog {
    /// Records a failed backend operation (`what`, e.g. "read", at byte `offset`).
    pub(crate) fn failed(&self, lun: u64, what: &str, offset: u64, e: &std::io::Error) -> Logged {
        self.failed_at(Instant::now(), lun, what, offset, e)
    }

    fn failed_at(
        &self,
        now: Instant,
        lun: u64,
        what: &str,
        offset: u64,
        e: &std::io::Error,
    ) -> Logged {
        let mut episode = self.episode.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ep) = episode.as_mut() else {
            tracing::warn!(
                lun,
                offset,
                "backend {what} failed: {e}; commands that touch the storage fail until it \
                 serves again (further failures are counted, not logged one by one)"
            );
            *episode = Some(Episode {
                started: now,
                last_line: now,
                unlogged: 0,
                total: 1,
            });
            self.failing.store(true, Ordering::Release);
            return Logged::First;
        };
        ep.unlogged += 1;
        ep.total += 1;
        if now.duration_since(ep.last_line) < SUMMARY_EVERY {
            return Logged::Counted;
        }
        tracing::warn!(
            lun,
            "backend still failing: {} more failed commands in the last {:.0?} (latest: {what} at \
             byte {offset}: {e})",
            ep.unlogged,
            now.duration_since(ep.last_line)
        );
        ep.unlogged = 0;
        ep.last_line = now;
        Logged::Summary
    }

    /// Records a backend operation that succeeded: closes an episode with one line. Costs
    /// one atomic load when nothing failed.
    pub(crate) fn succeeded(&self, lun: u64) -> bool {
        if !self.failing.load(Ordering::Acquire) {
            return false;
        }
        let mut episode = self.episode.lock().unwrap_or_else(|p| p.into_inner());
        self.failing.store(false, Ordering::Release);
        let Some(ep) = episode.take() else {
            return false;
        };
        tracing::info!(
            lun,
            "backend serves again after {} failed commands over {:.1?}",
            ep.total,
            ep.started.elapsed()
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Error;

    #[test]
    fn an_episode_logs_its_first_failure_then_summaries_then_its_end() {
        let log = FaultLog::default();
        let t0 = Instant::now();
        let e = Error::other("EIO");
        assert!(!log.succeeded(0), "nothing failed yet");
        assert_eq!(log.failed_at(t0, 0, "read", 0, &e), Logged::First);
        for i in 1..100u64 {
            let at = t0 + Duration::from_millis(i);
            assert_eq!(log.failed_at(at, 0, "read", i, &e), Logged::Counted);
        }
        let later = t0 + SUMMARY_EVERY + Duration::from_millis(1);
        assert_eq!(log.failed_at(later, 0, "write", 7, &e), Logged::Summary);
        assert_eq!(
            log.failed_at(later + Duration::from_millis(1), 0, "write", 8, &e),
            Logged::Counted
        );
        assert!(log.succeeded(0), "the first success ends the episode");
        assert!(!log.succeeded(0), "and only the first");
        assert_eq!(log.failed_at(later, 0, "read", 0, &e), Logged::First);
    }
}
