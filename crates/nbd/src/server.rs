//! The tokio driver: accepts clients on TCP or a Unix socket, runs each one's handshake
//! through [`Handshake`] and its requests through [`Transmission`], and carries them out on
//! the [`Lun`] with many in flight per client (replies go out as they complete, matched to
//! their requests by handle). A client that breaks the protocol loses its connection with
//! one log line; the others carry on.
//!
//! What a client can make the server hold is bounded: each request takes one of the
//! client's `in_flight` slots from its parsing until its reply is written to the socket, so
//! a client that does not read its replies stops being read from; a refused write's payload
//! is skipped, not buffered; the handshake, an idle connection and a write that makes no
//! progress are each cut after their [`Timeouts`]. The listeners serve at most
//! `max_clients` clients at once ([`Server::with_max_clients`]); one more is refused in the
//! handshake (`NBD_REP_ERR_POLICY`, saying why), and past [`REFUSALS_AT_ONCE`] refusals
//! under way it is closed as soon as it is accepted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::proto::{
    BlockSizes, Command, Export, Handshake, Progress, Reply, Request, Transmission,
};
use lun_io::{IoError, Lun};

/// A client must choose an export within this time (the default of [`Timeouts::handshake`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Clients served at once unless [`Server::with_max_clients`] says otherwise.
pub const DEFAULT_MAX_CLIENTS: usize = 64;
/// Clients over the limit being told so in a handshake at once; more are closed unanswered,
/// so a flood of connections costs a bounded number of tasks.
pub const REFUSALS_AT_ONCE: usize = 16;
/// How long a refused client may take to hear why and go (at most the handshake timeout).
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest READ/WRITE payload of one request (the protocol's customary 32 MiB).
pub const MAX_REQUEST: u32 = 32 << 20;
/// Replies are gathered into one socket write up to this many bytes; read data larger
/// than [`COPY_LIMIT`] is written from where it lies instead of being copied.
const GATHER: usize = 256 << 10;
const COPY_LIMIT: usize = 64 << 10;

/// How long the server waits on a client before it closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From the greeting to the export chosen, sends included.
    pub handshake: Duration,
    /// In the transmission phase: how long a client may send nothing while none of its
    /// requests is outstanding (`None`: forever). It is checked every `idle`, so a client
    /// whose last request was answered just after a check is closed up to `2 × idle`
    /// after it; a client with a request outstanding is never idle.
    pub idle: Option<Duration>,
    /// How long a reply's write may make no progress (the client does not read) before
    /// the client is dropped.
    pub write_stall: Duration,
}

impl Default for Timeouts {
    /// 30 s for the handshake, an hour idle, a minute of writes without progress.
    fn default() -> Timeouts {
        Timeouts {
            handshake: HANDSHAKE_TIMEOUT,
            idle: Some(Duration::from_secs(3600)),
            write_stall: Duration::from_secs(60),
        }
    }
}

/// Bytes of read data the server holds for its replies (all clients): from the LUN's
/// answer until the reply is written to the client's socket (or dropped with its
/// connection). A client that sends reads and never reads the replies holds at most its
/// `in_flight` replies' worth.
#[derive(Debug, Default)]
pub struct ReplyBytes {
    now: AtomicU64,
    peak: AtomicU64,
}

impl ReplyBytes {
    /// Bytes held now.
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// The most held at once since the server started.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn hold(self: &Arc<Self>, n: u64) -> Held {
        let now = self.now.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Held {
            bytes: self.clone(),
            n,
        }
    }
}

/// `n` bytes counted in a [`ReplyBytes`] until dropped.
struct Held {
    bytes: Arc<ReplyBytes>,
    n: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.bytes.now.fetch_sub(self.n, Ordering::Relaxed);
    }
}

/// A reply on its way to the socket, with the request slot it occupies: the slot (and
/// the read data, counted in [`ReplyBytes`]) are let go only when the reply is written.
struct Queued {
    reply: Reply,
    _slot: OwnedSemaphorePermit,
    _held: Option<Held>,
}

/// The NBD server of one LUN.
pub struct Server {
    lun: Arc<Lun>,
    export: Export,
    in_flight: usize,
    timeouts: Timeouts,
    clients: AtomicU64,
    reply_bytes: Arc<ReplyBytes>,
    max_clients: usize,
    /// One permit per client the listeners serve at once.
    client_slots: Arc<Semaphore>,
    /// One permit per refusal handshake under way.
    refusal_slots: Arc<Semaphore>,
}

