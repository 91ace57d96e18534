//! The login-phase exchanges of a connection, over any transport's
//! `datamover::InitiatorChannel` (TCP: `datamover_tcp`'s connection): the login driven by
//! `iscsi_login::InitiatorLogin` (offering the keys of the channel's transport), the
//! SendTargets exchange of a discovery session, and the plain logout that ends it.

use std::time::Duration;

use crate::SessionConfig;
use bytes::Bytes;
use datamover::LOGIN_MAX_DATA;
use datamover::{InitiatorChannel, LoginRecvError};
use datamover_iser::rnic_task::PollWindow;
use datamover_iser::IserInitiatorConnection;
use datamover_tcp::initiator::TcpInitiatorConnection;
use iscsi_login::TransportKind;
use iscsi_login::{
    ConnectionParams, InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginError,
    LoginResponse, SessionParams,
};
use iscsi_wire::{Bhs, Digests, Pdu};
use rnic::Rnic;
use std::sync::Arc;

use crate::Error;

/// Any transport's connection before full feature phase: what login and discovery use.
type Channel = dyn InitiatorChannel;

/// The RDMA provider an `iser://` connection runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IserProvider {
    /// ironsan's software iWARP RNIC in this process (over the kernel's TCP).
    #[default]
    Software,
    /// The first device rdma-core reports (libibverbs/librdmacm: Linux siw or a hardware RNIC);
    /// only in a build with the `rdma-core` feature.
    RdmaCore,
}

impl std::str::FromStr for IserProvider {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "software" => Ok(IserProvider::Software),
            "rdma-core" => Ok(IserProvider::RdmaCore),
            _ => Err(format!(
                "unknown RDMA provider '{s}': say software or rdma-core"
            )),
        }
    }
}

/// Opens a connection of `transport` to `addr` (`host:port`), bounded by `cfg`'s connect
/// timeout; an iSCSI/TCP one is traced into `cfg`'s trace when given, an iSER one runs on
/// `cfg`'s provider with its iSER settings.
pub(crate) async fn connect(
    transport: TransportKind,
    addr: &str,
    cfg: &SessionConfig,
) -> Result<Box<Channel>, Error> {
    let timeout = cfg.connect_timeout;
    let trace = cfg.trace.as_ref().map(|t| &t.0);
    let remote_invalidation = cfg.iser_remote_invalidation;
    let failed = |why: String| Error::Connect {
        addr: addr.to_string(),
        why,
    };
    match transport {
        TransportKind::Tcp => match TcpInitiatorConnection::connect(addr, timeout, trace).await {
            Ok(c) => Ok(Box::new(c)),
            Err(why) => Err(failed(why)),
        },
        TransportKind::Iser => {
            let sockaddr = tokio::net::lookup_host(addr)
                .await
                .map_err(|e| failed(e.to_string()))?
                .next()
                .ok_or_else(|| failed("no address".into()))?;
            let connected = match cfg.iser_provider {
                IserProvider::Software => {
                    let poll = PollWindow::new(cfg.iser_poll);
                    let dev = software_rnic(poll.clone()).map_err(|e| failed(e.to_string()))?;
                    IserInitiatorConnection::connect(dev, sockaddr, timeout, remote_invalidation)
                        .await
                        .map(|c| Box::new(c.with_poll_window(poll)) as Box<Channel>)
                }
                IserProvider::RdmaCore => {
                    rdma_core_connect(sockaddr, timeout, remote_invalidation).await
                }
            };
            connected.map_err(failed)
        }
    }
}

/// An iSER connection through the process's rdma-core device (opened on first use).
#[cfg(feature = "rdma-core")]
async fn rdma_core_connect(
    addr: std::net::SocketAddr,
    timeout: Duration,
    remote_invalidation: bool,
) -> Result<Box<Channel>, String> {
    static DEV: std::sync::OnceLock<Arc<verbs::Verbs>> = std::sync::OnceLock::new();
    let dev = match DEV.get() {
        Some(d) => d.clone(),
        None => {
            let d = tokio::task::spawn_blocking(verbs::Verbs::open)
                .await
                .map_err(|e| format!("opening the rdma-core device: {e}"))?
                .map_err(|e| format!("no rdma-core device for iSER: {e}"))?;
            DEV.get_or_init(|| Arc::new(d)).clone()
        }
    };
    let c = IserInitiatorConnection::connect(dev, addr, timeout, remote_invalidation).await?;
    Ok(Box::new(c))
}

