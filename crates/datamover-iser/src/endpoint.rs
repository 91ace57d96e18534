//! One RDMA connection as the iSER layer uses it: a queue pair, a ring of registered receive
//! buffers (each received Send comes out as `Bytes` and its buffer is posted again at once),
//! a pool of registered send buffers (a Send takes one and its completion gives it back), and
//! a completion task woken by the channel, the only poller. Received Sends go through a
//! channel in the login phase and, in full feature phase, to the datamover's handler on the
//! completion task itself ([`Endpoint::deliver_to`]). Since receives are posted again at
//! once, the queue pair does not hold the peer to its receive credit: whatever holds
//! received Sends for the session holds at most as many as there are receives
//! ([`Endpoint::recv_credit`]), and a peer with more outstanding has broken iSER's flow
//! control and loses the connection (see [`crate::credit`]). The receive and send queues have a CQ
//! each: the send CQ is polled whenever the task runs but armed only while someone waits for
//! one of its completions (an RDMA Read's issuer, a sender out of buffers), since most of
//! them only give a buffer back. While completions keep coming the task polls again after the
//! tasks they woke have run, and arms the CQs only when it finds them empty. A peer that
//! stops taking part is dropped with [`Endpoint::abort`] (an orderly close would wait for it):
//! in full feature phase a watch drops a connection whose Sends and RDMA Writes stop
//! completing ([`Endpoint::drop_when_send_stalls`]).
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::mr_pool::{MrPool, PooledMr};
use bytes::Bytes;
use iscsi_wire::Pdu;
use iser::IserHeader;
use rdma::{
    Access, CompletionChannel, CompletionQueue, MemoryRegion, Provider, QueuePair, RecvWr, SendOp,
    SendWr, Wc, WcOpcode, WcStatus,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore, TryAcquireError};

/// An RDMA provider whose objects can move into tasks (every provider in this tree).
pub trait Device:
    Provider<Pd: 'static, Mr: 'static, Cq: 'static, Channel: 'static, Qp: 'static> + 'static
{
}

impl<T> Device for T where
    T: Provider<Pd: 'static, Mr: 'static, Cq: 'static, Channel: 'static, Qp: 'static> + 'static
{
}

/// Buffer counts and sizes of an endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Buffers {
    /// Receives kept posted: every Send the peer may have in flight needs one (iWARP has no
    /// receiver-not-ready retry).
    pub recv_slots: u32,
    /// Bytes of each receive buffer: the largest Send the peer may send.
    pub recv_len: usize,
    pub send_slots: u32,
    /// Bytes of each send buffer: the largest Send we send.
    pub send_len: usize,
}

/// What a finished operation of ours did.
enum Pending {
    /// A Send: its buffer goes back to the pool.
    Send(u32),
    /// An operation someone waits for.
    Waiter(oneshot::Sender<WcStatus>),
    /// An operation nobody waits for: what it reads from is held until it completes.
    Holding(Box<dyn Send>),
}

impl Pending {
    /// A Send, or an operation nobody waits for: what the send-stall watch counts (an
    /// operation someone waits for is bounded by its waiter).
    fn is_transmit(&self) -> bool {
        matches!(self, Pending::Send(_) | Pending::Holding(_))
    }
}

/// A connected (or about to be connected) queue pair with its buffers.
pub struct Endpoint<P: Provider> {
    qp: P::Qp,
    recv_mr: P::Mr,
    send_mr: P::Mr,
    buffers: Buffers,
    send_free: Mutex<Vec<u32>>,
    send_permits: Semaphore,
    pending: Mutex<HashMap<u64, Pending>>,
    next_ticket: AtomicU64,
    /// Held while a work request is stamped and posted: posting order is wire order.
    post_lock: Mutex<()>,
    /// Registered regions RDMA Writes leave from (no remote access).
    sources: Arc<MrPool<P>>,
    /// Registered regions RDMA Reads land in (local write only).
    sinks: Arc<MrPool<P>>,
    /// The shared protection domain it was created in (a [`TargetDevice::domain`]), or 0
    /// for a domain of its own.
    ///
    /// [`TargetDevice::domain`]: crate::target_device::TargetDevice::domain
    domain: usize,
    /// Becomes true when the completion task ends: the queue pair is closed (or failed) and
    /// its work requests flushed.
    ended: watch::Sender<bool>,
    /// Where the completion task puts what the peer sent.
    delivery: Mutex<Delivery>,
    /// Who is at the other end, for the log (see [`Endpoint::set_peer`]).
    peer: OnceLock<SocketAddr>,
    /// The send queue's completions. The completion task polls them whenever it runs, but
    /// arms them (lets them wake it) only while someone waits for one: most end a Send whose
    /// buffer can wait to come back, and waking for each cost a wake-up per command.
    send_cq: P::Cq,
    /// How many wait for a send-queue completion: callers of [`Endpoint::post_and_wait`]
    /// (see [`SendWatch`]), and work posted with [`Endpoint::post_holding`] until it
    /// completes, whose hold (a read's range lock on a RAM LUN image, which keeps writers
    /// off) must go then, not whenever the connection next has work.
    send_watchers: AtomicUsize,
    /// Makes the completion task poll at once (a new watcher whose completion may be in).
    poll_now: Notify,
    /// Sends and RDMA Writes posted and not completed yet (RDMA Reads are bounded by their
    /// issuer, see [`Endpoint::post_and_wait`]).
    transmits_outstanding: AtomicUsize,
    /// Sends and RDMA Writes completed so far: the progress [`Endpoint::drop_when_send_stalls`]
    /// watches for.
    transmits_done: AtomicU64,
    // The pools hold the device and the protection domain, which must live as long as the
    // queue pair that uses them (a provider's progress may stop when its last handle goes).
}

