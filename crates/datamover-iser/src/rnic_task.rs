//! The software RNIC's progress engine as a task of a tokio runtime rather than a thread of
//! its own: the thread that posts a verb also runs the engine, and the completions it produces
//! wake tasks on that thread, with no switch to and from a progress thread in between.
//! Initiator connections run their RNIC on the caller's runtime ([`spawn_software_rnic`]:
//! faster 128 KiB reads at QD 32, with less initiator CPU per command). The target runs its RNIC
//! on a [`Reactor`]: a thread of its own with a one-thread runtime where the engine, the
//! connections' completion tasks and their commands all run, so that a command crosses no
//! thread between its Send arriving and its status leaving. (On the target's multi-threaded
//! runtime, as a task among the others, the engine made reads slower; on a thread of its own
//! beside that runtime, each command crossed threads twice.) Measurements behind this and the
//! polling constants below: docs/performance-notes.md.

use rnic::{Driver, Rnic, Turn};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

/// How long an engine task polls on after its last work before it sleeps, by default. Sleeping
/// in epoll and being woken costs more than polling: with it small reads ran twice as fast
/// and large writes a third faster, for about the same CPU per GB. An idle connection stops
/// polling after this long.
pub use datamover::iser_defaults::DEFAULT_POLL;

/// Writes of this many bytes or more are large: the target fetches their data by RDMA Read,
/// the initiator's engine only answers, and with several in flight a wake-up is a small part
/// of such a command's time, so it need not poll ([`PollWindow::follow_write`]): polling cost
/// them more initiator CPU for no speed. Reads keep polling: without it they lost speed for no
/// CPU saved.
pub const LARGE_WRITE: usize = 64 << 10;

/// With no more large writes than this in flight the engine polls for them all the same:
/// then each command waits for its own wake-ups (the target's RDMA Read, its status), which
/// cost more than polling does. With deeper queues a wake-up is a small part of each
/// command's time, and polling gained little speed for more CPU, so they do not poll.
pub const FEW_LARGE_WRITES: usize = 2;

/// How long a driven engine polls after its last work, changeable while it runs: an
/// initiator's connection sets it by the size of what its commands move and by how many
/// large writes it has in flight.
#[derive(Clone, Debug)]
pub struct PollWindow {
    configured: Duration,
    /// The latest command was a large write.
    large_latest: Arc<AtomicBool>,
    /// Large writes sent and not yet ended (each counted by a [`LargeWrite`]).
    large_in_flight: Arc<AtomicUsize>,
}

/// A large write in flight, counted by its [`PollWindow`] until dropped (when the command's
/// status arrives, it is forgotten or its connection ends).
#[derive(Debug)]
pub struct LargeWrite(Arc<AtomicUsize>);

