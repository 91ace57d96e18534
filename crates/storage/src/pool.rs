//! Bounded offload of blocking system calls: each backend owns a semaphore so at most
//! `limit` of its calls occupy tokio's blocking pool at once. A slow device therefore
//! queues its own commands without starving other backends of threads.

use std::io;
use std::sync::Arc;

use tokio::sync::Semaphore;

/// Default number of concurrent blocking calls per backend.
pub const DEFAULT_LIMIT: usize = 32;

#[derive(Clone)]
pub(crate) struct BlockingPool {
    permits: Arc<Semaphore>,
    #[cfg(test)]
    limit: usize,
}

impl BlockingPool {
    pub(crate) fn new(limit: usize) -> Self {
        BlockingPool {
            permits: Arc::new(Semaphore::new(limit.max(1))),
            #[cfg(test)]
            limit: limit.max(1),
        }
    }

    /// Calls currently holding a permit (queued or running on a blocking thread).
    #[cfg(test)]
    pub(crate) fn permits_in_use(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    /// Runs `f` on a blocking thread once a permit is free.
    pub(crate) async fn run<T, F>(&self, f: F) -> io::Result<T>
    where
        F: FnOnce() -> io::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let result = f();
            drop(permit);
            result
        })
        .await
        .map_err(io::Error::other)?
    }
}