/// Idle bytes each of an endpoint's region pools keeps for reuse.
const POOL_IDLE_BYTES: usize = 16 << 20;

/// Why a connection's stream of received Sends ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEnd {
    /// The peer closed it, or it was closed here (work requests flushed).
    Closed,
    /// An RDMA operation or the completion machinery failed.
    Failed(String),
}

impl std::fmt::Display for ConnEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnEnd::Closed => f.write_str("the connection ended"),
            ConnEnd::Failed(why) => f.write_str(why),
        }
    }
}

/// What the peer sent, in order; an error ends the stream (the connection is gone). It holds
/// at most [`Endpoint::recv_credit`] Sends, and one place more for the end.
pub type Received = mpsc::Receiver<Result<Inbound, ConnEnd>>;
type ReceivedTx = mpsc::Sender<Result<Inbound, ConnEnd>>;

/// Takes what the peer sent, in order, on the completion task itself (see
/// [`Endpoint::deliver_to`]); false when it wants nothing more (the connection is ending).
pub type Deliver = Box<dyn FnMut(Result<Inbound, ConnEnd>) -> bool + Send>;

/// Where received Sends go: a channel in the login phase, a handler in full feature phase.
enum Delivery {
    /// Holds up to `credit` Sends, and the end in the place kept for it.
    Channel {
        tx: ReceivedTx,
        credit: usize,
    },
    Handler(Deliver),
    /// The handler wanted nothing more.
    Done,
}

impl Delivery {
    /// Hands `item` on. A Send finding the channel already holding `credit` Sends is not
    /// queued: the peer has more outstanding than it had receives, and the error says so.
    fn deliver(&mut self, item: Result<Inbound, ConnEnd>) -> Result<(), String> {
        match self {
            Delivery::Channel { tx, credit } => {
                if item.is_ok() {
                    let held = crate::credit::queued(tx);
                    if held >= *credit {
                        return Err(crate::credit::overrun_reason(held, *credit));
                    }
                }
                // Cannot be full: Sends take at most `credit` places, the end the last one.
                // Closed: the login phase is over and what comes is dropped.
                let _ = tx.try_send(item);
            }
            Delivery::Handler(h) => {
                if !h(item) {
                    *self = Delivery::Done;
                }
            }
            Delivery::Done => {}
        }
        Ok(())
    }
}

/// The next login-phase PDU from `received` (both roles): a Send that is no valid iSER
/// control message, or that invalidates an STag, ends the connection (`Bad`).
pub async fn recv_login_pdu(
    received: &mut Received,
    max_data: u32,
) -> Result<datamover::InPdu, datamover::LoginRecvError> {
    use datamover::LoginRecvError;
    let bytes = match received.recv().await {
        Some(Ok(inbound)) if inbound.invalidated.is_some() => {
            return Err(LoginRecvError::Bad(
                "a Send with Invalidate during login".into(),
            ))
        }
        Some(Ok(inbound)) => inbound.bytes,
        Some(Err(ConnEnd::Failed(e))) => return Err(LoginRecvError::Io(e)),
        Some(Err(ConnEnd::Closed)) | None => return Err(LoginRecvError::Closed),
    };
    let send =
        iser::parse_send(&bytes, max_data).map_err(|e| LoginRecvError::Bad(e.to_string()))?;
    Ok(datamover::InPdu {
        pdu: send.pdu,
        raw_bhs: send.raw_bhs,
    })
}

/// One received Send.
#[derive(Debug)]
pub struct Inbound {
    pub bytes: Bytes,
    /// The STag the peer invalidated with it (Send with Invalidate).
    pub invalidated: Option<u32>,
}

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Tickets at and above this are ours; receive work requests use the slot index.
const TICKET_BASE: u64 = 1 << 32;