impl Drop for LargeWrite {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PollWindow {
    pub fn new(poll: Duration) -> PollWindow {
        PollWindow {
            configured: poll,
            large_latest: Arc::new(AtomicBool::new(false)),
            large_in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A command writing `bytes` is sent: the latest command decides between the configured
    /// window (reads, small writes, or a large write among at most [`FEW_LARGE_WRITES`] in
    /// flight) and none. A large write is counted until the returned guard is dropped.
    #[must_use = "a large write counts only while its guard is held"]
    pub fn follow_write(&self, bytes: usize) -> Option<LargeWrite> {
        let large = bytes >= LARGE_WRITE;
        self.large_latest.store(large, Ordering::Relaxed);
        large.then(|| {
            self.large_in_flight.fetch_add(1, Ordering::Relaxed);
            LargeWrite(self.large_in_flight.clone())
        })
    }

    fn get(&self) -> Duration {
        if self.large_latest.load(Ordering::Relaxed)
            && self.large_in_flight.load(Ordering::Relaxed) > FEW_LARGE_WRITES
        {
            Duration::ZERO
        } else {
            self.configured
        }
    }
}

/// A software RNIC whose engine runs as a task on the current tokio runtime; it ends when
/// the RNIC is dropped. Everything using the RNIC must run while that runtime does. After a
/// turn that found work the task goes on turning for `poll` (yielding to the runtime's
/// other tasks in between) before it sleeps: zero sleeps at once.
pub fn spawn_software_rnic(poll: Duration) -> std::io::Result<Rnic> {
    spawn_software_rnic_polling(PollWindow::new(poll))
}

/// [`spawn_software_rnic`] with a window its owner may change as it runs.
pub fn spawn_software_rnic_polling(poll: PollWindow) -> std::io::Result<Rnic> {
    let kicked = Arc::new(Notify::new());
    let kick = kicked.clone();
    let (rnic, driver) =
        Rnic::new_driven(move || kick.notify_one()).map_err(std::io::Error::other)?;
    // SAFETY: the descriptor is the driver's epoll, which `Driven` drops after this
    // registration and never closes or replaces meanwhile. Exercised by every iSER test on the
    // software RNIC (and `the_task_ends_with_the_rnic`).
    let poller =
        unsafe { AsyncFd::register_with_interest(EngineFd(driver.fd()), Interest::READABLE)? };
    tokio::spawn(drive(Driven { poller, driver }, kicked, poll));
    Ok(rnic)
}

/// A thread running a one-thread tokio runtime (time and I/O enabled) that drives a software
/// RNIC's engine, for whatever should run beside it ([`Reactor::handle`]): tasks spawned there
/// stay on that thread. Dropping the last reference stops the runtime, ending (dropping) the
/// tasks still on it; the thread then exits.
pub struct Reactor {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Reactor {
    /// Starts the thread (named `name`) and, on its runtime, a software RNIC that polls for
    /// `poll` after its last work ([`spawn_software_rnic`]).
    pub fn start(name: &str, poll: Duration) -> std::io::Result<(Arc<Reactor>, Rnic)> {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let rnic = spawn_software_rnic(poll);
                    let ok = rnic.is_ok();
                    let _ = started_tx.send(rnic.map(|r| (r, tokio::runtime::Handle::current())));
                    if ok {
                        let _ = stopped.await;
                    }
                });
            })?;
        let (rnic, handle) = started
            .recv()
            .map_err(|_| std::io::Error::other("the RNIC's reactor thread ended at start"))??;
        Ok((
            Arc::new(Reactor {
                handle,
                stop: Some(stop),
            }),
            rnic,
        ))
    }

