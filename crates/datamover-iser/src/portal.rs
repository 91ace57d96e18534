//! An iSER portal on the software iWARP RNIC, optionally sharing its address and port with
//! iSCSI/TCP. It accepts TCP connections itself and tells the protocols apart by the first
//! bytes: an MPA Request begins with the key "MPA ID Req Frame", a Login PDU with its opcode.
//! (Linux cannot do this: LIO's iSER and TCP listeners collide on one address and port.) Each
//! connection is sorted, and its MPA Request read and accepted, in a task of its own, so a
//! client that stalls delays no other login. Bound with a [`Reactor`]
//! ([`IserPortal::bind_on`]), the portal sets up each iWARP connection on the reactor's
//! thread, where the RNIC's engine runs, and asks that the connection run there
//! ([`LoginChannel::runtime`]); iSCSI/TCP connections stay on the caller's runtime.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datamover::{LoginChannel, Portal, TcpLoginChannels, TransportKind};
use pcap_trace::PduTrace;
use rnic::Rnic;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};

use crate::rnic_task::Reactor;
use crate::target::{accept, AcceptConfig};
use crate::target_device::TargetDevice;

/// The first bytes of an MPA Request (RFC 5044 §7.1).
const MPA_REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// How long a new connection may take to show what it speaks and, for iWARP, to send its
/// whole MPA Request (siw waits as long). Every connection is sorted in a task of its own,
/// so any number of them stall side by side, each for at most this long.
const SORT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a sorted connection turned out to be.
enum Arrival {
    Iser(Box<dyn LoginChannel>),
    Tcp(TcpStream),
}

/// An iSER portal on the software RNIC (and iSCSI/TCP on the same port when asked).
pub struct IserPortal {
    local: SocketAddr,
    /// What serves the iSCSI/TCP connections that arrive on the port, when it is shared.
    tcp: Option<TcpLoginChannels>,
    arrivals: Mutex<mpsc::Receiver<Arrival>>,
    /// Held so that the reactor its connections run on lives as long as the portal.
    _reactor: Option<Arc<Reactor>>,
}

impl IserPortal {
    /// Listens on `addr` for iSER over the software RNIC `dev`; given `tcp`, iSCSI/TCP
    /// logins on the same port are served too, through the login channels it makes.
    pub async fn bind(
        addr: SocketAddr,
        dev: Arc<TargetDevice<Rnic>>,
        cfg: AcceptConfig,
        tcp: Option<TcpLoginChannels>,
    ) -> io::Result<IserPortal> {
        Self::bind_on(addr, dev, None, cfg, tcp).await
    }

    /// [`IserPortal::bind`] for an RNIC driven on `reactor` when given (see
    /// [`Reactor::start`]): iSER connections are then set up, log in and run on the reactor's
    /// thread; without one, on the caller's runtime.
    pub async fn bind_on(
        addr: SocketAddr,
        dev: Arc<TargetDevice<Rnic>>,
        reactor: Option<Arc<Reactor>>,
        cfg: AcceptConfig,
        tcp: Option<TcpLoginChannels>,
    ) -> io::Result<IserPortal> {
        let also_tcp = tcp.is_some();
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let on = reactor.as_ref().map(|r| r.handle().clone());
        tokio::spawn(accept_loop(listener, dev, on, cfg, also_tcp, tx));
        Ok(IserPortal {
            local,
            tcp,
            arrivals: Mutex::new(rx),
            _reactor: reactor,
        })
    }
}

