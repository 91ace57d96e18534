//! The software iWARP RNIC: RDMAP/DDP/MPA over ordinary TCP sockets, wire-compatible with the
//! Linux kernel's soft-iWARP (siw) and hardware iWARP RNICs, implementing the `rdma` API.
//!
//! # Threading model
//! Each [`Rnic`] has one progress engine that drives all of its queue pairs through epoll (mio):
//! many QPs on one engine. [`Rnic::new`] gives the engine a thread of its own;
//! [`Rnic::new_driven`] hands it to the caller as a [`Driver`] to run from an event loop, so
//! that an async runtime's worker that posts a verb also runs the engine, with no thread
//! switch between the two. Verbs calls (`post_send`, `post_recv`, `poll`, `req_notify`) run in the
//! caller's thread and only touch the QP's queues under a short mutex; `post_send` wakes the
//! engine once per batch (its thread's eventfd, or the driver's kick). With
//! [`Rnic::post_in_place`] (off by default) a `post_send` that finds the send queue empty
//! posts in place: if the engine is not serving that connection at that moment (its lock is
//! free), the poster runs the connection's transmit side itself, so the FPDUs are written and
//! the completions pushed on the poster's thread, without waiting for a switch to the engine;
//! when the socket would block, work remains or the lock is taken, the engine writes them. The
//! engine is kicked either way: a driven engine's turn that finds work starts its poll window,
//! which then covers the answer to what was written. It is off by default because the engine
//! may then wait on a connection lock held by a poster that was descheduled (its measurement:
//! docs/performance-notes.md). Either way one lock orders all transmitting, so FPDUs and
//! completions keep the posting order. Completions are pushed to CQs by the engine, which
//! signals a completion channel (an eventfd, usable with epoll or tokio's `AsyncFd`) when the
//! CQ was armed. Connecting (TCP + MPA Request/Reply) runs blocking in the caller's thread with
//! timeouts; the listener reads every accepted connection's MPA Request without blocking on any
//! one (a silent client delays no other); then the socket is handed to the engine.
//!
//! # Data path
//! Outbound messages are cut into FPDUs sized to the TCP MSS (as siw does; 32 KiB or more on
//! loopback) and written with `sendmmsg` straight from registered memory (with MPA CRC, a
//! payload from memory that could change is copied as its CRC is computed, so the bytes sent are
//! the bytes the CRC covers even when the ULP changes the region meanwhile, as a hardware RNIC
//! reads memory once; a caller's immutable bytes, registered with `reg_bytes`, leave in place
//! with their CRC taken there, and so does a region whose owner keeps its blocks' CRCs and the
//! bytes unchanged until sent (`MemoryRegion::keep_block_crcs`): the FPDU's CRC is joined from
//! those, only partial blocks read). On network
//! paths each FPDU is its own message ending in MSG_EOR, so that TCP starts every FPDU in a new
//! segment (RFC 5044's alignment, what siw does, what tshark's MPA dissector needs); on loopback FPDUs
//! are packed unless [`Rnic::align_fpdus_on_loopback`] asks for alignment. Inbound bytes are read
//! ahead into a per-connection stage (one read takes every small FPDU that has arrived); FPDU
//! headers are checked (STag validity, protection domain, access rights, bounds, MSN, receive
//! buffer length) before any payload is placed, and then short payloads are copied from the
//! stage while long ones are read from the socket directly into the target region. Any violation sends a Terminate with the matching error code and moves the QP to
//! the error state, flushing all outstanding work requests. MPA CRC32C is computed and checked when
//! negotiated; markers are always refused.

mod cm;
mod cq;
mod engine;
mod listener;
mod mem;
mod qp;
mod shared;

pub use cm::MAX_PRIVATE_DATA;
pub use cq::{Channel, Cq};
pub use engine::{Driver, Turn};
/// The fixed part of an MPA Request or Reply (key, flags, revision, private data length).
pub use iwarp::mpa::HEADER_LEN as MPA_HEADER_LEN;
pub use listener::{Request, RnicListener, MAX_PENDING_REQUESTS, REQUEST_TIMEOUT};
pub use mem::{blocks_sent_by_crc, AccessError, Mr, StagTable};
pub use qp::Qp;

use rdma::{Access, Provider, QpCaps, QpState, Result};
use shared::{Cmd, EngineShared, QpQueues, QpShared};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A protection domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pd {
    id: u32,
}

impl Pd {
    /// The domain's number (what the STag table checks an access against).
    pub fn id(&self) -> u32 {
        self.id
    }
}

struct RnicInner {
    engine: Arc<EngineShared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    stags: Arc<StagTable>,
    next_pd: AtomicU32,
    next_qp: AtomicU32,
}

