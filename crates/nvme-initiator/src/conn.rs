//! One queue's TCP connection: the [`HostQueue`] behind a lock, a reader task feeding it the
//! controller's bytes and handing completions to their waiters, and a writer task sending
//! what it leaves in its output. Submitting waits for a free CID (a semaphore of the
//! queue's depth), so several commands are outstanding at once and none waits for a CID.

use crate::error::Error;
use crate::host::{Completion, HostConfig, HostQueue};
use bytes::Bytes;
use nvme_tcp::sqe::Sqe;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::task::JoinHandle;

/// How long the IC exchange may take.
const IC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one command may take before the caller gets [`Error::Timeout`].
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

type Waiter = oneshot::Sender<Result<Completion, Error>>;

struct State {
    host: HostQueue,
    waiters: HashMap<u16, Waiter>,
    /// Why the connection ended, once it has.
    ended: Option<Error>,
}

struct Shared {
    state: Mutex<State>,
    wake_writer: Notify,
    slots: Semaphore,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the connection: every waiter gets `e`, later submissions too.
    fn end(&self, e: Error) {
        let mut st = self.lock();
        if st.ended.is_none() {
            st.ended = Some(e.clone());
        }
        for (_, w) in st.waiters.drain() {
            let _ = w.send(Err(e.clone()));
        }
        drop(st);
        self.slots.close();
        self.wake_writer.notify_one();
    }
}

/// One connected, initialized queue.
pub struct Conn {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    depth: u16,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Conn {
    /// Connects to `addr` and does the IC exchange.
    pub async fn open(addr: std::net::SocketAddr, cfg: HostConfig) -> Result<Conn, Error> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
        stream.set_nodelay(true).ok();
        let (mut rd, mut wr) = stream.into_split();
        let mut host = HostQueue::new(cfg);
        let ic = host.take_output();
        wr.write_all(&ic)
            .await
            .map_err(|e| Error::io("sending the ICReq", e))?;
        let mut buf = vec![0u8; 4096];
        tokio::time::timeout(IC_TIMEOUT, async {
            // Bounded by the timeout and by the ICResp's 128 bytes.
            while !host.is_ready() {
                let n = rd
                    .read(&mut buf)
                    .await
                    .map_err(|e| Error::io("reading the ICResp", e))?;
                if n == 0 {
                    return Err(Error::Closed("before the ICResp".into()));
                }
                host.receive(&buf[..n]).map_err(Error::Connection)?;
            }
            Ok(())
        })
        .await
        .map_err(|_| Error::Timeout("the ICResp"))??;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                host,
                waiters: HashMap::new(),
                ended: None,
            }),
            wake_writer: Notify::new(),
            slots: Semaphore::new(usize::from(cfg.depth.max(1))),
        });
        let tasks = vec![
            tokio::spawn(read_loop(shared.clone(), rd, buf)),
            tokio::spawn(write_loop(shared.clone(), wr)),
        ];
        Ok(Conn {
            shared,
            tasks,
            depth: cfg.depth.max(1),
        })
    }

    /// Commands this queue keeps outstanding at most.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// The digests the controller enabled (header, data).
    pub fn digests(&self) -> (bool, bool) {
        self.shared.lock().host.digests()
    }

    /// Sets the most in-capsule data of a command.
    pub fn set_in_capsule_limit(&self, bytes: u32) {
        self.shared.lock().host.set_in_capsule_limit(bytes);
    }

    /// The error that ended the connection, if it ended.
    pub fn ended(&self) -> Option<Error> {
        self.shared.lock().ended.clone()
    }

    /// Runs one command: waits for a free CID, sends it, waits for its completion (at most
    /// [`COMMAND_TIMEOUT`]). A completion with an error status is returned as it is; the
    /// caller judges it.
    pub async fn command(
        &self,
        sqe: Sqe,
        write: Bytes,
        read_len: u32,
    ) -> Result<Completion, Error> {
        let permit = self.shared.slots.acquire().await;
        let Ok(_permit) = permit else {
            return Err(self.ended().unwrap_or(Error::Closed("queue closed".into())));
        };
        let rx = {
            let mut st = self.shared.lock();
            if let Some(e) = &st.ended {
                return Err(e.clone());
            }
            let cid = st
                .host
                .submit(sqe, write, read_len)
                .map_err(Error::Submit)?;
            let (tx, rx) = oneshot::channel();
            st.waiters.insert(cid, tx);
            rx
        };
        self.shared.wake_writer.notify_one();
        match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(self.ended().unwrap_or(Error::Closed("queue closed".into()))),
            Err(_) => Err(Error::Timeout("a command's completion")),
        }
    }
}

async fn read_loop(shared: Arc<Shared>, mut rd: OwnedReadHalf, mut buf: Vec<u8>) {
    buf.resize(256 * 1024, 0);
    // Bounded by the connection: ends at EOF, on a read error or a protocol error.
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) => return shared.end(Error::Closed("by the controller".into())),
            Ok(n) => n,
            Err(e) => return shared.end(Error::io("reading from the controller", e)),
        };
        let mut st = shared.lock();
        let r = st.host.receive(&buf[..n]);
        for c in st.host.take_completions() {
            if let Some(w) = st.waiters.remove(&c.cid) {
                let _ = w.send(Ok(c));
            }
        }
        let wake = st.host.has_output();
        drop(st);
        if wake {
            shared.wake_writer.notify_one();
        }
        if let Err(e) = r {
            tracing::warn!("NVMe/TCP connection ended: {e}");
            return shared.end(Error::Connection(e));
        }
    }
}

async fn write_loop(shared: Arc<Shared>, mut wr: OwnedWriteHalf) {
    // Bounded by the connection: ends when it has ended and everything queued was sent.
    loop {
        shared.wake_writer.notified().await;
        let (out, ended) = {
            let mut st = shared.lock();
            (st.host.take_output(), st.ended.is_some())
        };
        if !out.is_empty() {
            if let Err(e) = wr.write_all(&out).await {
                return shared.end(Error::io("writing to the controller", e));
            }
        }
        if ended {
            let _ = wr.shutdown().await;
            return;
        }
    }
}
