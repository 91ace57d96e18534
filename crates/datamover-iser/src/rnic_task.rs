//! The software RNIC's progress engine as a task of the current tokio runtime rather than a
//! thread of its own: the thread that posts a verb also runs the engine, and the completions it
//! produces wake tasks on that thread, with no switch to and from a progress thread in between.
//! Initiator connections run their RNIC so (128 KiB reads at QD 32: 1.2x, with less initiator
//! CPU per command); the target keeps the thread, since on its multi-threaded runtime the engine
//! as a task made reads slower.

use rnic::{Driver, Rnic, Turn};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

/// A software RNIC whose engine runs as a task on the current tokio runtime; it ends when
/// the RNIC is dropped. Everything using the RNIC must run while that runtime does.
pub fn spawn_software_rnic() -> std::io::Result<Rnic> {
    let kicked = Arc::new(Notify::new());
    let kick = kicked.clone();
    let (rnic, driver) =
        Rnic::new_driven(move || kick.notify_one()).map_err(std::io::Error::other)?;
    // SAFETY: the descriptor is the driver's epoll, which `Driven` drops after this
    // registration and never closes or replaces meanwhile. Exercised by every iSER test on the
    // software RNIC (and `the_task_ends_with_the_rnic`).
    let poller =
        unsafe { AsyncFd::register_with_interest(EngineFd(driver.fd()), Interest::READABLE)? };
    tokio::spawn(drive(Driven { poller, driver }, kicked));
    Ok(rnic)
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

async fn drive(mut d: Driven, kicked: Arc<Notify>) {
    let mut tick = tokio::time::interval(Driver::TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        match d.driver.turn() {
            Turn::Stopped => break,
            // Other tasks (the ones the turn's completions woke, say) go first.
            Turn::More => {
                tokio::task::yield_now().await;
                continue;
            }
            Turn::Idle => {}
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

    /// Dropping the RNIC ends its task, and the engine serves verbs meanwhile: a
    /// registration works and the task is gone once the RNIC is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_task_ends_with_the_rnic() {
        let rnic = spawn_software_rnic().unwrap();
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
