//! The initiator's end of iSER. [`IserInitiatorConnection`] connects (the iSER word in the
//! private data), carries the login phase in Sends, and becomes an [`InitiatorDatamover`]:
//! each SCSI Command goes in a Send whose iSER header advertises a registered buffer for
//! the target's RDMA Writes (Read STag/VA) and one holding the write data for its RDMA Reads
//! (Write STag, VA at the first solicited byte, as LIO reads from it exactly); the SCSI
//! Response arrives after the data is placed, and the read data goes up as a view of the
//! registered buffer (no copy). The write data is the caller's own bytes, registered in place
//! through a registration cache ([`crate::write_regs`]): no copy either. A write that fits
//! whole in what the target receives (its TargetRecvDataSegmentLength, held to our
//! [`DEFAULT_RECV_LEN`] send buffers: 16 KiB of data) goes as immediate data in the command's
//! Send instead, sparing the RDMA Read round trip. Read regions come
//! from a pool; every command's regions carry STags of their own, invalidated before read
//! data is looked at or a region is used again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use datamover::{
    CommandOut, InPdu, InitiatorChannel, InitiatorDatamover, InitiatorFfpConfig, InitiatorNotice,
    LoginRecvError, NoticeSink, TransportKind,
};
use iscsi_wire::{Bhs, Digests, Pdu};
use iser::{CmFlags, IserHeader};
use rdma::{Access, ConnParams, MemoryRegion, QueuePair, SendOp};
use tokio::sync::{mpsc, Semaphore};

use crate::endpoint::{Buffers, CloseUnlessKept, Device, Endpoint, Inbound, Received};
use crate::lent;
use crate::mr_pool::{MrPool, PooledMr};
use crate::rnic_task::{LargeWrite, PollWindow};
use crate::target::{CONTROL_LEN, DEFAULT_RECV_LEN};
use crate::write_regs::{WriteReg, WriteRegistrations};

/// Sends and receives the initiator keeps: a command window of this many commands, each with
/// its unsolicited Data-Out, fits.
const SLOTS: u32 = 256;
/// Of the target's declared MaxOutstandingUnexpectedPDUs, what unsolicited Data-Out leaves
/// for NOP-Out, task management, logout and text.
const CONTROL_RESERVE: u32 = 8;
/// Unsolicited Data-Out in flight when the target declares no limit: Linux LIO's isert keeps
/// 128 receives for commands and unexpected PDUs together, and its command window is 64.
const UNDECLARED_UNSOLICITED: u32 = 32;

/// How many unsolicited Data-Out Sends may wait at the target at once, given what it declared
/// as MaxOutstandingUnexpectedPDUs (0: nothing declared).
fn unsolicited_limit(declared: u32) -> usize {
    let n = match declared {
        0 => UNDECLARED_UNSOLICITED,
        d => d.saturating_sub(CONTROL_RESERVE),
    };
    n.max(1) as usize
}

/// How long a target may take to close its end, after our logout or its refusal of our
/// login, before we close ours.
const TARGET_CLOSE_GRACE: Duration = Duration::from_millis(100);

/// Idle bytes each buffer pool keeps for reuse.
const POOL_IDLE_BYTES: usize = 32 << 20;
/// Bytes of the caller's write data the registration cache keeps registered while idle (and
/// holds on to: freed only when evicted or the connection ends).
const WRITE_CACHE_IDLE_BYTES: usize = 64 << 20;

/// An iSER connection in the login phase.
pub struct IserInitiatorConnection<P: Device> {
    ep: Arc<Endpoint<P>>,
    received: Received,
    peer: SocketAddr,
    /// Whether the target may answer with Send with Invalidate: we accept it and its CM
    /// reply did not refuse it (bit 0x40 clear).
    remote_invalidation: bool,
    /// The polling of the engine this connection runs on, when it is a driven software RNIC
    /// of its own: set by each command's write size.
    poll: Option<PollWindow>,
    /// Closes the connection if the login fails (the session drops this channel).
    close_unless_kept: CloseUnlessKept<P>,
}

