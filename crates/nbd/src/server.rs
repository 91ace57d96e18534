//! The tokio driver: accepts clients on TCP or a Unix socket, runs each one's handshake
//! through [`Handshake`] and its requests through [`Transmission`], and carries them out on
//! the [`Lun`] with many in flight per client (replies go out as they complete, matched to
//! their requests by handle). A client that breaks the protocol loses its connection with
//! one log line; the others carry on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::proto::{
    BlockSizes, Command, Export, Handshake, Progress, Reply, Request, Transmission,
};
use lun_io::{IoError, Lun};

/// A client must choose an export within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest READ/WRITE payload of one request (the protocol's customary 32 MiB).
pub const MAX_REQUEST: u32 = 32 << 20;

/// The NBD server of one LUN.
pub struct Server {
    lun: Arc<Lun>,
    export: Export,
    in_flight: usize,
    clients: AtomicU64,
}

impl Server {
    /// Exports `lun` as `name` (clients may also ask for the default, empty name), with
    /// up to `in_flight` requests of each client carried out at once.
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
            clients: AtomicU64::new(0),
        }
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
                        let s = self.clone();
                        clients.spawn(async move { s.serve_client(stream, peer.to_string()).await });
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
                        let s = self.clone();
                        let n = self.clients.load(Ordering::Relaxed) + 1;
                        clients.spawn(async move { s.serve_client(stream, format!("unix#{n}")).await });
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

    /// One client, from greeting to close. Ends with one log line saying why.
    pub async fn serve_client<S>(self: Arc<Self>, stream: S, peer: String)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let n = self.clients.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!("nbd client {n} ({peer}) connected");
        match self.client(stream).await {
            Ok(End::Disconnect) => tracing::debug!("nbd client {n} ({peer}) disconnected"),
            Ok(End::Abort) => tracing::debug!("nbd client {n} ({peer}) ended the handshake"),
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
        let mut hs = Handshake::new(self.export.clone());
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
        loop {
            let out = hs.take_output();
            if !out.is_empty() {
                wr.write_all(&out)
                    .await
                    .map_err(|e| format!("sending during the handshake: {e}"))?;
            }
            let n = match tokio::time::timeout_at(deadline, rd.read(&mut buf)).await {
                Err(_) => {
                    return Err(format!(
                        "no export chosen within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ))
                }
                Ok(Err(e)) => return Err(format!("reading during the handshake: {e}")),
                Ok(Ok(0)) => return Ok(End::Closed),
                Ok(Ok(n)) => n,
            };
            match hs.receive(&buf[..n]).map_err(|e| e.to_string())? {
                Progress::NeedMore => {}
                Progress::Abort => {
                    let out = hs.take_output();
                    let _ = wr.write_all(&out).await;
                    let _ = wr.shutdown().await;
                    return Ok(End::Abort);
                }
                Progress::Transmission => {
                    let out = hs.take_output();
                    wr.write_all(&out)
                        .await
                        .map_err(|e| format!("sending the export's details: {e}"))?;
                    break;
                }
            }
        }
        let (t, leftover) = hs.finish();
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
        let (tx, rx) = mpsc::unbounded_channel::<Reply>();
        let writer = tokio::spawn(send_replies(wr, rx, t.clone()));
        let permits = Arc::new(Semaphore::new(self.in_flight));
        let mut running = JoinSet::new();
        let result = loop {
            let req = match t.parse(&mut input) {
                Err(e) => break Err(e.to_string()),
                Ok(Some(req)) => req,
                Ok(None) => {
                    while running.try_join_next().is_some() {}
                    input.reserve(t.missing(&input).max(64 << 10));
                    match rd.read_buf(&mut input).await {
                        Ok(0) if input.is_empty() => break Ok(End::Closed),
                        Ok(0) => {
                            break Err(format!(
                                "the client vanished in the middle of a request ({} bytes of it received)",
                                input.len()
                            ))
                        }
                        Ok(_) => continue,
                        Err(e) => break Err(format!("reading requests: {e}")),
                    }
                }
            };
            let command = match &req.command {
                Err(refusal) => {
                    tracing::debug!("nbd request {:#x} refused: {}", req.handle, refusal.message);
                    let _ = tx.send(Reply::refused(&req, refusal));
                    continue;
                }
                Ok(Command::Disconnect) => break Ok(End::Disconnect),
                Ok(c) => c.clone(),
            };
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break Err("request slots closed".into());
            };
            let lun = self.lun.clone();
            let tx = tx.clone();
            running.spawn(async move {
                let reply = execute(&lun, &req, command).await;
                let _ = tx.send(reply);
                drop(permit);
            });
        };
        // Whatever the reason, the requests already taken are finished (a write the target
        // acknowledged is on the LUN) and their replies go out before the connection closes.
        while running.join_next().await.is_some() {}
        drop(tx);
        match writer.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if result.is_ok() => return Err(format!("sending replies: {e}")),
            _ => {}
        }
        result
    }
}

enum End {
    /// NBD_CMD_DISC.
    Disconnect,
    /// NBD_OPT_ABORT.
    Abort,
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

/// Sends replies as they come, several per write when they queue up.
async fn send_replies<W>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    t: Arc<Transmission>,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut w = BufWriter::with_capacity(256 << 10, wr);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(r) = next {
            let (header, data) = t.encode(&r);
            w.write_all(&header).await?;
            if !data.is_empty() {
                w.write_all(&data).await?;
            }
            next = rx.try_recv().ok();
        }
        w.flush().await?;
    }
    w.shutdown().await
}