impl<P: Device> Endpoint<P> {
    /// Creates the queue pair and its buffers on `dev` and posts every receive (before the
    /// connection exists, so the peer's first Send finds one). Returns the endpoint, its
    /// receive stream and a starter for the completion task (call it once connected).
    pub fn create(dev: Arc<P>, buffers: Buffers) -> rdma::Result<(Arc<Self>, Received, Poller<P>)> {
        let pd = dev.alloc_pd()?;
        Self::create_in(dev, pd, 0, buffers)
    }

    /// [`Endpoint::create`] in protection domain `pd`, shared as `domain` (non-zero).
    pub fn create_in(
        dev: Arc<P>,
        pd: P::Pd,
        domain: usize,
        buffers: Buffers,
    ) -> rdma::Result<(Arc<Self>, Received, Poller<P>)> {
        let channel = dev.create_channel()?;
        let caps = rdma::QpCaps {
            max_send_wr: buffers.send_slots + 64,
            max_recv_wr: buffers.recv_slots,
            max_sge: 4,
        };
        // Room for every work request's completion: the send CQ may wait to be polled.
        let recv_cq = dev.create_cq(caps.max_recv_wr + 64, Some(&channel))?;
        let send_cq = dev.create_cq(caps.max_send_wr + 64, Some(&channel))?;
        let qp = dev.create_qp(&pd, &send_cq, &recv_cq, caps)?;
        let recv_mr = dev.reg_mr(
            &pd,
            buffers.recv_slots as usize * buffers.recv_len,
            Access::LOCAL_WRITE,
        )?;
        let send_mr = dev.reg_mr(
            &pd,
            buffers.send_slots as usize * buffers.send_len,
            Access::NONE,
        )?;
        let credit = buffers.recv_slots as usize;
        let (tx, rx) = mpsc::channel(credit + 1);
        let ep = Arc::new(Endpoint {
            qp,
            recv_mr,
            send_mr,
            buffers,
            send_free: Mutex::new((0..buffers.send_slots).rev().collect()),
            send_permits: Semaphore::new(buffers.send_slots as usize),
            pending: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(TICKET_BASE),
            post_lock: Mutex::new(()),
            sources: MrPool::new(dev.clone(), pd.clone(), Access::NONE, POOL_IDLE_BYTES),
            sinks: MrPool::new(dev, pd, Access::LOCAL_WRITE, POOL_IDLE_BYTES),
            domain,
            ended: watch::Sender::new(false),
            delivery: Mutex::new(Delivery::Channel { tx, credit }),
            peer: OnceLock::new(),
            send_cq,
            send_watchers: AtomicUsize::new(0),
            poll_now: Notify::new(),
            transmits_outstanding: AtomicUsize::new(0),
            transmits_done: AtomicU64::new(0),
        });
        for slot in 0..buffers.recv_slots {
            ep.post_recv(slot)?;
        }
        Ok((
            ep.clone(),
            rx,
            Poller {
                ep,
                recv_cq,
                channel,
            },
        ))
    }

    /// The queue pair (to connect or accept on).
    pub fn qp(&self) -> &P::Qp {
        &self.qp
    }

    /// Names the other end for the log (once; later calls change nothing).
    pub fn set_peer(&self, peer: SocketAddr) {
        let _ = self.peer.set(peer);
    }

    /// The other end as the log names it.
    pub(crate) fn peer_name(&self) -> String {
        self.peer
            .get()
            .map_or_else(|| "the peer".to_string(), ToString::to_string)
    }

    /// How many received Sends may wait for the session at once: the receives posted. A
    /// peer keeps no more Sends outstanding than that, whatever else it is allowed.
    pub fn recv_credit(&self) -> usize {
        self.buffers.recv_slots as usize
    }

    fn post_recv(&self, slot: u32) -> rdma::Result<()> {
        let len = self.buffers.recv_len;
        self.qp.post_recv(RecvWr {
            wr_id: slot as u64,
            sges: vec![self.recv_mr.sge(slot as usize * len, len)],
        })
    }

    fn ticket(&self, what: Pending) -> u64 {
        if what.is_transmit() {
            self.transmits_outstanding.fetch_add(1, Ordering::Relaxed);
        }
        let t = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().expect("pending").insert(t, what);
        t
    }

    /// Sends `pdu` behind `header` as one Send (`op`: Send, or Send with Invalidate). Waits
    /// only for a free send buffer; the completion returns it.
    pub async fn send(&self, header: &IserHeader, pdu: &Pdu, op: SendOp) -> Result<(), String> {
        let mut pdu = pdu.clone();
        self.send_with(header, &mut pdu, op, |_| {}).await
    }