impl<P: Device> IserInitiatorConnection<P> {
    /// The connection's engine polls by `window` ([`crate::rnic_task::spawn_software_rnic_polling`]):
    /// each command sets it by what it writes ([`PollWindow::follow_write`]).
    pub fn with_poll_window(mut self, window: PollWindow) -> Self {
        self.poll = Some(window);
        self
    }

    /// Connects to the target's iSER portal at `addr` through `dev`; `remote_invalidation`
    /// says whether the target may end a command with Send with Invalidate of its STag (the
    /// iSER CM word's 0x40 bit clear) or must answer with plain Sends.
    pub async fn connect(
        dev: Arc<P>,
        addr: SocketAddr,
        timeout: Duration,
        remote_invalidation: bool,
    ) -> Result<Self, String> {
        let buffers = Buffers {
            recv_slots: SLOTS,
            recv_len: CONTROL_LEN,
            send_slots: SLOTS,
            send_len: DEFAULT_RECV_LEN,
        };
        let ours = CmFlags::ours(remote_invalidation);
        let params = ConnParams {
            private_data: ours.encode().to_vec(),
            ird: 16,
            ord: 0,
            timeout,
            ..ConnParams::default()
        };
        let (ep, received, poller, info) = tokio::task::spawn_blocking(move || {
            let (ep, received, poller) =
                Endpoint::create(dev, buffers).map_err(|e| format!("setting up: {e}"))?;
            let info = ep
                .qp()
                .connect(addr, &params)
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            Ok::<_, String>((ep, received, poller, info))
        })
        .await
        .map_err(|e| format!("connect task: {e}"))??;
        ep.set_peer(addr);
        poller.start();
        // The target's word counts too, read as Linux ib_iser reads it (bit 0x40 of its first
        // byte, when it sent one): a target that said it will not use Send with Invalidate and
        // uses it anyway is broken (was: ignored, and such an invalidation accepted; the
        // raw-target test iscsi-initiator/tests/iser_bad_target.rs caught it).
        let refused = info
            .peer_private_data
            .first()
            .is_some_and(|b| b & 0x40 != 0);
        Ok(IserInitiatorConnection {
            close_unless_kept: CloseUnlessKept::new(ep.clone()),
            ep,
            received,
            peer: addr,
            remote_invalidation: !ours.no_send_invalidate && !refused,
            poll: None,
        })
    }
}

#[async_trait]
impl<P: Device> InitiatorChannel for IserInitiatorConnection<P> {
    fn kind(&self) -> TransportKind {
        TransportKind::Iser
    }