#[cfg(not(feature = "rdma-core"))]
async fn rdma_core_connect(
    _addr: std::net::SocketAddr,
    _timeout: Duration,
    _remote_invalidation: bool,
) -> Result<Box<Channel>, String> {
    Err("the rdma-core provider needs ironsan built with the rdma-core feature (cargo build --release --features rdma-core; Debian: libibverbs-dev librdmacm-dev)".into())
}

/// A software iWARP RNIC for one connection, its engine a task of the caller's runtime (the
/// connection's tasks run there too): posting and completing then cost no thread switch. It
/// polls by `poll` after its last work before it sleeps (the connection sets the window by
/// its commands' writes: large writes do not poll while more than two are in flight).
fn software_rnic(poll: PollWindow) -> std::io::Result<Arc<Rnic>> {
    Ok(Arc::new(
        datamover_iser::rnic_task::spawn_software_rnic_polling(poll)?,
    ))
}

/// Sends one PDU.
async fn send(stream: &mut Channel, pdu: &Pdu, digests: Digests) -> Result<(), Error> {
    stream.send(pdu, digests).await.map_err(Error::io)
}

/// Reads one whole PDU, checking digests.
async fn read_pdu(stream: &mut Channel, digests: Digests) -> Result<Pdu, Error> {
    match stream.recv(digests, LOGIN_MAX_DATA).await {
        Ok(got) => Ok(got.pdu),
        Err(LoginRecvError::Closed) => Err(Error::Io("the target closed the connection".into())),
        Err(LoginRecvError::Io(e)) => Err(Error::Io(e)),
        Err(LoginRecvError::Bad(e)) => Err(Error::Protocol(e)),
    }
}

/// What a completed login yields.
#[derive(Debug, Clone)]
pub(crate) struct LoginDone {
    pub tsih: u16,
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// StatSN expected next on this connection.
    pub exp_stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Runs the login phase on a fresh connection.
pub(crate) async fn login(
    stream: &mut Channel,
    config: InitiatorLoginConfig,
    timeout: Duration,
) -> Result<LoginDone, Error> {
    tokio::time::timeout(timeout, login_exchange(stream, config))
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "login did not finish within {} s",
                timeout.as_secs()
            ))
        })?
}

async fn login_exchange(
    stream: &mut Channel,
    config: InitiatorLoginConfig,
) -> Result<LoginDone, Error> {
    let mut config = config;
    config.transport = stream.kind();
    let mut sm = InitiatorLogin::new(config);
    let mut req = sm.first_request();
    // InitiatorLogin bounds the exchanges itself; this bound only guards the loop.
    for _ in 0..100 {
        let pdu = req.into_pdu();
        send(stream, &pdu, Digests::default()).await?;
        let resp = read_pdu(stream, Digests::default()).await?;
        let Bhs::LoginResponse(r) = resp.bhs else {
            return Err(Error::Protocol(format!(
                "expected a Login Response, got {}",
                resp.bhs.opcode().name()
            )));
        };
        let exp_stat_sn = r.stat_sn.wrapping_add(1);
        let lr = LoginResponse::from_pdu(&r, &resp.data);
        let mut rng = |b: &mut [u8]| rand::RngCore::fill_bytes(&mut rand::thread_rng(), b);
        let step = sm.on_response(&lr, &mut rng);
        if let Err(LoginError::Rejected { .. }) = step {
            stream.let_target_close().await;
        }
        match step.map_err(Error::Login)? {
            InitiatorStep::Send(next) => {
                req = next;
                // The state machine does not see StatSN: the runtime acknowledges it.
                req.header.exp_stat_sn = exp_stat_sn;
            }
            InitiatorStep::Complete {
                tsih,
                session,
                connection,
                ..
            } => {
                return Ok(LoginDone {
                    tsih,
                    session,
                    connection,
                    exp_stat_sn,
                    exp_cmd_sn: r.exp_cmd_sn,
                    max_cmd_sn: r.max_cmd_sn,
                })
            }
        }
    }
    Err(Error::Protocol("login did not converge".into()))
}