impl Server {
    /// Exports `lun` as `name` (clients may also ask for the default, empty name), with
    /// up to `in_flight` requests of each client carried out or answered at once, and the
    /// default [`Timeouts`].
    pub fn new(lun: Arc<Lun>, name: String, description: String, in_flight: usize) -> Server {
        let geo = lun.geometry();
        let export = Export {
            name,
            description,
            size: lun.size(),
            read_only: geo.write_protected,
            block_sizes: BlockSizes {
                minimum: 1,
                preferred: geo.block_size.max(4096).next_power_of_two(),
                maximum: MAX_REQUEST,
            },
        };
        Server {
            lun,
            export,
            in_flight: in_flight.max(1),
            timeouts: Timeouts::default(),
            clients: AtomicU64::new(0),
            reply_bytes: Arc::default(),
            max_clients: DEFAULT_MAX_CLIENTS,
            client_slots: Arc::new(Semaphore::new(DEFAULT_MAX_CLIENTS)),
            refusal_slots: Arc::new(Semaphore::new(REFUSALS_AT_ONCE)),
        }
    }

    /// The same server serving at most `max_clients` (at least 1) clients at once through
    /// [`Server::serve_tcp`] and [`Server::serve_unix`].
    pub fn with_max_clients(self, max_clients: usize) -> Server {
        let max_clients = max_clients.max(1);
        Server {
            max_clients,
            client_slots: Arc::new(Semaphore::new(max_clients)),
            ..self
        }
    }

    pub fn max_clients(&self) -> usize {
        self.max_clients
    }