    fn socket(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    async fn send(&mut self, pdu: &Pdu, _digests: Digests) -> std::io::Result<()> {
        self.ep
            .send(&IserHeader::CONTROL, pdu, SendOp::Send)
            .await
            .map_err(std::io::Error::other)
    }

    async fn recv(&mut self, _digests: Digests, max_data: u32) -> Result<InPdu, LoginRecvError> {
        crate::endpoint::recv_login_pdu(&mut self.received, max_data).await
    }

    /// As after a logout (`close_after_logout`): Linux LIO closes once its refusing Login
    /// Response is sent, and its siw fails that Send ("login send failure: local QP operation
    /// error" in its log) when our FIN comes first. So the target gets `TARGET_CLOSE_GRACE` to
    /// close, and the handshake as long again before this returns: the caller may be a
    /// process about to exit, which would cut it short.
    async fn let_target_close(&mut self) {
        let ep = self.ep.clone();
        self.ep
            .close_after_peer_or(TARGET_CLOSE_GRACE, move || ep.close());
        let _ = tokio::time::timeout(2 * TARGET_CLOSE_GRACE, self.ep.when_ended()).await;
    }

    fn into_full_feature(
        self: Box<Self>,
        cfg: InitiatorFfpConfig,
        sink: NoticeSink,
    ) -> Arc<dyn InitiatorDatamover> {
        let me = *self;
        me.close_unless_kept.keep();
        let local = me.ep.source_pool();
        let shared = Arc::new(Shared {
            reads: local.sibling(Access::LOCAL_WRITE | Access::REMOTE_WRITE, POOL_IDLE_BYTES),
            writes: local.write_registrations(WRITE_CACHE_IDLE_BYTES),
            ep: me.ep,
            commands: Mutex::new(HashMap::new()),
            peer: me.peer,
            remote_invalidation: me.remote_invalidation,
            closed: AtomicBool::new(false),
            sink,
            unsolicited: Semaphore::new(unsolicited_limit(cfg.max_outstanding_unexpected_pdus)),
            unsolicited_held: Mutex::new(HashMap::new()),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_loop(shared.clone(), rx));
        receive_on_completions(shared.clone(), me.received, cfg);
        Arc::new(IserInitiatorDatamover {
            shared,
            tx,
            poll: me.poll,
        })
    }
}

/// A command's registered buffers until its status arrives.
struct CommandBuffers<P: Device> {
    /// The STags advertised for it (the only ones the target may invalidate with its status).
    stags: Vec<u32>,
    read: Option<(Arc<PooledMr<P>>, usize)>,
    /// Held so the target can RDMA Read it until the status.
    _write: Option<WriteReg<P>>,
    /// Counted in the engine's poll window until the status.
    _large: Option<LargeWrite>,
}

struct Shared<P: Device> {
    ep: Arc<Endpoint<P>>,
    /// Regions the target RDMA-Writes read data into.
    reads: Arc<MrPool<P>>,
    /// The caller's write data, registered for the target's RDMA Reads.
    writes: Arc<WriteRegistrations<P>>,
    commands: Mutex<HashMap<u32, CommandBuffers<P>>>,
    peer: SocketAddr,
    /// Remote invalidation was negotiated (see [`IserInitiatorConnection`]).
    remote_invalidation: bool,
    /// Set once the connection's end was reported: no notice follows it.
    closed: AtomicBool,
    sink: NoticeSink,
    /// Unsolicited Data-Out Sends the target can still take (see [`unsolicited_limit`]).
    unsolicited: Semaphore,
    /// Permits each command's unsolicited Data-Out holds until its status arrives (by then
    /// the target has consumed them and posted its receives again).
    unsolicited_held: Mutex<HashMap<u32, u32>>,
}

impl<P: Device> Shared<P> {
    /// Waits until the target has a receive for one more unsolicited Data-Out of `itt`.
    async fn take_unsolicited_permit(&self, itt: u32) -> Result<(), String> {
        self.unsolicited
            .acquire()
            .await
            .map_err(|_| "the connection ended".to_string())?
            .forget();
        *self
            .unsolicited_held
            .lock()
            .expect("held")
            .entry(itt)
            .or_default() += 1;
        Ok(())
    }

    /// The command is over: its unsolicited Data-Outs no longer count.
    fn release_unsolicited(&self, itt: u32) {
        let n = self.unsolicited_held.lock().expect("held").remove(&itt);
        if let Some(n) = n {
            self.unsolicited.add_permits(n as usize);
        }
    }

    fn notify(&self, notice: InitiatorNotice) {
        if !self.closed.load(Ordering::Acquire) {
            (self.sink)(&mut vec![notice]);
        }
    }

    /// Ends the connection and reports it once.
    fn end(&self, why: String) {
        self.ep.close();
        self.unsolicited.close();
        self.commands.lock().expect("commands").clear();
        if !self.closed.swap(true, Ordering::AcqRel) {
            (self.sink)(&mut vec![InitiatorNotice::Closed(why)]);
        }
    }
}

enum Out {
    /// With the large write's count in its engine's poll window, if it is one.
    Command(CommandOut, Option<LargeWrite>),
    Control(Pdu),
    /// Close once what was queued before is posted.
    Close,
}

/// The iSER implementation of [`InitiatorDatamover`].
pub struct IserInitiatorDatamover<P: Device> {
    shared: Arc<Shared<P>>,
    tx: mpsc::UnboundedSender<Out>,
    poll: Option<PollWindow>,
}

impl<P: Device> InitiatorDatamover for IserInitiatorDatamover<P> {
    fn send_command(&self, cmd: CommandOut) {
        let large = self
            .poll
            .as_ref()
            .and_then(|poll| poll.follow_write(cmd.write.len()));
        let _ = self.tx.send(Out::Command(cmd, large));
    }

    fn send_control(&self, pdu: Pdu) {
        let _ = self.tx.send(Out::Control(pdu));
    }

    fn forget(&self, itt: u32) {
        self.shared.release_unsolicited(itt);
        let gone = self.shared.commands.lock().expect("commands").remove(&itt);
        if let Some((mr, _)) = gone.and_then(|b| b.read) {
            mr.mr().invalidate();
        }
    }

    fn write_registrations(&self) -> datamover::RegistrationStats {
        self.shared.writes.stats()
    }

    fn close(&self) {
        close_via(&self.tx, &self.shared.ep);
    }

    /// Linux LIO closes its end once its Logout Response is sent, and its siw fails that
    /// Send (a fatal QP error, and a WARNING in LIO's command release) when our FIN arrives
    /// before siw has finished with it. So the target gets `TARGET_CLOSE_GRACE` to close
    /// first. ironsan's own target waits for the initiator instead; it costs that much there.
    fn close_after_logout(&self) {
        let (tx, ep) = (self.tx.clone(), self.shared.ep.clone());
        self.shared
            .ep
            .close_after_peer_or(TARGET_CLOSE_GRACE, move || close_via(&tx, &ep));
    }

    fn when_closed(&self) -> datamover::ClosedFuture {
        Box::pin(self.shared.ep.when_ended())
    }

    fn abort(&self) {
        // Nothing more is reported.
        self.shared.closed.store(true, Ordering::Release);
        self.shared.ep.close();
    }
}

/// Closes after what the send loop has queued, or at once if the loop is gone.
fn close_via<P: Device>(tx: &mpsc::UnboundedSender<Out>, ep: &Endpoint<P>) {
    if tx.send(Out::Close).is_err() {
        ep.close();
    }
}

/// Posts what the session core queued, in order.
async fn send_loop<P: Device>(sh: Arc<Shared<P>>, mut rx: mpsc::UnboundedReceiver<Out>) {
    while let Some(out) = rx.recv().await {
        let sent = match out {
            Out::Close => {
                sh.ep.close();
                return;
            }
            Out::Control(pdu) => send_control(&sh, pdu).await,
            Out::Command(cmd, large) => send_command(&sh, cmd, large).await,
        };
        if let Err(why) = sent {
            tracing::debug!(peer = %sh.peer, "iSER send failed: {why}");
            sh.end(why);
            return;
        }
    }
}

/// Posts a control PDU; an unsolicited Data-Out first waits for a receive at the target.
async fn send_control<P: Device>(sh: &Shared<P>, pdu: Pdu) -> Result<(), String> {
    if let Bhs::DataOut(d) = &pdu.bhs {
        sh.take_unsolicited_permit(d.itt).await?;
    }
    sh.ep.send(&IserHeader::CONTROL, &pdu, SendOp::Send).await
}

/// Registers the command's buffers and posts it with their STags.
async fn send_command<P: Device>(
    sh: &Shared<P>,
    cmd: CommandOut,
    large: Option<LargeWrite>,
) -> Result<(), String> {
    let itt = cmd.pdu.bhs.itt();
    let mut header = IserHeader::CONTROL;
    let read = if cmd.read_len > 0 {
        let len = cmd.read_len as usize;
        let region = sh
            .reads
            .take(len)
            .map_err(|e| format!("registering: {e}"))?;
        header.read = Some((region.mr().rkey(), region.mr().addr()));
        Some((Arc::new(region), len))
    } else {
        None
    };
    let write = if cmd.write.len() > cmd.solicited_from as usize {
        let reg = sh
            .writes
            .take(&cmd.write)
            .map_err(|e| format!("registering: {e}"))?;
        let va = reg.mr().addr() + u64::from(cmd.solicited_from);
        header.write = Some((reg.mr().rkey(), va));
        Some(reg)
    } else {
        None
    };
    let stags = [header.read, header.write]
        .into_iter()
        .flatten()
        .map(|(stag, _)| stag)
        .collect();
    sh.commands.lock().expect("commands").insert(
        itt,
        CommandBuffers {
            stags,
            read,
            _write: write,
            _large: large,
        },
    );
    sh.ep.send(&header, &cmd.pdu, SendOp::Send).await
}

/// Turns every Send from the target into a notice, on the endpoint's completion task: a SCSI
/// Response brings its command's read data along (placed by the target's RDMA Writes before
/// the response was sent).
fn receive_on_completions<P: Device>(
    sh: Arc<Shared<P>>,
    received: Received,
    cfg: InitiatorFfpConfig,
) {
    let max_data = cfg.max_recv_data_segment_length.max(iser::LOGIN_DATA_MAX);
    let (ep, ended) = (sh.ep.clone(), sh.clone());
    ep.deliver_sends(
        received,
        move |inbound| on_send(&sh, inbound, max_data).map(|notice| sh.notify(notice)),
        move |why| {
            tracing::debug!(peer = %ended.peer, "iSER connection ended: {why}");
            ended.end(why);
        },
    );
}

/// One Send from the target as a notice, or why it ends the connection.
fn on_send<P: Device>(
    sh: &Shared<P>,
    inbound: Inbound,
    max_data: u32,
) -> Result<InitiatorNotice, String> {
    let (bytes, invalidated) = (inbound.bytes, inbound.invalidated);
    // Linux ib_iser fails the connection so too (-EPROTO).
    if let (Some(stag), false) = (invalidated, sh.remote_invalidation) {
        return Err(format!(
            "the target invalidated STag 0x{stag:08x} with a Send, though its CM reply refused remote invalidation"
        ));
    }
    let send = iser::parse_send(&bytes, max_data).map_err(|e| format!("from the target: {e}"))?;
    let notice = match &send.pdu.bhs {
        Bhs::ScsiResponse(r) => {
            sh.release_unsolicited(r.itt);
            let bufs = sh.commands.lock().expect("commands").remove(&r.itt);
            // Remote invalidation only of this command's own STag (Linux ib_iser's rule).
            if let Some(stag) = invalidated {
                if !bufs.as_ref().is_some_and(|b| b.stags.contains(&stag)) {
                    return Err(format!(
                        "the target invalidated STag 0x{stag:08x}, not one of ITT 0x{:08x}",
                        r.itt
                    ));
                }
            }
            let read = match bufs.and_then(|b| b.read) {
                Some((region, len)) => {
                    // No further RDMA Write may land once the bytes are handed over.
                    if region.mr().is_valid() {
                        region.mr().invalidate();
                    }
                    lent::view(region, len)
                }
                None => Bytes::new(),
            };
            InitiatorNotice::Status {
                pdu: send.pdu,
                read,
            }
        }
        Bhs::DataIn(_) | Bhs::R2t(_) => {
            return Err("the target sent a Data-In or R2T PDU over iSER".to_string());
        }
        // Linux LIO's isert sends a Reject of a command in a Send with Invalidate of that
        // command's STag (seen when it refused immediate data): taken when the STag is the
        // rejected command's, whose buffers stay held until the command is forgotten.
        Bhs::Reject(_)
            if invalidated.is_some_and(|stag| rejected_stag(sh, &send.pdu.data, stag)) =>
        {
            InitiatorNotice::Control(send.pdu)
        }
        other if invalidated.is_some() => {
            return Err(format!(
                "a Send with Invalidate that is no SCSI Response: {}",
                describe(other)
            ));
        }
        _ => InitiatorNotice::Control(send.pdu),
    };
    Ok(notice)
}

/// A PDU named for an error message: its opcode and task tag (a Reject's reason too).
fn describe(bhs: &Bhs) -> String {
    match bhs {
        Bhs::Reject(r) => format!("Reject, reason 0x{:02x}", r.reason),
        other => format!("{:?} ITT 0x{:08x}", other.opcode(), other.itt()),
    }
}

/// Whether `stag` is one advertised by the command a Reject names (its data segment carries
/// the rejected PDU's header).
fn rejected_stag<P: Device>(sh: &Shared<P>, data: &[u8], stag: u32) -> bool {
    let Some((_, itt)) = iscsi_wire::reject::rejected_pdu(data) else {
        return false;
    };
    sh.commands
        .lock()
        .expect("commands")
        .get(&itt)
        .is_some_and(|b| b.stags.contains(&stag))
}