/// One Text exchange (with continuation) on a logged-in discovery connection.
pub(crate) async fn text_exchange(
    stream: &mut Channel,
    digests: Digests,
    done: &LoginDone,
    cmd_sn: u32,
    request: &[u8],
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    let mut ttt = iscsi_wire::RESERVED_TAG;
    let mut exp_stat_sn = done.exp_stat_sn;
    let mut data = Bytes::copy_from_slice(request);
    // Each round brings at least one PDU of text; 1024 rounds is far beyond any target.
    for _ in 0..1024 {
        let bhs = Bhs::TextRequest(iscsi_wire::TextRequest {
            immediate: true,
            final_: true,
            cont: false,
            lun: 0,
            itt: 1,
            ttt,
            cmd_sn,
            exp_stat_sn,
        });
        send(stream, &Pdu::new(bhs, std::mem::take(&mut data)), digests).await?;
        let resp = loop_skip_nop(stream, digests, &mut exp_stat_sn).await?;
        let Bhs::TextResponse(t) = resp.bhs else {
            return Err(Error::Protocol(format!(
                "expected a Text Response, got {}",
                resp.bhs.opcode().name()
            )));
        };
        exp_stat_sn = t.stat_sn.wrapping_add(1);
        out.extend_from_slice(&resp.data);
        if out.len() > 4 << 20 {
            return Err(Error::Protocol("SendTargets answer over 4 MiB".into()));
        }
        if t.final_ && !t.cont {
            return Ok(out);
        }
        ttt = t.ttt;
    }
    Err(Error::Protocol("text exchange did not end".into()))
}

async fn loop_skip_nop(
    stream: &mut Channel,
    digests: Digests,
    exp_stat_sn: &mut u32,
) -> Result<Pdu, Error> {
    for _ in 0..64 {
        let p = read_pdu(stream, digests).await?;
        match &p.bhs {
            Bhs::NopIn(n) if n.ttt != iscsi_wire::RESERVED_TAG => {
                let reply = Bhs::NopOut(iscsi_wire::NopOut {
                    immediate: true,
                    lun: n.lun,
                    itt: iscsi_wire::RESERVED_TAG,
                    ttt: n.ttt,
                    cmd_sn: 0,
                    exp_stat_sn: *exp_stat_sn,
                });
                send(stream, &Pdu::new(reply, Bytes::new()), digests).await?;
            }
            Bhs::AsyncMessage(_) | Bhs::NopIn(_) => {}
            _ => return Ok(p),
        }
    }
    Err(Error::Protocol("the target sent only NOP-Ins".into()))
}

/// Sends a Logout (close session) and waits for the response.
pub(crate) async fn logout_plain(
    stream: &mut Channel,
    digests: Digests,
    cmd_sn: u32,
    exp_stat_sn: u32,
) -> Result<(), Error> {
    let bhs = Bhs::LogoutRequest(iscsi_wire::LogoutRequest {
        immediate: true,
        reason: 0,
        itt: 2,
        cid: 0,
        cmd_sn,
        exp_stat_sn,
    });
    send(stream, &Pdu::new(bhs, Bytes::new()), digests).await?;
    let mut e = exp_stat_sn;
    let p = loop_skip_nop(stream, digests, &mut e).await?;
    match p.bhs {
        Bhs::LogoutResponse(_) => Ok(()),
        other => Err(Error::Protocol(format!(
            "expected a Logout Response, got {}",
            other.opcode().name()
        ))),
    }
}