#[async_trait]
impl Portal for IserPortal {
    fn kind(&self) -> TransportKind {
        TransportKind::Iser
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn describe(&self) -> String {
        if self.tcp.is_some() {
            "iSCSI/TCP and iSER (software iWARP RNIC)".into()
        } else {
            "iSER (software iWARP RNIC)".into()
        }
    }

    async fn accept(&self, trace: Option<&PduTrace>) -> io::Result<Box<dyn LoginChannel>> {
        let mut arrivals = self.arrivals.lock().await;
        match arrivals.recv().await {
            Some(Arrival::Iser(login)) => Ok(login),
            Some(Arrival::Tcp(stream)) => match &self.tcp {
                Some(channels) => channels(stream, trace),
                None => Err(io::Error::other("iSCSI/TCP on an iSER-only portal")),
            },
            None => Err(io::Error::other(format!(
                "the iSER portal on {}{} stopped",
                self.local,
                if self.tcp.is_some() {
                    " (and iSCSI/TCP)"
                } else {
                    ""
                }
            ))),
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    dev: Arc<TargetDevice<Rnic>>,
    reactor: Option<tokio::runtime::Handle>,
    cfg: AcceptConfig,
    also_tcp: bool,
    tx: mpsc::Sender<Arrival>,
) {
    let sorting = datamover::admission::Admission::new(cfg.max_sorting);
    loop {
        // The portal dropped (removed from its target): the listener closes now, not at the
        // next connection.
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = tx.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait a little, the listener stays.
                tracing::warn!("iSER portal accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if tx.is_closed() {
            return;
        }
        let (dev, reactor, arrivals) = (dev.clone(), reactor.clone(), tx.clone());
        let mut admitted = sorting.admit();
        tokio::spawn(async move {
            let sorted = tokio::select! {
                r = sort(stream, peer, dev, reactor, cfg, also_tcp) => r,
                _ = admitted.evicted() => Err(format!(
                    "the longest waiting of {} being sorted (max_pending_logins)",
                    cfg.max_sorting
                )),
            };
            drop(admitted);
            match sorted {
                Ok(arrival) => {
                    let _ = arrivals.send(arrival).await;
                }
                Err(why) => tracing::info!(%peer, "connection dropped: {why}"),
            }
        });
    }
}

/// Reads enough of a new connection to tell iWARP from iSCSI/TCP, then sets it up. The first
/// bytes and, for iWARP, the whole MPA Request must come within [`SORT_TIMEOUT`]; they are read
/// asynchronously, so a connection that stalls or trickles (one byte a second) holds no thread.
/// An iWARP connection is accepted on `reactor` when there is one.
async fn sort(
    mut stream: TcpStream,
    peer: SocketAddr,
    dev: Arc<TargetDevice<Rnic>>,
    reactor: Option<tokio::runtime::Handle>,
    cfg: AcceptConfig,
    also_tcp: bool,
) -> Result<Arrival, String> {
    let deadline = tokio::time::Instant::now() + SORT_TIMEOUT;
    let late = |what: &str| {
        format!(
            "{what} within {} s (the connection is dropped)",
            SORT_TIMEOUT.as_secs()
        )
    };
    let iwarp = tokio::time::timeout_at(deadline, speaks_mpa(&stream))
        .await
        .map_err(|_| late("no MPA Request or Login PDU"))?
        .map_err(|e| e.to_string())?;
    if !iwarp {
        if also_tcp {
            return Ok(Arrival::Tcp(stream));
        }
        return Err(
            "iSCSI/TCP on a portal that serves only iSER (list tcp:// for this address too)".into(),
        );
    }
    let frame = tokio::time::timeout_at(deadline, read_mpa_request(&mut stream))
        .await
        .map_err(|_| late("no complete MPA Request"))??;
    let std = stream.into_std().map_err(|e| e.to_string())?;
    std.set_nonblocking(false).map_err(|e| e.to_string())?;
    let req = rnic::Request::from_frame(std, peer, &frame).map_err(|e| e.to_string())?;
    let login = match reactor {
        Some(on) => {
            let mut login = on
                .spawn(accept(dev, req, cfg))
                .await
                .map_err(|e| format!("accept task on the reactor: {e}"))??;
            login.run_on(on);
            login
        }
        None => accept(dev, req, cfg).await?,
    };
    Ok(Arrival::Iser(Box::new(login)))
}

/// Reads the whole MPA Request and not a byte more (what follows belongs to the RNIC).
async fn read_mpa_request(stream: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut frame = vec![0u8; rnic::MPA_HEADER_LEN];
    stream
        .read_exact(&mut frame)
        .await
        .map_err(|e| format!("reading the MPA Request: {e}"))?;
    let total = rnic::Request::frame_len(&frame).map_err(|e| e.to_string())?;
    frame.resize(total, 0);
    stream
        .read_exact(&mut frame[rnic::MPA_HEADER_LEN..])
        .await
        .map_err(|e| format!("reading the MPA Request's private data: {e}"))?;
    Ok(frame)
}

/// Whether the connection begins with an MPA Request key (peeked, not consumed). A first
/// byte other than 'M' settles it at once: no Login PDU starts with 0x4d.
async fn speaks_mpa(stream: &TcpStream) -> io::Result<bool> {
    let mut buf = [0u8; 16];
    let mut pause = Duration::from_millis(1);
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before sending anything",
            ));
        }
        if buf[..n] != MPA_REQUEST_KEY[..n] {
            return Ok(false);
        }
        if n == MPA_REQUEST_KEY.len() {
            return Ok(true);
        }
        // A prefix of the key so far: wait for more (peek would see the same bytes at once,
        // so back off, up to 50 ms, for clients that trickle).
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