    /// Like [`Endpoint::send`], with `stamp` applied to the PDU just before it is posted
    /// (under the lock that orders posting), so the numbers it takes follow wire order.
    pub async fn send_with(
        &self,
        header: &IserHeader,
        pdu: &mut Pdu,
        op: SendOp,
        stamp: impl FnOnce(&mut Pdu),
    ) -> Result<(), String> {
        let len = iser::send_len(pdu);
        if len > self.buffers.send_len {
            return Err(format!(
                "a {len}-byte Send exceeds the {}-byte send buffers",
                self.buffers.send_len
            ));
        }
        let permit = match self.send_permits.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err("connection closed".to_string()),
            Err(TryAcquireError::NoPermits) => {
                // Buffers come back with send completions: have them polled, and wake us.
                let _watch = self.watch_sends();
                self.poll_now.notify_one();
                self.send_permits
                    .acquire()
                    .await
                    .map_err(|_| "connection closed".to_string())?
            }
        };
        permit.forget();
        let slot = self
            .send_free
            .lock()
            .expect("send_free")
            .pop()
            .expect("a permit means a free slot");
        let at = slot as usize * self.buffers.send_len;
        let ticket = self.ticket(Pending::Send(slot));
        let posted = {
            let _order = self.post_lock.lock().expect("post lock");
            stamp(pdu);
            let mut bytes = vec![0u8; len];
            iser::encode_send(header, pdu, &mut bytes);
            self.send_mr.write_at(at, &bytes);
            self.qp.post_send(SendWr {
                wr_id: ticket,
                op,
                sges: vec![self.send_mr.sge(at, len)],
                signaled: true,
            })
        };
        if let Err(e) = posted {
            self.finish(ticket, WcStatus::Flushed);
            return Err(format!("posting a Send: {e}"));
        }
        Ok(())
    }

    /// A registered region of at least `len` bytes for an RDMA Write to leave from, from the
    /// endpoint's pool (registered once, reused).
    pub fn source(&self, len: usize) -> rdma::Result<PooledMr<P>> {
        self.sources.take(len)
    }

    /// The shared protection domain it is in (0: a domain of its own).
    pub fn domain(&self) -> usize {
        self.domain
    }

    /// The pool [`Endpoint::source`] takes from.
    pub fn source_pool(&self) -> Arc<MrPool<P>> {
        self.sources.clone()
    }

    /// A registered region of at least `len` bytes for an RDMA Read to land in, from the pool.
    pub fn sink(&self, len: usize) -> rdma::Result<PooledMr<P>> {
        self.sinks.take(len)
    }

    /// Posts `wr` (its `wr_id` is replaced) and waits for its completion: an RDMA Read or
    /// Write whose end the caller must know.
    pub async fn post_and_wait(&self, wr: SendWr) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        // Armed before the post, so its completion wakes the completion task.
        let _watch = self.watch_sends();
        self.post_ticketed(wr, Pending::Waiter(tx))?;
        match rx.await {
            Ok(WcStatus::Success) => Ok(()),
            Ok(status) => Err(connection_error(status).to_string()),
            Err(_) => Err(ConnEnd::Closed.to_string()),
        }
    }

    /// Posts `wr` (its `wr_id` is replaced) without waiting for it: `held` (what its local
    /// memory belongs to) is dropped when it completes. For an RDMA Write whose end nobody
    /// needs to see: a Send posted after it reaches the peer after its data (queue pair
    /// order), and a failure fails the connection.
    pub fn post_holding(&self, wr: SendWr, held: Box<dyn Send>) -> Result<(), String> {
        if self.send_watchers.fetch_add(1, Ordering::SeqCst) == 0 {
            // A quiet completion task arms the send CQ only for the watchers it saw when it
            // went quiet: have it look again.
            self.poll_now.notify_one();
        }
        self.post_ticketed(wr, Pending::Holding(held))
    }

    /// Posts `wr` in posting order under a ticket for `what` (its `wr_id`); a failed post
    /// ends the ticket at once.
    fn post_ticketed(&self, mut wr: SendWr, what: Pending) -> Result<(), String> {
        wr.wr_id = self.ticket(what);
        let ticket = wr.wr_id;
        let posted = {
            let _order = self.post_lock.lock().expect("post lock");
            self.qp.post_send(wr)
        };
        posted.map_err(|e| {
            self.finish(ticket, WcStatus::Flushed);
            format!("posting a work request: {e}")
        })
    }

    /// Counts a waiter for a send-queue completion while the guard lives, and arms the send
    /// CQ (the completion task re-arms it as long as anyone waits).
    fn watch_sends(&self) -> SendWatch<'_, P> {
        self.send_watchers.fetch_add(1, Ordering::SeqCst);
        self.send_cq.req_notify(false);
        SendWatch(self)
    }

    /// Ends a ticket: a Send's buffer goes back, a waiter hears the status, what an
    /// operation held is let go.
    fn finish(&self, ticket: u64, status: WcStatus) {
        let Some(p) = self.pending.lock().expect("pending").remove(&ticket) else {
            return;
        };
        if p.is_transmit() {
            self.transmits_outstanding.fetch_sub(1, Ordering::Relaxed);
            self.transmits_done.fetch_add(1, Ordering::Relaxed);
        }
        match p {
            Pending::Send(slot) => {
                self.send_free.lock().expect("send_free").push(slot);
                self.send_permits.add_permits(1);
            }
            Pending::Waiter(tx) => {
                let _ = tx.send(status);
            }
            Pending::Holding(held) => {
                drop(held);
                self.send_watchers.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Closes the connection: queued work goes out, then it is shut down.
    pub fn close(&self) {
        self.qp.disconnect();
    }

    /// Drops the connection at once, whatever is queued or outstanding: for a peer that
    /// stopped taking part, which an orderly [`Endpoint::close`] would wait for.
    pub fn abort(&self) {
        self.qp.abort();
    }

    /// From now on, a connection whose Sends and RDMA Writes wait `limit` with none of them
    /// completing is dropped ([`Endpoint::abort`]): its peer has stopped taking what is sent
    /// (on iWARP, stopped reading its TCP socket), and would otherwise hold the commands
    /// behind them, the regions they leave from and the send buffers for ever. Checked
    /// every quarter of `limit` by a task that ends with the connection, so a stall is
    /// found between `limit` and 2 × `limit` after it began.
    pub fn drop_when_send_stalls(self: &Arc<Self>, limit: std::time::Duration) {
        const TICKS: u32 = 4;
        let ep = Arc::downgrade(self);
        let ended = self.when_ended();
        let watching = async move {
            let period = (limit / TICKS).max(std::time::Duration::from_millis(1));
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seen = None;
            // Ticks in a row that found work outstanding and none completed since the last.
            let mut quiet = 0;
            loop {
                tick.tick().await;
                let Some(ep) = ep.upgrade() else { return };
                let done = ep.transmits_done.load(Ordering::Relaxed);
                let waiting = ep.transmits_outstanding.load(Ordering::Relaxed) > 0;
                quiet = if waiting && seen == Some(done) {
                    quiet + 1
                } else {
                    0
                };
                seen = Some(done);
                // One tick more than `limit` holds: the work seen first may have been posted
                // just before that tick.
                if quiet > TICKS {
                    tracing::warn!(
                        peer = %ep.peer_name(),
                        "the peer took none of the Sends and RDMA Writes queued for it in {} s (it stopped reading): dropping the connection",
                        limit.as_secs_f32()
                    );
                    ep.abort();
                    return;
                }
                // Send completions wait in the send CQ until something polls it: have them
                // counted by the next tick.
                ep.poll_now.notify_one();
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                () = ended => {}
                () = watching => {}
            }
        });
    }

    /// Resolves once the connection is over: closed by both sides (or failed), its work
    /// requests flushed. A process that exits before then may cut the close handshake short.
    pub fn when_ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut ended = self.ended.subscribe();
        async move {
            let _ = ended.wait_for(|e| *e).await;
        }
    }

    /// Runs `close` once the peer has ended the connection or `grace` has passed, whichever
    /// is first: after a logout, the side that is to close second gives the other its turn.
    pub fn close_after_peer_or(
        &self,
        grace: std::time::Duration,
        close: impl FnOnce() + Send + 'static,
    ) {
        let ended = self.when_ended();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(grace, ended).await;
            close();
        });
    }

    /// From now on the completion task hands what the peer sends to `deliver` itself, first
    /// what `received` still holds: full feature phase takes each Send where it is polled,
    /// without waking another task for it.
    pub fn deliver_to(&self, mut received: Received, mut deliver: Deliver) {
        let mut delivery = self.delivery.lock().expect("delivery");
        // Under the lock, so nothing the completion task polls meanwhile overtakes these.
        while let Ok(item) = received.try_recv() {
            if !deliver(item) {
                *delivery = Delivery::Done;
                return;
            }
        }
        *delivery = Delivery::Handler(deliver);
    }

    /// Full feature phase's delivery as both roles take it ([`Endpoint::deliver_to`]): each
    /// Send goes to `on_send`; the first error it returns, or the end of the connection,
    /// goes to `on_end`, once, and nothing is delivered after it.
    pub fn deliver_sends(
        &self,
        received: Received,
        mut on_send: impl FnMut(Inbound) -> Result<(), String> + Send + 'static,
        on_end: impl FnOnce(String) + Send + 'static,
    ) {
        let mut on_end = Some(on_end);
        self.deliver_to(
            received,
            Box::new(move |item| {
                let why = match item.map_err(|end| end.to_string()).and_then(&mut on_send) {
                    Ok(()) => return true,
                    Err(why) => why,
                };
                if let Some(end) = on_end.take() {
                    end(why);
                }
                false
            }),
        );
    }

    /// Hands `item` to the session; a Send beyond the receive credit ends the connection
    /// (the error is what ends the completion task).
    fn deliver(&self, item: Result<Inbound, ConnEnd>) -> Result<(), ConnEnd> {
        let refused = self.delivery.lock().expect("delivery").deliver(item);
        refused.map_err(|why| {
            crate::credit::overrun(&self.peer_name(), &why);
            self.close();
            ConnEnd::Failed(why)
        })
    }

    /// A received Send in receive slot `slot`: its bytes, and the slot posted again.
    fn take_recv(&self, slot: u32, len: u32) -> Result<Bytes, ConnEnd> {
        let len = (len as usize).min(self.buffers.recv_len);
        let mut bytes = vec![0u8; len];
        self.recv_mr
            .read_at(slot as usize * self.buffers.recv_len, &mut bytes);
        self.post_recv(slot)
            .map_err(|e| ConnEnd::Failed(format!("reposting a receive: {e}")))?;
        Ok(Bytes::from(bytes))
    }
}