    /// The same server with `timeouts`.
    pub fn with_timeouts(self, timeouts: Timeouts) -> Server {
        Server { timeouts, ..self }
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Read data held for replies not yet written, over all clients.
    pub fn reply_bytes(&self) -> &ReplyBytes {
        &self.reply_bytes
    }

    pub fn export(&self) -> &Export {
        &self.export
    }

    pub fn lun(&self) -> &Arc<Lun> {
        &self.lun
    }

    /// Serves every client `listener` accepts until the future is dropped (which ends
    /// the clients' connections too).
    pub async fn serve_tcp(self: Arc<Self>, listener: tokio::net::TcpListener) {
        let mut clients = JoinSet::new();
        loop {
            tokio::select! {
                a = listener.accept() => match a {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        self.admit(stream, peer.to_string(), &mut clients);
                    }
                    Err(e) => {
                        tracing::warn!("nbd: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = clients.join_next(), if !clients.is_empty() => {}
            }
        }
    }

    /// As [`Server::serve_tcp`], on a Unix socket.
    pub async fn serve_unix(self: Arc<Self>, listener: tokio::net::UnixListener) {
        let mut clients = JoinSet::new();
        loop {
            tokio::select! {
                a = listener.accept() => match a {
                    Ok((stream, _)) => {
                        let n = self.clients.load(Ordering::Relaxed) + 1;
                        self.admit(stream, format!("unix#{n}"), &mut clients);
                    }
                    Err(e) => {
                        tracing::warn!("nbd: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = clients.join_next(), if !clients.is_empty() => {}
            }
        }
    }

    /// Serves a client just accepted, or refuses it when `max_clients` are served already.
    fn admit<S>(self: &Arc<Self>, stream: S, peer: String, clients: &mut JoinSet<()>)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let s = self.clone();
        if let Ok(slot) = self.client_slots.clone().try_acquire_owned() {
            clients.spawn(async move {
                s.serve_client(stream, peer).await;
                drop(slot);
            });
        } else if let Ok(slot) = self.refusal_slots.clone().try_acquire_owned() {
            clients.spawn(async move {
                s.refuse_client(stream, peer).await;
                drop(slot);
            });
        } else {
            tracing::warn!(
                "nbd client ({peer}) refused: {} clients served and {REFUSALS_AT_ONCE} refusals under way; connection closed",
                self.max_clients
            );
        }
    }

    /// A client over `max_clients`: a handshake that answers every option with the reason,
    /// so that qemu, libnbd and nbd-client report it, instead of a connection closed before
    /// the greeting that they report as a broken server. One log line.
    async fn refuse_client<S>(self: Arc<Self>, stream: S, peer: String)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let max = self.max_clients;
        tracing::warn!("nbd client ({peer}) refused: {max} clients served already (the limit)");
        let reason = format!("too many clients: this server serves at most {max} at once");
        let hs = Handshake::new(self.export.clone()).refusing(reason);
        let (mut rd, mut wr) = tokio::io::split(stream);
        let limit = REFUSAL_TIMEOUT.min(self.timeouts.handshake);
        // However the client ends it (abort, close, silence, nonsense), it is gone; its
        // one line is the one above.
        let _ = tokio::time::timeout(limit, handshake(hs, &mut rd, &mut wr)).await;
    }

    /// One client, from greeting to close. Ends with one log line saying why. (The listeners
    /// count it against `max_clients`; called directly, it counts against nothing.)
    pub async fn serve_client<S>(self: Arc<Self>, stream: S, peer: String)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let n = self.clients.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!("nbd client {n} ({peer}) connected");
        match self.client(stream).await {
            Ok(End::Disconnect) => tracing::debug!("nbd client {n} ({peer}) disconnected"),
            Ok(End::Abort) => tracing::debug!("nbd client {n} ({peer}) ended the handshake"),
            Ok(End::Refused) => tracing::debug!("nbd client {n} ({peer}) was refused"),
            Ok(End::Closed) => {
                tracing::debug!("nbd client {n} ({peer}) closed the connection")
            }
            Err(why) => tracing::warn!("nbd client {n} ({peer}): {why}; connection closed"),
        }
    }

    async fn client<S>(&self, stream: S) -> Result<End, String>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let limit = self.timeouts.handshake;
        // The deadline covers the sends too: a client that does not read its option
        // replies cannot hold the handshake open either.
        let hs = Handshake::new(self.export.clone());
        let hs = tokio::time::timeout(limit, handshake(hs, &mut rd, &mut wr))
            .await
            .map_err(|_| format!("no export chosen within {limit:?}"))??;
        let (t, leftover) = match hs {
            Ok(go) => go,
            Err(end) => return Ok(end),
        };
        self.transmission(rd, wr, Arc::new(t), leftover).await
    }

    async fn transmission<R, W>(
        &self,
        mut rd: R,
        wr: W,
        t: Arc<Transmission>,
        mut input: BytesMut,
    ) -> Result<End, String>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        // Every request, refused or carried out, takes a slot until its reply is written,
        // so the channel never holds more than `in_flight` replies and a client that does
        // not read stops being read from once its slots are taken.
        let (tx, rx) = mpsc::channel::<Queued>(self.in_flight);
        let writer = tokio::spawn(send_replies(wr, rx, t.clone(), self.timeouts.write_stall));
        let slots = Arc::new(Semaphore::new(self.in_flight));
        let outstanding = || slots.available_permits() < self.in_flight;
        let mut running = JoinSet::new();
        // Payload bytes of a refused write still to be skipped.
        let mut discard = 0u64;
        let result = loop {
            let skip = discard.min(input.len() as u64);
            input.advance(skip as usize);
            discard -= skip;
            let parsed = if discard > 0 {
                Ok(None)
            } else {
                t.parse(&mut input)
            };
            let req = match parsed {
                Err(e) => break Err(Some(e.to_string())),
                Ok(Some(req)) => req,
                Ok(None) => {
                    while running.try_join_next().is_some() {}
                    let want = if discard > 0 { 0 } else { t.missing(&input) };
                    input.reserve(want.max(64 << 10));
                    let idle = async {
                        match self.timeouts.idle {
                            Some(d) => tokio::time::sleep(d).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        r = rd.read_buf(&mut input) => match r {
                            Ok(0) if input.is_empty() && discard == 0 => break Ok(End::Closed),
                            Ok(0) => {
                                break Err(Some(format!(
                                    "the client vanished in the middle of a request ({} bytes of it received)",
                                    input.len()
                                )))
                            }
                            Ok(_) => continue,
                            Err(e) => break Err(Some(format!("reading requests: {e}"))),
                        },
                        _ = tx.closed() => break Err(None),
                        _ = idle => {
                            if outstanding() {
                                continue;
                            }
                            break Err(Some(format!(
                                "idle for {:?}",
                                self.timeouts.idle.unwrap_or_default()
                            )));
                        }
                    }
                }
            };
            discard = u64::from(req.discard);
            if let Ok(Command::Disconnect) = req.command {
                break Ok(End::Disconnect);
            }
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => match s {
                    Ok(s) => s,
                    Err(_) => break Err(Some("request slots closed".into())),
                },
                _ = tx.closed() => break Err(None),
            };
            let command = match &req.command {
                Err(refusal) => {
                    tracing::debug!("nbd request {:#x} refused: {}", req.handle, refusal.message);
                    let q = Queued {
                        reply: Reply::refused(&req, refusal),
                        _slot: slot,
                        _held: None,
                    };
                    // Never waits: the channel has room for every slot.
                    let _ = tx.send(q).await;
                    continue;
                }
                Ok(c) => c.clone(),
            };
            let lun = self.lun.clone();
            let tx = tx.clone();
            let reply_bytes = self.reply_bytes.clone();
            running.spawn(async move {
                let reply = execute(&lun, &req, command).await;
                let held = match &reply {
                    Reply::Data { data, .. } => Some(reply_bytes.hold(data.len() as u64)),
                    _ => None,
                };
                let q = Queued {
                    reply,
                    _slot: slot,
                    _held: held,
                };
                // Dropped (slot and bytes with it) if the writer has ended.
                let _ = tx.send(q).await;
            });
        };
        // Whatever the reason, the requests already taken are finished (a write the target
        // acknowledged is on the LUN) and their replies go out before the connection closes
        // (or the writer gives up on a client that does not read them).
        while running.join_next().await.is_some() {}
        drop(tx);
        let sent = writer
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        // `Err(None)`: the reply writer ended first, and its error is why.
        match (result, sent) {
            (Err(None) | Ok(_), Err(e)) => Err(format!("sending replies: {e}")),
            (Err(None), Ok(())) => Err("the reply writer ended".into()),
            (Err(Some(why)), _) => Err(why),
            (Ok(end), Ok(())) => Ok(end),
        }
    }
}

/// The handshake on `rd`/`wr`: the transmission phase and the bytes past the handshake,
/// or how the client ended it (abort, close).
async fn handshake<R, W>(
    mut hs: Handshake,
    rd: &mut R,
    wr: &mut W,
) -> Result<Result<(Transmission, BytesMut), End>, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 4096];
    loop {
        let out = hs.take_output();
        if !out.is_empty() {
            wr.write_all(&out)
                .await
                .map_err(|e| format!("sending during the handshake: {e}"))?;
        }
        let n = match rd.read(&mut buf).await {
            Err(e) => return Err(format!("reading during the handshake: {e}")),
            Ok(0) => return Ok(Err(End::Closed)),
            Ok(n) => n,
        };
        match hs.receive(&buf[..n]).map_err(|e| e.to_string())? {
            Progress::NeedMore => {}
            Progress::Abort => {
                let out = hs.take_output();
                let _ = wr.write_all(&out).await;
                let _ = wr.shutdown().await;
                return Ok(Err(End::Abort));
            }
            Progress::Refused => {
                let _ = wr.shutdown().await;
                return Ok(Err(End::Refused));
            }
            Progress::Transmission => {
                let out = hs.take_output();
                wr.write_all(&out)
                    .await
                    .map_err(|e| format!("sending the export's details: {e}"))?;
                return Ok(Ok(hs.finish()));
            }
        }
    }
}