    /// Where to spawn what should run on the reactor's thread.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The engine's epoll descriptor, owned by the driver (which outlives the `AsyncFd`).
struct EngineFd(RawFd);

impl AsRawFd for EngineFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The engine and its descriptor's registration with the runtime, in the order they must
/// go: the registration before the driver closes the descriptor.
struct Driven {
    poller: AsyncFd<EngineFd>,
    driver: Driver,
}

async fn drive(mut d: Driven, kicked: Arc<Notify>, poll: PollWindow) {
    let mut tick = tokio::time::interval(Driver::TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut busy_at = Instant::now();
    loop {
        match d.driver.turn() {
            Turn::Stopped => break,
            // Other tasks (the ones the turn's completions woke, say) go first.
            Turn::More => {
                busy_at = Instant::now();
                tokio::task::yield_now().await;
                continue;
            }
            Turn::Done => busy_at = Instant::now(),
            Turn::Idle => {}
        }
        // Poll on for a while after the last work: on a busy connection the next bytes are
        // usually that close, and catching them awake saves this thread a sleep and a
        // wake-up, which cost more than the polling (see `DEFAULT_POLL`).
        if busy_at.elapsed() < poll.get() {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            biased;
            _ = kicked.notified() => {}
            ready = d.poller.readable() => match ready {
                // Cleared before the next turn: readiness after it is a new edge.
                Ok(mut guard) => guard.clear_ready(),
                Err(e) => {
                    tracing::warn!("software RNIC: waiting on its poller failed: {e}");
                    break;
                }
            },
            _ = tick.tick() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::{Access, Provider};

    /// Reads and small writes keep the configured window; large writes keep it while at most
    /// [`FEW_LARGE_WRITES`] are in flight and have none beyond; the latest command decides.
    #[test]
    fn the_poll_window_follows_the_writes_in_flight() {
        let w = PollWindow::new(DEFAULT_POLL);
        let engine_side = w.clone();
        assert_eq!(engine_side.get(), DEFAULT_POLL);
        let mut large: Vec<LargeWrite> = (0..FEW_LARGE_WRITES)
            .map(|_| {
                w.follow_write(LARGE_WRITE)
                    .expect("a large write is counted")
            })
            .collect();
        assert_eq!(engine_side.get(), DEFAULT_POLL, "few large writes: polling");
        large.push(w.follow_write(LARGE_WRITE).unwrap());
        assert_eq!(
            engine_side.get(),
            Duration::ZERO,
            "more large writes in flight: no polling"
        );
        assert!(w.follow_write(0).is_none(), "a read is not counted");
        assert_eq!(engine_side.get(), DEFAULT_POLL, "a read: polling again");
        assert!(w.follow_write(LARGE_WRITE - 1).is_none());
        assert_eq!(engine_side.get(), DEFAULT_POLL, "a small write");
        large.push(w.follow_write(LARGE_WRITE).unwrap());
        assert_eq!(engine_side.get(), Duration::ZERO);
        large.truncate(FEW_LARGE_WRITES);
        assert_eq!(
            engine_side.get(),
            DEFAULT_POLL,
            "the ended large writes no longer count"
        );
        let off = PollWindow::new(Duration::ZERO);
        let _one = off.follow_write(LARGE_WRITE);
        assert_eq!(off.get(), Duration::ZERO, "configured off stays off");
    }

    /// A reactor runs its RNIC and the tasks spawned on it on its own thread, and dropping it
    /// ends those tasks: one waiting forever is cancelled within 5 s.
    #[tokio::test]
    async fn a_reactor_runs_tasks_on_its_thread_until_dropped() {
        let (reactor, rnic) = Reactor::start("test-reactor", DEFAULT_POLL).unwrap();
        let pd = rnic.alloc_pd().unwrap();
        let mr = rnic.reg_mr(&pd, 4096, Access::ALL).unwrap();
        drop(mr);
        let name = reactor
            .handle()
            .spawn(async { std::thread::current().name().map(String::from) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("test-reactor"));
        let forever = reactor.handle().spawn(std::future::pending::<()>());
        drop(reactor);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), forever)
            .await
            .expect("the reactor's task ended within 5 s");
        assert!(ended.unwrap_err().is_cancelled());
    }

    /// CPU ticks (user + system, 1/100 s) of this process's thread named `name`.
    fn thread_ticks(name: &str) -> u64 {
        for t in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = t.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
                // Fields after the parenthesised name: state is the 3rd field, utime the 14th.
                let rest = &stat[stat.rfind(')').unwrap() + 2..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                return f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
            }
        }
        panic!("no thread named {name}");
    }

    /// A reactor that polls after work stops polling once the work stops: over half a second
    /// of quiet its thread uses (nearly) no CPU, where polling on would use all of it.
    #[test]
    fn an_idle_reactor_stops_polling() {
        let (reactor, rnic) = Reactor::start("idle-reactor", Duration::from_millis(20)).unwrap();
        let pd = rnic.alloc_pd().unwrap();
        drop(rnic.reg_mr(&pd, 4096, Access::ALL).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        let before = thread_ticks("idle-reactor");
        std::thread::sleep(Duration::from_millis(500));
        let used = thread_ticks("idle-reactor") - before;
        assert!(used <= 10, "an idle reactor used {used} ticks in 50");
        drop(reactor);
    }

    /// Dropping the RNIC ends its task, and the engine serves verbs meanwhile: a
    /// registration works and the task is gone once the RNIC is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_task_ends_with_the_rnic() {
        let rnic = spawn_software_rnic(DEFAULT_POLL).unwrap();
        let pd = rnic.alloc_pd().unwrap();
        let mr = rnic.reg_mr(&pd, 4096, Access::ALL).unwrap();
        drop(mr);
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        drop(rnic);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
            >= tasks
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the engine task did not end"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