impl Drop for RnicInner {
    fn drop(&mut self) {
        self.engine.send(Cmd::Stop);
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

/// One software RNIC instance (one progress thread, or a [`Driver`] run by its owner).
#[derive(Clone)]
pub struct Rnic {
    inner: Arc<RnicInner>,
}

impl Rnic {
    /// An RNIC whose progress thread sleeps in epoll whenever it has nothing to do.
    pub fn new() -> Result<Rnic> {
        Self::polling(Duration::ZERO)
    }

    /// An RNIC whose progress thread goes on turning for `poll` after its last work before it
    /// sleeps (as a driven engine's owner may: see `datamover_iser::rnic_task`), trading CPU
    /// for the cost of being woken.
    pub fn polling(poll: Duration) -> Result<Rnic> {
        let (engine, thread) = engine::start(poll)?;
        Ok(Rnic {
            inner: Arc::new(RnicInner {
                engine,
                thread: Mutex::new(Some(thread)),
                stags: StagTable::new(),
                next_pd: AtomicU32::new(1),
                next_qp: AtomicU32::new(1),
            }),
        })
    }

    /// An RNIC without a progress thread: the returned [`Driver`] runs its engine from the
    /// caller's event loop (an async runtime's task, say), and `kick` is how posting a verb
    /// asks that loop for a turn. Verbs posted on the loop's own thread then cost no thread
    /// switch, and neither do the completions they lead to. The engine ends when the RNIC is
    /// dropped (the next turn returns [`Turn::Stopped`]).
    pub fn new_driven(kick: impl Fn() + Send + Sync + 'static) -> Result<(Rnic, Driver)> {
        let engine = engine::Engine::new(Some(Box::new(kick)))?;
        let rnic = Rnic {
            inner: Arc::new(RnicInner {
                engine: engine.shared.clone(),
                thread: Mutex::new(None),
                stags: StagTable::new(),
                next_pd: AtomicU32::new(1),
                next_qp: AtomicU32::new(1),
            }),
        };
        Ok((rnic, Driver::new(engine)))
    }

    /// Aligns FPDUs with TCP segments on loopback connections too (network paths always are),
    /// for connections attached from now on: wanted when a loopback hop is captured and
    /// decoded, as behind qemu's user-mode network; costs throughput on loopback.
    pub fn align_fpdus_on_loopback(&self, on: bool) {
        self.inner
            .engine
            .align_on_loopback
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Lets a thread posting to a QP whose send queue is empty write the FPDUs itself, on its
    /// own thread, when the engine is not serving that connection at that moment (off by
    /// default: see the crate's threading model); off, every posted work request is handed to
    /// the engine. Completions and ordering are the same either way. Applies from the next
    /// post.
    pub fn post_in_place(&self, on: bool) {
        self.inner
            .engine
            .post_in_place
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The STag table (exposed for tests and diagnostics).
    pub fn stags(&self) -> &Arc<StagTable> {
        &self.inner.stags
    }
}

impl Provider for Rnic {
    type Pd = Pd;
    type Mr = Mr;
    type Channel = Channel;
    type Cq = Cq;
    type Qp = Qp;
    type Listener = RnicListener;

    fn name(&self) -> String {
        "rnic (software iWARP over TCP)".into()
    }

    fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            id: self.inner.next_pd.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn reg_mr(&self, pd: &Pd, len: usize, access: Access) -> Result<Mr> {
        let inner = self
            .inner
            .stags
            .register(pd.id, len, access)
            .ok_or_else(|| {
                rdma::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!("cannot allocate a {len}-byte region"),
                ))
            })?;
        Ok(Mr { inner })
    }

    fn reg_bytes(&self, pd: &Pd, data: bytes::Bytes, access: Access) -> Result<Mr> {
        let inner = self.inner.stags.register_bytes(pd.id, data, access)?;
        Ok(Mr { inner })
    }

    fn create_channel(&self) -> Result<Channel> {
        Channel::new()
    }

    fn create_cq(&self, depth: u32, channel: Option<&Channel>) -> Result<Cq> {
        Ok(Cq::with_engine(
            depth,
            channel,
            Some(self.inner.engine.clone()),
        ))
    }

    fn create_qp(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        let num = self.inner.next_qp.fetch_add(1, Ordering::Relaxed);
        Ok(Qp {
            shared: Arc::new(QpShared {
                num,
                pd: pd.id,
                stags: self.inner.stags.clone(),
                send_cq: send_cq.shared.clone(),
                recv_cq: recv_cq.shared.clone(),
                caps,
                q: Mutex::new(QpQueues {
                    sq: VecDeque::new(),
                    rq: VecDeque::new(),
                    state: QpState::Init,
                    attached: false,
                    error: None,
                }),
                cv: Condvar::new(),
                kick: AtomicBool::new(false),
                engine: self.inner.engine.clone(),
                in_place: std::sync::OnceLock::new(),
            }),
        })
    }

    fn listen(&self, addr: SocketAddr) -> Result<RnicListener> {
        RnicListener::new(TcpListener::bind(addr)?)
    }
}