/// A waiter for a send-queue completion (see [`Endpoint::watch_sends`]).
struct SendWatch<'a, P: Provider>(&'a Endpoint<P>);

impl<P: Provider> Drop for SendWatch<'_, P> {
    fn drop(&mut self) {
        self.0.send_watchers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The completion task's parts, started once the connection is up.
pub struct Poller<P: Provider> {
    ep: Arc<Endpoint<P>>,
    recv_cq: P::Cq,
    channel: P::Channel,
}

impl<P: Device> Poller<P> {
    /// Runs the completion task on the current tokio runtime.
    pub fn start(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn run(self) {
        let Poller {
            ep,
            recv_cq,
            channel,
        } = self;
        // SAFETY: the descriptor belongs to `channel`, which is declared before the AsyncFd and
        // so outlives it (the AsyncFd is dropped at the end of this match); the descriptor is
        // never closed or replaced meanwhile. Exercised by every test that logs in over iSER.
        let registered =
            unsafe { AsyncFd::register_with_interest(ChannelFd(channel.fd()), Interest::READABLE) };
        let reason = match registered {
            Ok(afd) => poll_until_closed(&ep, &recv_cq, &channel, &afd).await,
            Err(e) => ConnEnd::Failed(format!("completion channel: {e}")),
        };
        ep.send_permits.close();
        let waiters: Vec<u64> = ep
            .pending
            .lock()
            .expect("pending")
            .keys()
            .copied()
            .collect();
        for t in waiters {
            ep.finish(t, WcStatus::Flushed);
        }
        ep.ended.send_replace(true);
        // The end is always taken (the channel keeps a place for it).
        let _ = ep.deliver(Err(reason));
    }
}

/// Re-arms, polls until empty, dispatches; sleeps on the channel (or until a new watcher of
/// send completions asks for a poll); until the connection ends.
async fn poll_until_closed<P: Device>(
    ep: &Endpoint<P>,
    recv_cq: &P::Cq,
    channel: &P::Channel,
    afd: &AsyncFd<ChannelFd>,
) -> ConnEnd {
    let mut wcs = [Wc::EMPTY; 32];
    loop {
        // While completions keep coming, poll again after the tasks they woke have run,
        // and leave the CQs unarmed: an armed CQ costs the provider a channel write and
        // this task a wake-up per completion (one per command on the software RNIC).
        loop {
            match drain_both(ep, recv_cq, &mut wcs) {
                Ok(0) => break,
                Ok(_) => tokio::task::yield_now().await,
                Err(why) => return why,
            }
        }
        // Quiet: arm, then poll, so a completion landing between the two still wakes us.
        recv_cq.req_notify(false);
        if ep.send_watchers.load(Ordering::SeqCst) > 0 {
            ep.send_cq.req_notify(false);
        }
        match drain_both(ep, recv_cq, &mut wcs) {
            Ok(0) => {}
            Ok(_) => continue,
            Err(why) => return why,
        }
        tokio::select! {
            ready = afd.readable() => match ready {
                Ok(mut guard) => {
                    guard.clear_ready();
                    let _ = channel.get_events(Some(std::time::Duration::ZERO));
                }
                Err(e) => return ConnEnd::Failed(format!("completion channel: {e}")),
            },
            _ = ep.poll_now.notified() => {}
        }
    }
}

/// Drains the send CQ, then the receive CQ; returns how many completions there were.
fn drain_both<P: Device>(
    ep: &Endpoint<P>,
    recv_cq: &P::Cq,
    wcs: &mut [Wc],
) -> Result<usize, ConnEnd> {
    Ok(drain(ep, &ep.send_cq, wcs)? + drain(ep, recv_cq, wcs)?)
}

/// Polls `cq` until it is empty: a provider may hand over fewer than asked for while more
/// wait (the verbs provider gave 16 of 32), and what is left would only surface with the
/// next completion's event (writes stalled for seconds on rdma-core before this).
fn drain<P: Device>(ep: &Endpoint<P>, cq: &P::Cq, wcs: &mut [Wc]) -> Result<usize, ConnEnd> {
    let mut total = 0;
    loop {
        let n = cq.poll(wcs);
        if n == 0 {
            return Ok(total);
        }
        total += n;
        for wc in &wcs[..n] {
            dispatch(ep, wc)?;
        }
    }
}

fn dispatch<P: Device>(ep: &Endpoint<P>, wc: &Wc) -> Result<(), ConnEnd> {
    if wc.opcode == WcOpcode::Recv && wc.wr_id < TICKET_BASE {
        if wc.status != WcStatus::Success {
            return Err(connection_error(wc.status));
        }
        let bytes = ep.take_recv(wc.wr_id as u32, wc.byte_len)?;
        return ep.deliver(Ok(Inbound {
            bytes,
            invalidated: wc.invalidated_rkey,
        }));
    }
    ep.finish(wc.wr_id, wc.status);
    if wc.status != WcStatus::Success {
        return Err(connection_error(wc.status));
    }
    Ok(())
}

fn connection_error(status: WcStatus) -> ConnEnd {
    match status {
        WcStatus::Flushed | WcStatus::RemoteOperation => ConnEnd::Closed,
        other => ConnEnd::Failed(format!("RDMA operation failed: {other:?}")),
    }
}

/// Closes the connection when a login-phase channel, the target's or the initiator's, is
/// dropped before full feature phase (a failed login, a non-Login PDU, a malformed Send). The
/// completion task holds the endpoint too, so without this the queue pair, its registered
/// buffers and the task outlived a failed login and the peer never heard that the connection
/// had ended (found by tests/iser_bad_input.rs in iscsi-target, and for the initiator by
/// iser_bad_target.rs in iscsi-initiator; iSCSI/TCP closes by dropping its socket).
pub(crate) struct CloseUnlessKept<P: Device> {
    ep: Option<Arc<Endpoint<P>>>,
    /// The target sent a Login Response refusing the login: the initiator closes too (RFC
    /// 7143 11.13.5), and gets [`REFUSED_LOGIN_GRACE`] to go first.
    pub(crate) refused: bool,
}

/// How long an initiator whose login was refused may take to close its end before this end
/// closes. Closing first races with what the initiator still has on its queue: Linux siw
/// completes the Send it is finishing with a local QP operation error and reports a fatal QP
/// error (kernel-peer kinit-iser, a wrong CHAP secret, on a loaded host).
const REFUSED_LOGIN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl<P: Device> CloseUnlessKept<P> {
    pub(crate) fn new(ep: Arc<Endpoint<P>>) -> Self {
        CloseUnlessKept {
            ep: Some(ep),
            refused: false,
        }
    }

    /// Full feature phase owns the connection from now on.
    pub(crate) fn keep(mut self) {
        self.ep = None;
    }
}

impl<P: Device> Drop for CloseUnlessKept<P> {
    fn drop(&mut self) {
        let Some(ep) = self.ep.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(_) if self.refused => {
                let closing = ep.clone();
                ep.close_after_peer_or(REFUSED_LOGIN_GRACE, move || closing.close());
            }
            _ => ep.close(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_wire::{Bhs, NopOut};
    use rdma::{ConnParams, ConnectRequest, Listener};
    use rnic::Rnic;
    use std::time::Duration;

    /// Two endpoints on one software RNIC, connected over loopback, their completion tasks
    /// running: (a, b, what b receives).
    async fn pair(
        a_sends: u32,
        b_recvs: u32,
    ) -> (Arc<Endpoint<Rnic>>, Arc<Endpoint<Rnic>>, Received) {
        let dev = Arc::new(Rnic::new().unwrap());
        let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let buffers = |recv_slots, send_slots| Buffers {
            recv_slots,
            recv_len: 1024,
            send_slots,
            send_len: 1024,
        };
        let (a, _, a_poller) = Endpoint::create(dev.clone(), buffers(16, a_sends)).unwrap();
        let (b, b_received, b_poller) = Endpoint::create(dev, buffers(b_recvs, 16)).unwrap();
        let params = ConnParams {
            first_fpdu_delay: Duration::ZERO,
            ..ConnParams::default()
        };
        let b2 = b.clone();
        let p2 = params.clone();
        let accepted = tokio::task::spawn_blocking(move || {
            let req = listener
                .get_request(Duration::from_secs(5))
                .unwrap()
                .unwrap();
            req.accept(b2.qp(), &p2).unwrap();
        });
        let a2 = a.clone();
        tokio::task::spawn_blocking(move || a2.qp().connect(addr, &params).unwrap())
            .await
            .unwrap();
        accepted.await.unwrap();
        a_poller.start();
        b_poller.start();
        (a, b, b_received)
    }

    fn nop(itt: u32) -> Pdu {
        Pdu::new(
            Bhs::NopOut(NopOut {
                itt,
                ..Default::default()
            }),
            Bytes::new(),
        )
    }

    /// Sends a NOP-Out for each ITT, all within 10 s.
    async fn send_nops(ep: &Endpoint<Rnic>, itts: std::ops::Range<u32>) {
        let sending = async {
            for itt in itts {
                ep.send(&IserHeader::CONTROL, &nop(itt), SendOp::Send)
                    .await
                    .unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(10), sending)
            .await
            .expect("the Sends posted within 10 s");
    }

    /// Nothing arms the send CQ for a Send's completion; a sender out of buffers must get
    /// it armed (and polled) itself, or it would wait for a receive that never comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sender_out_of_buffers_is_woken_when_a_send_completes() {
        const SENDS: u32 = 200;
        let (a, _b, mut received) = pair(2, SENDS + 8).await;
        send_nops(&a, 0..SENDS).await;
        for itt in 0..SENDS {
            let got = tokio::time::timeout(Duration::from_secs(10), received.recv())
                .await
                .expect("a Send within 10 s")
                .unwrap()
                .unwrap();
            let send = iser::parse_send(&got.bytes, 8192).unwrap();
            assert_eq!(send.pdu.bhs.itt(), itt);
        }
    }

    /// A peer that keeps sending while nothing takes its Sends from the login channel (the
    /// receives are posted again at once, so its RNIC never runs out): the channel holds as
    /// many as there are receives, the next one ends the connection instead of being queued,
    /// and the end follows what was held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_overrunning_the_receive_credit_loses_the_connection() {
        const CREDIT: u32 = 8;
        let overruns = crate::credit::overruns();
        let (a, b, mut received) = pair(16, CREDIT).await;
        assert_eq!(b.recv_credit(), CREDIT as usize);
        let flooding = async {
            for itt in 0..3 * CREDIT {
                // Paced so each Send finds a receive posted again: the credit, not the RNIC,
                // is what stops this peer.
                if a.send(&IserHeader::CONTROL, &nop(itt), SendOp::Send)
                    .await
                    .is_err()
                {
                    return itt;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            3 * CREDIT
        };
        let sent = tokio::time::timeout(Duration::from_secs(10), flooding)
            .await
            .expect("the flood ends within 10 s");
        tokio::time::timeout(Duration::from_secs(10), b.when_ended())
            .await
            .expect("the overrun connection ends within 10 s");
        let mut held = Vec::new();
        let end = loop {
            match received.try_recv() {
                Ok(Ok(inbound)) => held.push(
                    iser::parse_send(&inbound.bytes, 8192)
                        .unwrap()
                        .pdu
                        .bhs
                        .itt(),
                ),
                Ok(Err(end)) => break end,
                Err(e) => panic!("the end after {held:?}, not {e:?}"),
            }
        };
        assert_eq!(held, (0..CREDIT).collect::<Vec<u32>>());
        let ConnEnd::Failed(why) = end else {
            panic!("ended as an overrun, not {end:?}")
        };
        assert!(why.contains("8 receives posted"), "{why}");
        assert!(crate::credit::overruns() > overruns);
        assert!(sent > CREDIT, "the peer got {sent} Sends out");
    }

    /// Received Sends go to the handler in order: first those the login channel already
    /// holds, then those polled after the switch; the end of the connection comes last.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_takes_over_from_the_channel_in_order() {
        let (a, b, received) = pair(16, 64).await;
        send_nops(&a, 0..10).await;
        // Let some arrive in the channel before the handler is installed.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        b.deliver_to(
            received,
            Box::new(move |item| {
                let _ =
                    tx.send(item.map(|i| iser::parse_send(&i.bytes, 8192).unwrap().pdu.bhs.itt()));
                true
            }),
        );
        send_nops(&a, 10..20).await;
        a.close();
        let mut got = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(Ok(itt))) => got.push(itt),
                Ok(Some(Err(end))) => {
                    assert_eq!(end, ConnEnd::Closed);
                    break;
                }
                other => panic!("the handler saw {other:?} after {got:?}"),
            }
        }
        assert_eq!(got, (0..20).collect::<Vec<u32>>());
    }
}
