//! The login-phase exchanges of a connection, over any transport's
//! `datamover::InitiatorChannel` (opened by the session's `datamover::Connector`): the login driven by
//! `iscsi_login::InitiatorLogin` (offering the keys of the channel's transport), the
//! SendTargets exchange of a discovery session, and the plain logout that ends it.

use std::time::Duration;

use crate::SessionConfig;
use bytes::Bytes;
use datamover::LOGIN_MAX_DATA;
use datamover::{ConnectSettings, InitiatorChannel, LoginRecvError};
use iscsi_login::TransportKind;
use iscsi_login::{
    ConnectionParams, InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginError,
    LoginResponse, SessionParams,
};
use iscsi_wire::{Bhs, Digests, Pdu};

use crate::Error;

/// Any transport's connection before full feature phase: what login and discovery use.
type Channel = dyn InitiatorChannel;

/// Opens a connection of `transport` to `addr` (`host:port`) through `cfg`'s connector,
/// bounded by `cfg`'s connect timeout; an iSCSI/TCP one is traced into `cfg`'s trace when
/// given, an iSER one runs on `cfg`'s provider with its iSER settings.
pub(crate) async fn connect(
    transport: TransportKind,
    addr: &str,
    cfg: &SessionConfig,
) -> Result<Box<Channel>, Error> {
    let failed = |why: String| Error::Connect {
        addr: addr.to_string(),
        why,
    };
    let Some(connector) = &cfg.connector else {
        return Err(failed(
            "no transports to connect with (the session's configuration has no connector; the `transports` crate composes one)".into(),
        ));
    };
    let settings = ConnectSettings {
        timeout: cfg.connect_timeout,
        trace: cfg.trace.as_ref().map(|t| &t.0),
        iser_provider: cfg.iser_provider,
        iser_remote_invalidation: cfg.iser_remote_invalidation,
        iser_poll: cfg.iser_poll,
        tcp_poll: cfg.tcp_poll,
    };
    connector
        .0
        .connect(transport, addr, &settings)
        .await
        .map_err(failed)
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

impl LoginDone {
    /// The most data one PDU to the target may carry (immediate data, a Data-Out): its
    /// MaxRecvDataSegmentLength over TCP; over iSER its TargetRecvDataSegmentLength, held to
    /// what the iSER datamover's send buffers hold.
    pub fn max_send_seg(&self) -> u32 {
        if self.session.rdma_extensions {
            self.connection
                .target_recv_data_segment_length
                .min(iscsi_login::initiator::ISER_SEND_DATA_MAX)
        } else {
            self.connection.max_send_data_segment_length
        }
    }
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
