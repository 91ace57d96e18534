//! The target's end of an iSER connection: accepting a connection request (the iSER word in
//! the private data both ways, IRD/ORD negotiated by the provider, every receive posted
//! before the Reply goes out) and the login phase in iSER mode from the first PDU: Login
//! Requests arrive in Sends behind a 28-byte iSER header, Login Responses leave the same way,
//! with no Hello.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use datamover::{
    CmdSnState, Datamover, FfpConfig, InPdu, LoginChannel, LoginRecvError, Notice, TransportKind,
};
use iscsi_wire::{Bhs, Pdu};
use iser::{CmFlags, IserHeader};
use rdma::{ConnParams, ConnectRequest, SendOp};
use std::os::fd::BorrowedFd;
use tokio::sync::mpsc;

use crate::datamover::Start;
use crate::endpoint::{Buffers, CloseUnlessKept, Device, Endpoint, Received};
use crate::target_device::TargetDevice;

/// How the target sets up an iSER connection.
#[derive(Debug, Clone, Copy)]
pub struct AcceptConfig {
    pub buffers: Buffers,
    /// Answer SCSI commands with Send with Invalidate when the initiator accepts it.
    pub send_invalidate: bool,
    /// RDMA Reads this target issues at once (the provider clamps it to the initiator's IRD).
    pub ord: u16,
    /// Insist on MPA CRC (iWARP).
    pub crc: bool,
    /// Connections being sorted by their first bytes at once (the portal on the software
    /// RNIC); one more drops the one that has waited longest.
    pub max_sorting: usize,
}

/// The target's receive buffers: login text fits 8 KiB (both Linux peers size their login
/// buffers so); full feature phase adds immediate and unsolicited data up to
/// TargetRecvDataSegmentLength ([`DEFAULT_RECV_DATA`]): one buffer size serves both phases. A
/// SCSI Command's AHS (a long CDB's Extended CDB AHS, a bidirectional command's read length)
/// comes on top of its immediate data. Also the size of the initiator's send buffers, which
/// carry that data.
pub const DEFAULT_RECV_LEN: usize =
    iser::ISER_HEADERS_LEN + COMMAND_AHS_MAX + DEFAULT_RECV_DATA as usize + 52;
/// Buffers for what the target sends and the initiator receives: Login, Text and control PDUs,
/// whose data is at most the 8 KiB of login text.
pub const CONTROL_LEN: usize =
    iser::ISER_HEADERS_LEN + COMMAND_AHS_MAX + iser::LOGIN_DATA_MAX as usize + 52;
/// The largest AHS of a SCSI Command: a 260-byte CDB's Extended CDB AHS (248 bytes) and the
/// Bidirectional Expected Read-Data Length AHS (8).
pub const COMMAND_AHS_MAX: usize = 256;
/// The data segment a Send to the target may carry with [`DEFAULT_RECV_LEN`] buffers
/// (declared as TargetRecvDataSegmentLength); receives kept posted beyond the command window:
/// NOP-Out, task management, logout and text, and the Data-Out of unsolicited data (iWARP has
/// no receiver-not-ready retry). Both are declared at login by the iSCSI layer, which has
/// them from `datamover`.
pub use datamover::iser_defaults::{DEFAULT_RECV_DATA, UNEXPECTED_RECVS};

/// The most data a control PDU to the initiator may carry: Linux ib_iser's receive buffers
/// hold 128 bytes after the headers, whatever InitiatorRecvDataSegmentLength it declares.
pub const CONTROL_DATA_MAX: u32 = iser::LINUX_INITIATOR_RECV_DATA;

impl AcceptConfig {
    /// Buffers for a session whose command window is `queue_depth`: that many commands, one
    /// Send of unsolicited Data-Out each (FirstBurstLength is held to what one Send carries on
    /// iSER), plus [`UNEXPECTED_RECVS`] other Sends can never outrun the posted receives.
    pub fn for_queue_depth(queue_depth: u32) -> AcceptConfig {
        let slots = 2 * queue_depth.max(1) + UNEXPECTED_RECVS;
        AcceptConfig {
            buffers: Buffers {
                recv_slots: slots,
                recv_len: DEFAULT_RECV_LEN,
                send_slots: slots,
                send_len: CONTROL_LEN,
            },
            send_invalidate: true,
            ord: 16,
            crc: false,
            max_sorting: 4096,
        }
    }
}

impl Default for AcceptConfig {
    /// Sized for the target's default queue depth of 128.
    fn default() -> Self {
        AcceptConfig::for_queue_depth(128)
    }
}