enum End {
    /// NBD_CMD_DISC.
    Disconnect,
    /// NBD_OPT_ABORT.
    Abort,
    /// NBD_OPT_EXPORT_NAME in a refusing handshake.
    Refused,
    /// The client closed between messages.
    Closed,
}

async fn execute(lun: &Lun, req: &Request, command: Command) -> Reply {
    let handle = req.handle;
    let done = |r: Result<(), IoError>| match r {
        Ok(()) => Reply::Done {
            handle,
            read: false,
        },
        Err(e) => failed(req, e),
    };
    match command {
        Command::Read { offset, length } => match lun.read(offset, length).await {
            Ok(data) if data.is_empty() => Reply::Done { handle, read: true },
            Ok(data) => Reply::Data {
                handle,
                offset,
                data,
            },
            Err(e) => failed(req, e),
        },
        Command::Write { offset, data, fua } => done(lun.write(offset, data, fua).await),
        Command::Flush => done(lun.flush().await),
        Command::Trim {
            offset,
            length,
            fua,
        } => done(lun.trim(offset, length, fua).await),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            ..
        } => done(lun.write_zeroes(offset, length, fua).await),
        Command::Disconnect => Reply::Done {
            handle,
            read: false,
        },
    }
}

fn failed(req: &Request, e: IoError) -> Reply {
    tracing::warn!("nbd request {:#x}: {e}", req.handle);
    Reply::Error {
        handle: req.handle,
        read: req.is_read(),
        errno: e.errno,
        message: e.message,
    }
}

/// Sends replies as they come, several per socket write when they queue up. A reply's
/// slot and data are let go once it is written. Fails when a write makes no progress for
/// `stall` (the client does not read), which drops every reply still queued.
async fn send_replies<W>(
    mut wr: W,
    mut rx: mpsc::Receiver<Queued>,
    t: Arc<Transmission>,
    stall: Duration,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = Vec::with_capacity(GATHER);
    let mut written = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(q) = next {
            let (header, data) = t.encode(&q.reply);
            out.extend_from_slice(&header);
            if data.len() <= COPY_LIMIT {
                out.extend_from_slice(&data);
            } else {
                write_progressing(&mut wr, &out, stall).await?;
                out.clear();
                write_progressing(&mut wr, &data, stall).await?;
            }
            written.push(q);
            next = if out.len() < GATHER {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        write_progressing(&mut wr, &out, stall).await?;
        out.clear();
        written.clear();
    }
    tokio::time::timeout(stall, wr.shutdown())
        .await
        .unwrap_or(Ok(()))
}

/// `write_all`, failing when one write accepts nothing for `stall`.
async fn write_progressing<W>(wr: &mut W, mut buf: &[u8], stall: Duration) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    while !buf.is_empty() {
        match tokio::time::timeout(stall, wr.write(buf)).await {
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the client read nothing for {stall:?}"),
                ))
            }
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(e)) => return Err(e),
        }
    }
    Ok(())
}