/// An accepted iSER connection in the login phase.
pub struct IserLogin<P: Device> {
    ep: Arc<Endpoint<P>>,
    received: Received,
    peer: SocketAddr,
    /// What the initiator said of itself in its private data.
    pub initiator_flags: CmFlags,
    /// Whether SCSI Responses go as Send with Invalidate.
    pub send_invalidate: bool,
    /// Inbound and outbound RDMA Read depth as negotiated.
    pub ird_ord: (u16, u16),
    max_recv_data: u32,
    /// Closes the connection if the login phase ends without full feature phase.
    close_unless_kept: CloseUnlessKept<P>,
    /// The runtime the connection's work belongs on (see [`IserLogin::run_on`]).
    runs_on: Option<tokio::runtime::Handle>,
}

/// Accepts `req` on `dev`: creates the queue pair and its buffers (in the device's shared
/// protection domain), posts every receive, and answers with our iSER word. The provider's
/// accept is blocking (it writes the MPA Reply), so it runs off the async threads.
pub async fn accept<P, R>(
    dev: Arc<TargetDevice<P>>,
    req: R,
    cfg: AcceptConfig,
) -> Result<IserLogin<P>, String>
where
    P: Device,
    R: ConnectRequest<Qp = P::Qp> + 'static,
{
    let initiator_flags = CmFlags::decode(req.private_data());
    let peer = req.peer_addr();
    let send_invalidate = cfg.send_invalidate && !initiator_flags.no_send_invalidate;
    let params = ConnParams {
        private_data: CmFlags::ours(send_invalidate).encode().to_vec(),
        ird: 16,
        ord: cfg.ord,
        crc: cfg.crc,
        ..ConnParams::default()
    };
    let (ep, received, poller, info) = tokio::task::spawn_blocking(move || {
        let (ep, received, poller) = Endpoint::create_in(
            dev.dev().clone(),
            dev.pd().clone(),
            dev.domain(),
            cfg.buffers,
        )
        .map_err(|e| format!("setting up: {e}"))?;
        let info = req
            .accept(ep.qp(), &params)
            .map_err(|e| format!("accepting: {e}"))?;
        Ok::<_, String>((ep, received, poller, info))
    })
    .await
    .map_err(|e| format!("accept task: {e}"))??;
    ep.set_peer(peer);
    poller.start();
    Ok(IserLogin {
        close_unless_kept: CloseUnlessKept::new(ep.clone()),
        ep,
        received,
        peer,
        initiator_flags,
        send_invalidate,
        ird_ord: (info.ird, info.ord),
        max_recv_data: (cfg.buffers.recv_len - iser::ISER_HEADERS_LEN - COMMAND_AHS_MAX) as u32,
        runs_on: None,
    })
}

impl<P: Device> IserLogin<P> {
    /// Asks that the connection's login and full feature phase run on `runtime` (the
    /// RNIC's reactor, where its completion task runs), not on the accepting caller's.
    pub fn run_on(&mut self, runtime: tokio::runtime::Handle) {
        self.runs_on = Some(runtime);
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.ep.close();
    }
}

#[async_trait]
impl<P: Device> LoginChannel for IserLogin<P> {
    fn kind(&self) -> TransportKind {
        TransportKind::Iser
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn socket(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.runs_on.clone()
    }

    fn control_data_max(&self) -> u32 {
        CONTROL_DATA_MAX
    }

    /// The next PDU from the initiator. A Send that is no valid iSER control message ends the
    /// connection (`Bad`).
    async fn recv(&mut self) -> Result<InPdu, LoginRecvError> {
        crate::endpoint::recv_login_pdu(&mut self.received, self.max_recv_data).await
    }

    /// Sends a login-phase PDU in a plain Send.
    async fn send(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        if let Bhs::LoginResponse(rsp) = &pdu.bhs {
            self.close_unless_kept.refused |= rsp.status_class != 0;
        }
        self.ep
            .send(&IserHeader::CONTROL, pdu, SendOp::Send)
            .await
            .map_err(std::io::Error::other)
    }

    fn into_full_feature(
        self: Box<Self>,
        cfg: FfpConfig,
        sn: Arc<CmdSnState>,
    ) -> (Arc<dyn Datamover>, mpsc::Receiver<Notice>) {
        let me = *self;
        me.close_unless_kept.keep();
        let start = Start {
            ep: me.ep,
            received: me.received,
            peer: me.peer,
            send_invalidate: me.send_invalidate,
            ord: me.ird_ord.1,
            max_recv_data: me.max_recv_data,
        };
        crate::datamover::start(start, cfg, sn)
    }
}
