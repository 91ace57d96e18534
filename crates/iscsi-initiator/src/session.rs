//! The tokio driver around [`SessionCore`]: logs in one or more connections, hands each to
//! full feature phase as its transport's `datamover::InitiatorDatamover` (whose notices it
//! feeds to the core), keeps connections alive with NOP-Out pings, and on a connection loss
//! either fails the commands in flight with a clear error or (with `reconnect`) reinstates
//! the session with the same ISID and sends them again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use datamover::{
    InitiatorChannel, InitiatorDatamover, InitiatorFfpConfig, InitiatorNotice, SnackFor,
};
use iscsi_login::{
    ChapAlgorithm, ChapCredentials, DesiredSession, DigestPreference, DiscoveredTarget,
    InitiatorAuth, InitiatorLoginConfig, SessionParams,
};
use iscsi_wire::Digests;
use tokio::sync::oneshot;

use crate::conn::{self, LoginDone};
use crate::core::{
    Action, CommandRequest, CommandResult, RecoveryStats, Reply, SessionCore, SessionLimits,
    TaskError,
};
use crate::multipath::{BoxFut, Multipath, MultipathConfig, Opener, PathLink, PathStatus};
use crate::pending::{Pending, PendingCommand};
use crate::scsi::{self, Capacity, Inquiry, UNIT_ATTENTION_TRIES};
use crate::url::IscsiUrl;
use crate::Error;
use datamover::IserProvider;

/// The initiator name used unless the caller sets one.
pub const DEFAULT_INITIATOR_NAME: &str = "iqn.2026-11.org.ironsan:initiator";

/// How long a logout waits for its connections' close to finish on the wire (iSER: the
/// RNIC's FIN handshake after the last Send) before it returns anyway.
const LOGOUT_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How long a command refused as in ALUA transition (04h/0Ah) is sent again.
pub const TRANSITION_WAIT: Duration = Duration::from_secs(10);

/// How to log in and run a session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub initiator_name: String,
    /// CHAP credentials (from the URL's `user%password@`).
    pub chap: Option<ChapCredentials>,
    /// Mutual CHAP: what the target must prove (from the URL's `target_user`/`target_password`).
    pub mutual_chap: Option<ChapCredentials>,
    /// CHAP_A offer in preference order. MD5 alone by default: tgtd refuses a login whose
    /// CHAP_A list names algorithms it does not know.
    pub chap_algorithms: Vec<ChapAlgorithm>,
    pub header_digest: DigestPreference,
    pub data_digest: DigestPreference,
    /// Highest ErrorRecoveryLevel offered over iSCSI/TCP: at 1 a Data-In that fails its
    /// data digest is asked for again with a SNACK instead of ending the connection.
    pub error_recovery_level: u8,
    /// Connections to open (capped by the negotiated MaxConnections).
    pub connections: u16,
    /// Our MaxRecvDataSegmentLength (largest Data-In PDU we accept).
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u16,
    pub connect_timeout: Duration,
    pub login_timeout: Duration,
    /// Ping an idle connection this often (`None`: never).
    pub nop_interval: Option<Duration>,
    /// Drop a connection whose ping is not answered within this time.
    pub nop_timeout: Duration,
    /// Reinstate the session after a connection loss and resend the commands in flight.
    pub reconnect: bool,
    /// Login attempts when reconnecting.
    pub reconnect_attempts: u32,
    /// Record every byte of every connection (discovery, login, full feature phase) in
    /// this pcapng trace.
    pub trace: Option<TraceFile>,
    /// What `iser://` connections run on.
    pub iser_provider: IserProvider,
    /// iSER: the target may end a command with Send with Invalidate of the command's STag
    /// (otherwise it is asked for plain Sends and the initiator invalidates its own STags).
    pub iser_remote_invalidation: bool,
    /// iSER: send a write's data unsolicited only when all of it fits in the command's Send
    /// (immediate data); the target fetches a larger write whole with one RDMA Read, in place,
    /// rather than taking its first part through Sends copied on both sides (128 KiB writes
    /// at QD 32: 1.4x). Off: send unsolicited data as ImmediateData, InitialR2T and
    /// FirstBurstLength allow.
    pub iser_unsolicited_only_whole: bool,
    /// iSER on the software RNIC: how long its engine polls on after its last work before
    /// it sleeps (zero: at once); see `datamover::iser_defaults::DEFAULT_POLL`.
    pub iser_poll: Duration,
    /// iSCSI/TCP: how long each connection's reader polls its socket after a PDU before it
    /// sleeps (zero: at once); see `datamover::tcp_defaults::DEFAULT_POLL`.
    pub tcp_poll: Duration,
    /// What opens the session's connections, of every transport (the `transports` crate
    /// composes it); none: connecting fails and says so.
    pub connector: Option<SessionConnector>,
    /// How a URL listing several portals is served: one session per portal, commands
    /// routed and moved between them ([`crate::multipath`]).
    pub multipath: MultipathConfig,
}

/// The [`datamover::Connector`] a session opens its connections with.
#[derive(Clone)]
pub struct SessionConnector(pub Arc<dyn datamover::Connector>);

impl std::fmt::Debug for SessionConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionConnector")
    }
}

/// A pcapng trace shared by the connections of one or more sessions (`--trace FILE`).
#[derive(Clone)]
pub struct TraceFile(pub pcap_trace::PduTrace);

impl TraceFile {
    /// Creates (truncates) `path`.
    pub fn create(path: impl AsRef<std::path::Path>) -> std::io::Result<TraceFile> {
        pcap_trace::PduTrace::create(path).map(TraceFile)
    }

    /// Writes buffered frames to the file.
    pub fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl std::fmt::Debug for TraceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceFile")
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            initiator_name: DEFAULT_INITIATOR_NAME.to_string(),
            chap: None,
            mutual_chap: None,
            chap_algorithms: vec![ChapAlgorithm::Md5],
            header_digest: DigestPreference::None,
            data_digest: DigestPreference::None,
            error_recovery_level: 0,
            connections: 1,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 16_776_192,
            first_burst_length: 262_144,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 8,
            connect_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(15),
            nop_interval: Some(Duration::from_secs(10)),
            nop_timeout: Duration::from_secs(30),
            reconnect: false,
            reconnect_attempts: 5,
            trace: None,
            iser_provider: IserProvider::Software,
            iser_remote_invalidation: true,
            iser_unsolicited_only_whole: true,
            iser_poll: datamover::iser_defaults::DEFAULT_POLL,
            tcp_poll: datamover::tcp_defaults::DEFAULT_POLL,
            connector: None,
            multipath: MultipathConfig::default(),
        }
    }
}

impl SessionConfig {
    /// Defaults with the URL's CHAP credentials and digest choices.
    pub fn from_url(url: &IscsiUrl) -> SessionConfig {
        let mut c = SessionConfig::default();
        c.apply_url(url);
        c
    }

    /// Takes the URL's CHAP credentials and digest choices (where it sets them).
    pub fn apply_url(&mut self, url: &IscsiUrl) {
        if let (Some(u), Some(p)) = (&url.user, &url.password) {
            self.chap = Some(ChapCredentials::new(u.clone(), p.as_bytes().to_vec()));
        }
        if let (Some(u), Some(p)) = (&url.target_user, &url.target_password) {
            self.mutual_chap = Some(ChapCredentials::new(u.clone(), p.as_bytes().to_vec()));
        }
        if let Some(d) = url.header_digest {
            self.header_digest = d;
        }
        if let Some(d) = url.data_digest {
            self.data_digest = d;
        }
        if let Some(l) = url.error_recovery_level {
            self.error_recovery_level = l;
        }
        if let Some(us) = url.tcp_poll_us {
            self.tcp_poll = Duration::from_micros(us);
        }
    }

    fn login_config(
        &self,
        target: Option<&str>,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        cmd_sn: u32,
    ) -> InitiatorLoginConfig {
        let mut c =
            InitiatorLoginConfig::new(self.initiator_name.clone(), target.map(str::to_string));
        c.isid = isid;
        c.tsih = tsih;
        c.cid = cid;
        c.cmd_sn = cmd_sn;
        c.itt = u32::from(cid) + 0x1000;
        c.auth = match &self.chap {
            None => InitiatorAuth::None,
            Some(cred) => InitiatorAuth::Chap {
                credentials: cred.clone(),
                mutual: self.mutual_chap.clone(),
                algorithms: self.chap_algorithms.clone(),
            },
        };
        c.header_digest = self.header_digest;
        c.data_digest = self.data_digest;
        c.max_recv_data_segment_length = self.max_recv_data_segment_length;
        c.session = DesiredSession {
            immediate_data: self.immediate_data,
            initial_r2t: self.initial_r2t,
            max_burst_length: self.max_burst_length,
            first_burst_length: self.first_burst_length.min(self.max_burst_length),
            max_connections: self.connections.max(1),
            max_outstanding_r2t: self.max_outstanding_r2t.max(1),
            default_time2wait: 2,
            default_time2retain: 20,
            error_recovery_level: self.error_recovery_level,
        };
        c
    }
}

type Waiter = oneshot::Sender<Result<Reply, TaskError>>;

struct ConnHandle {
    /// Unique for the life of the session: notices and timeouts of a connection that has
    /// since been replaced (at the same index) are told apart by it.
    epoch: u64,
    dm: Arc<dyn InitiatorDatamover>,
    /// A duplicate of the socket's descriptor, lent out for TCP_INFO sampling.
    socket: Option<std::os::fd::OwnedFd>,
}

struct State {
    core: SessionCore<Waiter>,
    conns: Vec<Option<ConnHandle>>,
    /// Bumped at every (re)login so tasks of older connections stand down.
    generation: u64,
    /// The epoch the next connection takes.
    next_epoch: u64,
    reconnecting: bool,
    /// Set when the session is gone for good.
    failed: Option<String>,
    params: SessionParams,
    tsih: u16,
}

struct Inner {
    state: Mutex<State>,
    cfg: SessionConfig,
    url: IscsiUrl,
    isid: [u8; 6],
    closing: AtomicBool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Delivers what the core asked for: commands and PDUs to datamovers, completions to
/// waiters.
fn flush(st: &mut State) {
    let State { core, conns, .. } = st;
    for a in core.actions.drain(..) {
        match a {
            Action::Command { conn, cmd } => {
                if let Some(Some(h)) = conns.get(conn) {
                    h.dm.send_command(cmd);
                }
            }
            Action::Send { conn, pdu } => {
                if let Some(Some(h)) = conns.get(conn) {
                    h.dm.send_control(pdu);
                }
            }
            Action::Forget { conn, itt } => {
                if let Some(Some(h)) = conns.get(conn) {
                    h.dm.forget(itt);
                }
            }
            Action::Adopt { conn, cmd, resume } => {
                if let Some(Some(h)) = conns.get(conn) {
                    h.dm.adopt(cmd, resume);
                }
            }
            Action::Complete { token, result } => {
                let _ = token.send(result);
            }
            Action::Async { conn, event } => {
                tracing::info!(conn, event, "asynchronous message from the target");
            }
        }
    }
}

/// A logged-in session to one target (one or more connections), or to one logical unit
/// through several portals (a URL listing several: [`crate::multipath`]); both offer the
/// same calls.
pub struct Session {
    kind: Kind,
}

enum Kind {
    One(Arc<Inner>),
    Paths(Arc<Multipath>),
}

struct Established {
    tsih: u16,
    params: SessionParams,
    limits: SessionLimits,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    conns: Vec<(Box<dyn InitiatorChannel>, LoginDone)>,
}

/// Logs in the leading connection (TSIH 0: a new session, or a reinstatement of one with the
/// same ISID) and then the other connections with the session's TSIH.
async fn establish(
    cfg: &SessionConfig,
    url: &IscsiUrl,
    isid: [u8; 6],
) -> Result<Established, Error> {
    let target = url
        .target
        .as_deref()
        .ok_or_else(|| Error::Invalid(format!("{url} names no target")))?;
    let addr = url.host_port();
    let mut stream = conn::connect(url.transport, &addr, cfg).await?;
    let lead = conn::login(
        &mut *stream,
        cfg.login_config(Some(target), isid, 0, 0, 1),
        cfg.login_timeout,
    )
    .await?;
    let params = lead.session.clone();
    let limits = SessionLimits {
        immediate_data: params.immediate_data,
        initial_r2t: params.initial_r2t,
        first_burst_length: params.first_burst_length,
        max_burst_length: params.max_burst_length,
        unsolicited_only_whole: url.transport == iscsi_login::TransportKind::Iser
            && cfg.iser_unsolicited_only_whole,
    };
    let cmd_sn = lead.exp_cmd_sn;
    let (exp_cmd_sn, max_cmd_sn, tsih) = (lead.exp_cmd_sn, lead.max_cmd_sn, lead.tsih);
    let want = cfg.connections.max(1).min(params.max_connections.max(1));
    let mut conns: Vec<(Box<dyn InitiatorChannel>, LoginDone)> = vec![(stream, lead)];
    for cid in 1..want {
        let mut s = conn::connect(url.transport, &addr, cfg).await?;
        let done = conn::login(
            &mut *s,
            cfg.login_config(Some(target), isid, tsih, cid, cmd_sn),
            cfg.login_timeout,
        )
        .await?;
        conns.push((s, done));
    }
    Ok(Established {
        tsih,
        params,
        limits,
        cmd_sn,
        exp_cmd_sn,
        max_cmd_sn,
        conns,
    })
}

/// Puts the logged-in connections to work: each enters full feature phase as its
/// transport's datamover, its notices fed to the core.
fn install(inner: &Arc<Inner>, st: &mut State, est: Established) {
    st.generation += 1;
    st.tsih = est.tsih;
    st.params = est.params;
    st.core
        .reset_session(est.limits, est.cmd_sn, est.exp_cmd_sn, est.max_cmd_sn);
    st.conns.clear();
    for (channel, done) in est.conns {
        let idx = st.conns.len();
        st.conns.push(None);
        start_connection(inner, st, idx, channel, &done);
        let got = st
            .core
            .add_connection(done.exp_stat_sn, done.max_send_seg());
        debug_assert_eq!(got, idx);
    }
    st.reconnecting = false;
    flush(st);
}

/// Puts one logged-in connection to work at index `idx` (its CID) as its transport's
/// datamover, its notices fed to the core; the core learns of it from the caller.
fn start_connection(
    inner: &Arc<Inner>,
    st: &mut State,
    idx: usize,
    channel: Box<dyn InitiatorChannel>,
    done: &LoginDone,
) {
    let cfg = InitiatorFfpConfig {
        digests: Digests {
            header: done.connection.header_digest,
            data: done.connection.data_digest,
        },
        max_recv_data_segment_length: done.connection.max_recv_data_segment_length,
        max_send_data_segment_length: done.max_send_seg(),
        max_burst_length: st.params.max_burst_length,
        exp_stat_sn: done.exp_stat_sn,
        max_outstanding_unexpected_pdus: done.connection.max_outstanding_unexpected_pdus_send,
        error_recovery_level: st.params.error_recovery_level,
    };
    let socket = channel.socket().and_then(|fd| fd.try_clone_to_owned().ok());
    let epoch = st.next_epoch;
    st.next_epoch += 1;
    let weak = Arc::downgrade(inner);
    let sink: datamover::NoticeSink = Arc::new(move |notices: &mut Vec<InitiatorNotice>| {
        if let Some(inner) = weak.upgrade() {
            on_notices(&inner, idx, epoch, notices);
        }
    });
    let dm = channel.into_full_feature(cfg, sink);
    while st.conns.len() <= idx {
        st.conns.push(None);
    }
    st.conns[idx] = Some(ConnHandle { epoch, dm, socket });
}

/// Whether connection `idx` is the one with `epoch` (not one that replaced it).
fn is_current(st: &State, idx: usize, epoch: u64) -> bool {
    st.conns
        .get(idx)
        .and_then(Option::as_ref)
        .is_some_and(|h| h.epoch == epoch)
}

/// One log line for a SNACK a datamover sent, or a command it gave up as lost.
fn log_recovery_notice(conn: usize, n: &InitiatorNotice, why: &str) {
    if let InitiatorNotice::Stalled { itt } = n {
        tracing::warn!(conn, "ITT 0x{itt:08x} heard nothing for long after a recovery, and SNACKs did not help: the target lost it; aborted, to be sent again as a new task");
        return;
    }
    let InitiatorNotice::SnackSent {
        what,
        itt,
        beg_run,
        run_length,
    } = n
    else {
        return;
    };
    let asked = match what {
        SnackFor::DataIn => {
            format!("Data SNACK for ITT 0x{itt:08x}: Data-In from DataSN {beg_run}")
        }
        SnackFor::R2t => format!("R2T SNACK for ITT 0x{itt:08x}: R2Ts from R2TSN {beg_run}"),
        SnackFor::Status => format!("Status SNACK: statuses from StatSN {beg_run}"),
        SnackFor::RData => format!("R-Data SNACK for ITT 0x{itt:08x}: its Data-In cut anew"),
        // Routine (asked for by the target), not a recovery: no log line.
        SnackFor::DataAck => return,
    };
    tracing::info!(conn, "{why}{asked} ({run_length}, 0: all) asked for again");
}

/// A batch of notices from connection `idx`'s datamover: all handled under one lock; the
/// first error (a protocol error, or the connection's end) ends the connection.
fn on_notices(inner: &Arc<Inner>, idx: usize, epoch: u64, notices: &mut Vec<InitiatorNotice>) {
    let mut st = inner.lock();
    if !is_current(&st, idx, epoch) {
        notices.clear();
        return;
    }
    let mut failed = None;
    for n in notices.drain(..) {
        log_recovery_notice(idx, &n, "");
        if failed.is_none() {
            failed = st.core.on_notice(idx, n).err();
        }
    }
    let reassign_again = st.core.take_reassign_retry();
    flush(&mut st);
    drop(st);
    if let Some(conn) = reassign_again {
        tokio::spawn(reassign_later(inner.clone(), conn));
    }
    if let Some(e) = failed {
        connection_lost(inner, idx, epoch, &format!("connection {idx}: {}", e.0));
    }
}

/// A connection ended: without `reconnect` the session fails (every command in flight gets
/// a `ConnectionLost` error); with it, every connection is closed, the commands are queued
/// again, and a task logs in again with the same ISID (session reinstatement).
fn connection_lost(inner: &Arc<Inner>, idx: usize, epoch: u64, reason: &str) {
    let mut st = inner.lock();
    if !is_current(&st, idx, epoch) {
        return;
    }
    let closing = inner.closing.load(Ordering::Acquire);
    if closing {
        // Logging out: the target closes the other connections of the session while the
        // Logout Response is on its way; only this connection's requests end here.
        if let Some(h) = st.conns[idx].take() {
            h.dm.abort();
        }
        st.core.on_connection_lost(idx, reason, false);
        flush(&mut st);
        return;
    }
    if st.params.error_recovery_level >= 2 {
        // Connection recovery: only this connection goes; its commands wait for it.
        let failed = st.conns[idx].take();
        let orphans = st.core.on_connection_failed(idx, reason, |itt| {
            failed
                .as_ref()
                .map_or_else(Default::default, |h| h.dm.resume_point(itt))
        });
        if let Some(h) = failed {
            h.dm.abort();
        }
        if st.core.failed_in_a_row(idx) > MAX_FRUITLESS_RECOVERIES {
            let why = format!(
                "{reason}; connection {idx} failed {} times in a row with no command completed, connection recovery given up",
                st.core.failed_in_a_row(idx)
            );
            give_up_connection_recovery(inner, &mut st, idx, &why);
            return;
        }
        tracing::warn!(conn = idx, "{reason}: logging the connection in again, {orphans} command(s) to reassign (ErrorRecoveryLevel 2)");
        flush(&mut st);
        tokio::spawn(recover_connection(inner.clone(), idx, reason.to_string()));
        return;
    }
    reinstate_session(inner, &mut st, reason);
}

/// Every connection is closed, and without `reconnect` the session fails (every command
/// gets a `ConnectionLost` error); with it, the commands are queued again and a task logs
/// in again with the same ISID (session reinstatement).
fn reinstate_session(inner: &Arc<Inner>, st: &mut State, reason: &str) {
    let retry = inner.cfg.reconnect;
    tracing::warn!("{reason}");
    if retry {
        st.core.requeue_orphans();
    }
    for i in 0..st.conns.len() {
        if let Some(h) = st.conns[i].take() {
            h.dm.abort();
            st.core.on_connection_lost(i, reason, retry);
        }
    }
    st.generation += 1;
    if retry {
        st.reconnecting = true;
        let inner2 = inner.clone();
        let reason = reason.to_string();
        tokio::spawn(async move { reconnect(inner2, reason).await });
    } else {
        st.core
            .fail_all(TaskError::ConnectionLost(reason.to_string()));
        st.failed = Some(reason.to_string());
    }
    flush(st);
}

/// Recoveries of one connection in a row with no command completed on it in between before
/// connection recovery gives way to session reinstatement (a target that drops the
/// connection again each time must not keep the session in a loop).
const MAX_FRUITLESS_RECOVERIES: u8 = 3;

/// Connection logins tried before connection recovery gives way to session reinstatement.
const CONNECTION_RECOVERY_ATTEMPTS: u32 = 3;

/// ErrorRecoveryLevel 2: logs connection `idx` in again (the same CID: the target logs the
/// failed one out implicitly) after DefaultTime2Wait, then reassigns the orphaned commands
/// to it. When it cannot log in, the session is reinstated (with `reconnect`) or fails.
async fn recover_connection(inner: Arc<Inner>, idx: usize, reason: String) {
    let wait = {
        let st = inner.lock();
        Duration::from_secs(u64::from(st.params.default_time2wait).min(5))
    };
    let mut last = String::new();
    for attempt in 0..CONNECTION_RECOVERY_ATTEMPTS {
        tokio::time::sleep(wait.max(Duration::from_millis(200))).await;
        let (tsih, cmd_sn, exp_stat_sn) = {
            let st = inner.lock();
            if inner.closing.load(Ordering::Acquire) || st.failed.is_some() || st.reconnecting {
                return;
            }
            // The login restarts connection `idx`: its ExpStatSN acknowledges the old
            // connection's statuses (a target may keep them for reassignment otherwise).
            (st.tsih, st.core.cmd_sn(), st.core.exp_stat_sn(idx))
        };
        match join_connection(&inner, tsih, idx as u16, cmd_sn, exp_stat_sn).await {
            Ok((channel, done)) => {
                let mut st = inner.lock();
                if inner.closing.load(Ordering::Acquire) || st.failed.is_some() || st.reconnecting {
                    return;
                }
                start_connection(&inner, &mut st, idx, channel, &done);
                st.core
                    .add_connection_at(idx, done.exp_stat_sn, done.max_send_seg());
                st.core.recovery.connection_recoveries += 1;
                let moved = st.core.reassign_to(idx);
                tracing::info!(conn = idx, attempt, "connection logged in again after: {reason}; {moved} command(s) reassigned to it (TASK REASSIGN)");
                flush(&mut st);
                return;
            }
            Err(e) => {
                tracing::warn!(
                    conn = idx,
                    attempt,
                    "connection recovery: login failed: {e}"
                );
                last = e.to_string();
            }
        }
    }
    let mut st = inner.lock();
    if inner.closing.load(Ordering::Acquire) || st.failed.is_some() || st.reconnecting {
        return;
    }
    give_up_connection_recovery(
        &inner,
        &mut st,
        idx,
        &format!("{reason}; connection recovery failed: {last}"),
    );
}

/// Connection `idx` cannot be recovered: its commands go on as new tasks on the session's
/// other connections (each aborted first, see `SessionCore::reissue_orphans`), and `idx`
/// stays down. With no other connection up, the session is reinstated (or fails).
fn give_up_connection_recovery(inner: &Arc<Inner>, st: &mut State, idx: usize, why: &str) {
    if st.core.live_connections().is_empty() {
        reinstate_session(inner, st, why);
        return;
    }
    let moved = st.core.reissue_orphans();
    tracing::warn!(
        conn = idx,
        "{why}; {moved} command(s) aborted and sent again as new tasks on the session's other connection(s), which carry on without it"
    );
    flush(st);
}

/// How long to wait before asking again when a TASK REASSIGN was answered "task still
/// allegiant".
const REASSIGN_RETRY: Duration = Duration::from_millis(300);

/// Reassigns the orphaned commands to connection `conn` after [`REASSIGN_RETRY`].
async fn reassign_later(inner: Arc<Inner>, conn: usize) {
    tokio::time::sleep(REASSIGN_RETRY).await;
    let mut st = inner.lock();
    let moved = st.core.reassign_to(conn);
    if moved > 0 {
        tracing::info!(conn, "{moved} command(s) reassigned again (the target had answered \"task still allegiant\")");
    }
    flush(&mut st);
}

/// Logs connection `cid` in to the session `tsih`; `exp_stat_sn` is the ExpStatSN of the
/// connection it restarts (0 for a new one).
async fn join_connection(
    inner: &Inner,
    tsih: u16,
    cid: u16,
    cmd_sn: u32,
    exp_stat_sn: u32,
) -> Result<(Box<dyn InitiatorChannel>, LoginDone), Error> {
    let cfg = &inner.cfg;
    let url = &inner.url;
    let target = url
        .target
        .as_deref()
        .ok_or_else(|| Error::Invalid(format!("{url} names no target")))?;
    let mut stream = conn::connect(url.transport, &url.host_port(), cfg).await?;
    let mut login = cfg.login_config(Some(target), inner.isid, tsih, cid, cmd_sn);
    login.exp_stat_sn = exp_stat_sn;
    let done = conn::login(&mut *stream, login, cfg.login_timeout).await?;
    Ok((stream, done))
}

async fn reconnect(inner: Arc<Inner>, reason: String) {
    let wait = {
        let st = inner.lock();
        Duration::from_secs(u64::from(st.params.default_time2wait).clamp(1, 5))
    };
    let mut last = String::new();
    for attempt in 0..inner.cfg.reconnect_attempts.max(1) {
        tokio::time::sleep(if attempt == 0 {
            Duration::from_millis(200)
        } else {
            wait
        })
        .await;
        if inner.closing.load(Ordering::Acquire) {
            break;
        }
        match establish(&inner.cfg, &inner.url, inner.isid).await {
            Ok(est) => {
                let mut st = inner.lock();
                tracing::info!(attempt, "session reinstated after: {reason}");
                st.core.recovery.reinstatements += 1;
                install(&inner, &mut st, est);
                return;
            }
            Err(e) => {
                tracing::warn!(attempt, "reconnect failed: {e}");
                last = e.to_string();
            }
        }
    }
    let mut st = inner.lock();
    let why = format!("{reason}; reconnecting failed: {last}");
    st.core.fail_all(TaskError::ConnectionLost(why.clone()));
    st.failed = Some(why);
    st.reconnecting = false;
    flush(&mut st);
}

/// At ErrorRecoveryLevel ≥ 1, while a command waits at the target's ExpCmdSN, pings go this
/// often: two answers with ExpCmdSN still at its CmdSN show it was lost on the way.
const LOST_COMMAND_CHECK: Duration = Duration::from_millis(250);

/// Pings every connection each `every` (and, at ErrorRecoveryLevel ≥ 1, each
/// [`LOST_COMMAND_CHECK`] while a command may be lost); a connection whose ping goes
/// unanswered for `timeout` is lost.
async fn keepalive(inner: std::sync::Weak<Inner>, every: Duration, timeout: Duration) {
    let mut last_ping = tokio::time::Instant::now();
    // At level 0 nothing is probed between pings: the task sleeps the whole interval.
    let tick_for = |erl: u8| {
        if erl >= 1 {
            every.min(LOST_COMMAND_CHECK)
        } else {
            every
        }
    };
    let mut tick = inner
        .upgrade()
        .map_or(every, |i| tick_for(i.lock().params.error_recovery_level));
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.closing.load(Ordering::Acquire) {
            return;
        }
        let (generation, pings) = {
            let mut st = inner.lock();
            let recovery = st.params.error_recovery_level >= 1;
            tick = tick_for(st.params.error_recovery_level);
            let stalled = recovery && probe_datamovers(&mut st);
            let probe = recovery && (stalled || st.core.waiting_at_exp_cmd_sn().is_some());
            if last_ping.elapsed() < every && !probe {
                continue;
            }
            last_ping = tokio::time::Instant::now();
            let generation = st.generation;
            let mut pings = Vec::new();
            for c in st.core.live_connections() {
                let Some(epoch) = st.conns.get(c).and_then(Option::as_ref).map(|h| h.epoch) else {
                    continue;
                };
                let (tx, rx) = oneshot::channel();
                if st.core.ping(c, tx).is_ok() {
                    pings.push((c, epoch, rx));
                }
            }
            flush(&mut st);
            (generation, pings)
        };
        let mut answered = true;
        for (c, epoch, rx) in pings {
            if !ping_answered(&inner, c, rx, timeout).await {
                answered = false;
                connection_lost(
                    &inner,
                    c,
                    epoch,
                    &format!("NOP-Out ping unanswered for {} s", timeout.as_secs()),
                );
            }
        }
        // The answers brought the target's ExpCmdSN: at ErrorRecoveryLevel ≥ 1 a command
        // it still waits for since the last round was lost on the way, and goes again.
        let mut st = inner.lock();
        if answered && st.generation == generation && st.params.error_recovery_level >= 1 {
            if let Some(itt) = st.core.retry_lost_command() {
                tracing::warn!(
                    "command ITT 0x{itt:08x} never reached the target (its ExpCmdSN stayed at its CmdSN): sent again"
                );
            }
            flush(&mut st);
        }
    }
}

/// Waits up to `timeout` for the answer to a ping on connection `conn`. At
/// ErrorRecoveryLevel ≥ 1 the ping or its answer may have been discarded for a damaged
/// header (found in a 5-minute run damaging 1 PDU in 10^4: the connection was given up for
/// it): when half the time passes unanswered a second ping goes, and either answer will do.
async fn ping_answered(
    inner: &Arc<Inner>,
    conn: usize,
    mut rx: oneshot::Receiver<Result<Reply, TaskError>>,
    timeout: Duration,
) -> bool {
    if inner.lock().params.error_recovery_level == 0 {
        return tokio::time::timeout(timeout, rx).await.is_ok();
    }
    let half = timeout / 2;
    if tokio::time::timeout(half, &mut rx).await.is_ok() {
        return true;
    }
    let (tx, again) = oneshot::channel();
    {
        let mut st = inner.lock();
        if st.core.ping(conn, tx).is_err() {
            return false;
        }
        flush(&mut st);
    }
    tokio::select! {
        _ = rx => true,
        _ = again => true,
        _ = tokio::time::sleep(timeout - half) => false,
    }
}

/// ErrorRecoveryLevel ≥ 1: each live connection's datamover asks again for what a stalled
/// command waits for (`InitiatorDatamover::probe`); its notices go to the core. True when a
/// command is stalled: a ping's answer then shows any status lost on the way.
fn probe_datamovers(st: &mut State) -> bool {
    let mut stalled = false;
    for c in st.core.live_connections() {
        let Some(h) = st.conns.get(c).and_then(Option::as_ref) else {
            continue;
        };
        let (notices, s) = h.dm.probe();
        stalled |= s;
        for n in notices {
            log_recovery_notice(c, &n, "heard nothing for a second: ");
            let _ = st.core.on_notice(c, n);
        }
    }
    stalled
}

/// One path of a multipath session: a session to one portal.
struct SessionPath(Arc<Session>);

impl PathLink for SessionPath {
    fn submit(&self, req: CommandRequest) -> PendingCommand {
        self.0.submit(req)
    }
    fn failure(&self) -> Option<String> {
        self.0.failure()
    }
    fn abort(&self, itt: u32) -> BoxFut<'_, Result<u8, Error>> {
        Box::pin(self.0.abort_task(itt))
    }
    fn logout(&self) -> BoxFut<'_, Result<(), Error>> {
        Box::pin(self.0.logout_here())
    }
    fn close(&self) {
        self.0.shutdown(false);
    }
    fn params(&self) -> Option<SessionParams> {
        Some(self.0.params())
    }
    fn window(&self) -> Option<u32> {
        Some(self.0.window())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Logs in on every portal of `url` and starts routing ([`crate::multipath`]).
async fn connect_paths(url: &IscsiUrl, cfg: SessionConfig) -> Result<Arc<Multipath>, Error> {
    let paths = url.path_urls();
    let mcfg = cfg.multipath.clone();
    let opener: Opener = {
        let paths = paths.clone();
        Arc::new(move |i| {
            let url = paths[i].clone();
            let cfg = cfg.clone();
            Box::pin(async move {
                let s = Session::connect_one(&url, cfg).await?;
                Ok(Arc::new(SessionPath(Arc::new(s))) as Arc<dyn PathLink>)
            })
        })
    };
    let portals = paths.iter().map(IscsiUrl::host_port).collect();
    Multipath::start(url.clone(), portals, mcfg, opener).await
}

/// The sessions of a multipath session's paths up now.
fn path_sessions(m: &Multipath) -> Vec<Arc<Session>> {
    m.links()
        .iter()
        .filter_map(|l| session_of(l.as_ref()))
        .collect()
}

/// The session of the path a multipath session sends to now.
fn current_session(m: &Multipath) -> Option<Arc<Session>> {
    m.current().and_then(|l| session_of(l.as_ref()))
}

/// The session behind a path link (every link a session opens is a [`SessionPath`]).
fn session_of(link: &dyn PathLink) -> Option<Arc<Session>> {
    link.as_any()
        .downcast_ref::<SessionPath>()
        .map(|p| p.0.clone())
}

impl Session {
    /// Logs in to the URL's target (it must name one) with `cfg`'s connections. A URL that
    /// lists several portals logs in on each (one session per portal) and gives a multipath
    /// session ([`crate::multipath`]).
    pub async fn connect(url: &IscsiUrl, cfg: SessionConfig) -> Result<Session, Error> {
        if url.is_multipath() {
            let m = connect_paths(url, cfg).await?;
            return Ok(Session {
                kind: Kind::Paths(m),
            });
        }
        Session::connect_one(url, cfg).await
    }

    /// Logs in to the URL's first portal (one path of a multipath session, or the whole).
    pub(crate) async fn connect_one(url: &IscsiUrl, cfg: SessionConfig) -> Result<Session, Error> {
        let mut r = [0u8; 4];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut r);
        let isid = [0x80, 0x00, r[0], r[1], r[2], r[3]];
        let est = establish(&cfg, url, isid).await?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                core: SessionCore::new(SessionLimits::default(), 0, 0, 0),
                conns: Vec::new(),
                generation: 0,
                next_epoch: 0,
                reconnecting: false,
                failed: None,
                params: est.params.clone(),
                tsih: 0,
            }),
            cfg,
            url: url.clone(),
            isid,
            closing: AtomicBool::new(false),
        });
        {
            let mut st = inner.lock();
            install(&inner, &mut st, est);
        }
        if let Some(every) = inner.cfg.nop_interval {
            tokio::spawn(keepalive(
                Arc::downgrade(&inner),
                every,
                inner.cfg.nop_timeout,
            ));
        }
        Ok(Session {
            kind: Kind::One(inner),
        })
    }

    /// The URL this session logged in to.
    pub fn url(&self) -> &IscsiUrl {
        match &self.kind {
            Kind::One(inner) => &inner.url,
            Kind::Paths(m) => m.url(),
        }
    }

    /// The URL's LUN (0 when it names none).
    pub fn default_lun(&self) -> u16 {
        self.url().lun.unwrap_or(0)
    }

    /// The negotiated session parameters (multipath: the path in use's).
    pub fn params(&self) -> SessionParams {
        match &self.kind {
            Kind::One(inner) => inner.lock().params.clone(),
            Kind::Paths(m) => m.params(),
        }
    }

    /// Error recovery events so far (SNACKs, retries, reinstatements; multipath: summed
    /// over the paths' sessions up now).
    pub fn recovery(&self) -> RecoveryStats {
        match &self.kind {
            Kind::One(inner) => inner.lock().core.recovery,
            Kind::Paths(m) => path_sessions(m)
                .iter()
                .fold(RecoveryStats::default(), |a, s| a.plus(s.recovery())),
        }
    }

    /// The registration caches of the connections up now: how often a write's data had been
    /// registered for an earlier command (iSER; zeros over TCP).
    pub fn write_registrations(&self) -> datamover::RegistrationStats {
        let inner = match &self.kind {
            Kind::One(inner) => inner,
            Kind::Paths(m) => {
                return path_sessions(m)
                    .iter()
                    .fold(Default::default(), |a, s| a.plus(s.write_registrations()))
            }
        };
        let st = inner.lock();
        st.conns.iter().flatten().fold(Default::default(), |a, h| {
            a.plus(h.dm.write_registrations())
        })
    }

    /// The target-assigned session handle (multipath: the path in use's, 0 without one).
    pub fn tsih(&self) -> u16 {
        match &self.kind {
            Kind::One(inner) => inner.lock().tsih,
            Kind::Paths(m) => current_session(m).map_or(0, |s| s.tsih()),
        }
    }

    /// Connections currently up (multipath: over every path).
    pub fn connection_count(&self) -> usize {
        match &self.kind {
            Kind::One(inner) => inner.lock().core.live_connections().len(),
            Kind::Paths(m) => path_sessions(m).iter().map(|s| s.connection_count()).sum(),
        }
    }

    /// Duplicates of the descriptors of the connections up now, in connection order (for
    /// TCP_INFO sampling; each stays valid after the connection closes, reading as closed).
    pub fn connection_sockets(&self) -> Vec<std::os::fd::OwnedFd> {
        let inner = match &self.kind {
            Kind::One(inner) => inner,
            Kind::Paths(m) => {
                return path_sessions(m)
                    .iter()
                    .flat_map(|s| s.connection_sockets())
                    .collect()
            }
        };
        let st = inner.lock();
        st.conns
            .iter()
            .flatten()
            .filter_map(|h| h.socket.as_ref()?.try_clone().ok())
            .collect()
    }

    /// Commands the target accepts right now (MaxCmdSN - ExpCmdSN + 1; multipath: on the
    /// path in use).
    pub fn window(&self) -> u32 {
        match &self.kind {
            Kind::One(inner) => inner.lock().core.window_size(),
            Kind::Paths(m) => m.window(),
        }
    }

    /// Each path of a multipath session: its portal, whether it is up, its ALUA state and
    /// the commands it carried; one entry for a single-path session.
    pub fn paths(&self) -> Vec<PathStatus> {
        match &self.kind {
            Kind::One(inner) => vec![PathStatus {
                portal: inner.url.host_port(),
                up: inner.lock().failed.is_none(),
                down_because: inner.lock().failed.clone(),
                ..PathStatus::default()
            }],
            Kind::Paths(m) => m.status(),
        }
    }

    /// Why the session can take no more commands, once it cannot (its connections are gone
    /// for good, or it was closed).
    pub fn failure(&self) -> Option<String> {
        match &self.kind {
            Kind::One(inner) => inner.lock().failed.clone(),
            Kind::Paths(m) => m.failure(),
        }
    }

    /// Sends (or queues, while the CmdSN window is closed) a SCSI command. On a multipath
    /// session the command goes to the path in use and, should that path fail, to another.
    pub fn submit(&self, req: CommandRequest) -> PendingCommand {
        let inner = match &self.kind {
            Kind::One(inner) => inner,
            Kind::Paths(m) => return m.submit(req),
        };
        let (tx, rx) = oneshot::channel();
        let mut st = inner.lock();
        if let Some(why) = &st.failed {
            return PendingCommand {
                itt: 0,
                rx: Pending::Failed(Error::Task(TaskError::ConnectionLost(why.clone()))),
            };
        }
        let itt = st.core.submit(tx, req);
        flush(&mut st);
        PendingCommand {
            itt,
            rx: Pending::Sent(rx),
        }
    }

    /// Runs a SCSI command and returns whatever status it ended with.
    pub async fn execute(&self, req: CommandRequest) -> Result<CommandResult, Error> {
        self.submit(req).wait().await
    }

    /// Runs a SCSI command, sending it again while it ends in UNIT ATTENTION, as initiators
    /// do: a new session's first command usually gets the power-on one, and a target changed
    /// while it serves reports each change once per nexus; the command itself was not
    /// executed. Unit attentions queue up one per event: at most [`UNIT_ATTENTION_TRIES`]
    /// tries drain them. A command refused with NOT READY, ASYMMETRIC ACCESS STATE
    /// TRANSITION (04h/0Ah: a gateway taking a LUN over or in its hold-down; not executed
    /// either) is sent again after a growing pause for at most [`TRANSITION_WAIT`], as Linux
    /// does. The last try's status is returned whatever it is.
    pub async fn execute_past_unit_attentions(
        &self,
        req: CommandRequest,
    ) -> Result<CommandResult, Error> {
        let deadline = Instant::now() + TRANSITION_WAIT;
        let mut pause = Duration::from_millis(20);
        let mut attentions = 1;
        let mut r = self.execute(req.clone()).await?;
        loop {
            if r.is_unit_attention() && attentions < UNIT_ATTENTION_TRIES {
                attentions += 1;
            } else if r.is_alua_transition() && Instant::now() + pause < deadline {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            } else {
                return Ok(r);
            }
            r = self.execute(req.clone()).await?;
        }
    }

    /// Runs a command that must end GOOD, past unit attentions
    /// ([`Session::execute_past_unit_attentions`]).
    pub async fn run(&self, what: &str, req: CommandRequest) -> Result<CommandResult, Error> {
        self.execute_past_unit_attentions(req).await?.good(what)
    }

    /// The single-path state, or what a multipath session says to a call that has no
    /// meaning across paths.
    fn single(&self, what: &str) -> Result<&Arc<Inner>, Error> {
        match &self.kind {
            Kind::One(inner) => Ok(inner),
            Kind::Paths(_) => Err(Error::Invalid(format!(
                "{what} is not available on a multipath session"
            ))),
        }
    }

    async fn immediate(
        &self,
        send: impl FnOnce(&mut SessionCore<Waiter>, Waiter) -> Result<u32, Waiter>,
        timeout: Duration,
    ) -> Result<Reply, Error> {
        let inner = self.single("this request")?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = inner.lock();
            if send(&mut st.core, tx).is_err() {
                return Err(Error::Task(TaskError::SessionClosed));
            }
            flush(&mut st);
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => Err(Error::Timeout(format!(
                "no answer within {} s",
                timeout.as_secs()
            ))),
            Ok(Err(_)) => Err(Error::Task(TaskError::SessionClosed)),
            Ok(Ok(Err(e))) => Err(Error::Task(e)),
            Ok(Ok(Ok(r))) => Ok(r),
        }
    }

    /// Declares a new MaxRecvDataSegmentLength on every live connection by a Text
    /// negotiation in full feature phase (RFC 7143 §13.12: the key may change at any time).
    /// Until the target answers, Data-In of the old and the new size are accepted; then
    /// only the new. At ErrorRecoveryLevel ≥ 1 a read begun before whose Data-In must be
    /// asked for again takes an R-Data SNACK (the target resends them cut anew).
    /// Connections logged in later declare the session's configured value.
    pub async fn set_max_recv_data_segment_length(&self, len: u32) -> Result<(), Error> {
        if !(512..=16_777_215).contains(&len) {
            return Err(Error::Invalid(format!(
                "MaxRecvDataSegmentLength {len} is outside 512..16777215"
            )));
        }
        if let Kind::Paths(m) = &self.kind {
            for s in path_sessions(m) {
                Box::pin(s.set_max_recv_data_segment_length(len)).await?;
            }
            return Ok(());
        }
        let inner = self.single("MaxRecvDataSegmentLength")?;
        const KEY: &str = "MaxRecvDataSegmentLength";
        let keys = Bytes::from(iscsi_login::text::encode(&[(KEY, len.to_string())]));
        let conns = inner.lock().core.live_connections();
        for c in conns {
            let dm = {
                let st = inner.lock();
                st.conns
                    .get(c)
                    .and_then(Option::as_ref)
                    .map(|h| h.dm.clone())
            };
            let Some(dm) = dm else { continue };
            dm.set_max_recv_data_segment_length(len, false);
            let keys = keys.clone();
            let reply = self
                .immediate(|core, t| core.text(c, keys, t), Duration::from_secs(30))
                .await?;
            let Reply::Text(data) = reply else {
                return Err(Error::Protocol(format!("unexpected reply {reply:?}")));
            };
            let answer = iscsi_login::text::parse(&data)
                .map_err(|e| Error::Protocol(format!("bad Text Response: {e}")))?;
            if let Some((_, v)) = answer
                .iter()
                .find(|(k, v)| k == KEY && (v == "Reject" || v == "NotUnderstood"))
            {
                return Err(Error::Protocol(format!(
                    "the target answered {KEY}={len} with {v}"
                )));
            }
            dm.set_max_recv_data_segment_length(len, true);
        }
        Ok(())
    }

    /// ABORT TASK for a command from [`Session::submit`]; returns the TMF response code
    /// (0 function complete, 1 task does not exist). Not on a multipath session, whose
    /// commands may move between paths.
    pub async fn abort_task(&self, itt: u32) -> Result<u8, Error> {
        match self
            .immediate(|c, t| c.abort_task(itt, t), Duration::from_secs(30))
            .await?
        {
            Reply::Tmf(r) => Ok(r),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// LOGICAL UNIT RESET; returns the TMF response code (multipath: through the path in
    /// use).
    pub async fn lun_reset(&self, lun: u16) -> Result<u8, Error> {
        if let Kind::Paths(m) = &self.kind {
            let s = current_session(m).ok_or_else(|| m.no_path_error())?;
            return Box::pin(s.lun_reset(lun)).await;
        }
        match self
            .immediate(|c, t| c.lun_reset(lun, t), Duration::from_secs(30))
            .await?
        {
            Reply::Tmf(r) => Ok(r),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Pings the target on every connection; returns the slowest round trip (multipath:
    /// every path up).
    pub async fn ping(&self) -> Result<Duration, Error> {
        if let Kind::Paths(m) = &self.kind {
            let mut slowest = Duration::ZERO;
            for s in path_sessions(m) {
                slowest = slowest.max(Box::pin(s.ping()).await?);
            }
            return Ok(slowest);
        }
        let inner = self.single("ping")?;
        let conns = inner.lock().core.live_connections();
        let start = Instant::now();
        for c in conns {
            self.immediate(|core, t| core.ping(c, t), inner.cfg.nop_timeout)
                .await?;
        }
        Ok(start.elapsed())
    }

    /// Logs out (closing the session) and closes every connection (multipath: of every
    /// path; the first failure is returned).
    pub async fn logout(self) -> Result<(), Error> {
        self.logout_here().await
    }

    /// [`Session::logout`] on a shared reference (multipath paths are shared with the
    /// commands they carry); the session is closed afterwards whatever the answer.
    pub(crate) async fn logout_here(&self) -> Result<(), Error> {
        let inner = match &self.kind {
            Kind::One(inner) => inner,
            Kind::Paths(m) => return m.logout().await,
        };
        inner.closing.store(true, Ordering::Release);
        let r = self
            .immediate(|c, t| c.logout(t), Duration::from_secs(10))
            .await;
        let closing = self.shutdown(matches!(r, Ok(Reply::Logout(0))));
        // Bounded: a peer that never finishes the close costs this much, not a hang.
        // All close at once; waiting on each in turn takes as long as the slowest.
        let _ = tokio::time::timeout(LOGOUT_CLOSE_WAIT, async {
            for dm in &closing {
                dm.when_closed().await;
            }
        })
        .await;
        match r? {
            Reply::Logout(0) => Ok(()),
            Reply::Logout(code) => Err(Error::Protocol(format!(
                "logout answered with response {code}"
            ))),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Closes every connection (`logged_out`: the target answered a logout) and fails what is
    /// left; returns the datamovers closing.
    pub(crate) fn shutdown(&self, logged_out: bool) -> Vec<Arc<dyn InitiatorDatamover>> {
        let inner = match &self.kind {
            Kind::One(inner) => inner,
            Kind::Paths(m) => {
                m.close();
                return Vec::new();
            }
        };
        inner.closing.store(true, Ordering::Release);
        let mut st = inner.lock();
        st.generation += 1;
        let closing: Vec<_> = st
            .conns
            .iter_mut()
            .filter_map(Option::take)
            .map(|h| h.dm)
            .collect();
        for dm in &closing {
            if logged_out {
                dm.close_after_logout();
            } else {
                dm.close();
            }
        }
        st.core
            .fail_all(TaskError::ConnectionLost("the session was closed".into()));
        st.failed
            .get_or_insert_with(|| "the session was closed".into());
        flush(&mut st);
        closing
    }

    /// Kills the first connection without logging out, as a network failure would (tests
    /// of the recovery paths): at ErrorRecoveryLevel 2 that connection is recovered, below
    /// it every connection goes (session reinstatement with `reconnect`). Multipath: the
    /// path in use's.
    pub fn break_connections(&self) {
        let inner = match &self.kind {
            Kind::One(inner) => inner,
            Kind::Paths(m) => {
                if let Some(s) = current_session(m) {
                    s.break_connections();
                }
                return;
            }
        };
        let first = {
            let st = inner.lock();
            st.conns
                .iter()
                .enumerate()
                .find_map(|(i, c)| c.as_ref().map(|h| (i, h.epoch)))
        };
        if let Some((i, epoch)) = first {
            {
                let st = inner.lock();
                if let Some(Some(h)) = st.conns.get(i) {
                    h.dm.abort();
                }
            }
            connection_lost(inner, i, epoch, "connection broken by the caller");
        }
    }

    // ------------------------------------------------------------------ SCSI helpers

    /// TEST UNIT READY.
    pub async fn test_unit_ready(&self, lun: u16) -> Result<(), Error> {
        self.run(
            "TEST UNIT READY",
            CommandRequest::none(lun, scsi::test_unit_ready()),
        )
        .await
        .map(|_| ())
    }

    /// Standard INQUIRY data.
    pub async fn inquiry(&self, lun: u16) -> Result<Inquiry, Error> {
        let r = self
            .run(
                "INQUIRY",
                CommandRequest::read(lun, scsi::inquiry(None, 255), 255),
            )
            .await?;
        Inquiry::parse(&r.data)
            .ok_or_else(|| Error::Protocol(format!("INQUIRY returned {} bytes", r.data.len())))
    }

    /// A VPD page, raw.
    pub async fn inquiry_vpd(&self, lun: u16, page: u8) -> Result<Bytes, Error> {
        let r = self
            .run(
                "INQUIRY (VPD)",
                CommandRequest::read(lun, scsi::inquiry(Some(page), 4096), 4096),
            )
            .await?;
        Ok(r.data)
    }

    /// READ CAPACITY(10).
    pub async fn read_capacity10(&self, lun: u16) -> Result<Capacity, Error> {
        let r = self
            .run(
                "READ CAPACITY(10)",
                CommandRequest::read(lun, scsi::read_capacity10(), 8),
            )
            .await?;
        Capacity::parse10(&r.data)
            .ok_or_else(|| Error::Protocol("short READ CAPACITY(10) data".into()))
    }

    /// READ CAPACITY(16).
    pub async fn read_capacity16(&self, lun: u16) -> Result<Capacity, Error> {
        let r = self
            .run(
                "READ CAPACITY(16)",
                CommandRequest::read(lun, scsi::read_capacity16(32), 32),
            )
            .await?;
        Capacity::parse16(&r.data)
            .ok_or_else(|| Error::Protocol("short READ CAPACITY(16) data".into()))
    }

    /// READ CAPACITY(16), or (10) when the target does not know (16).
    pub async fn capacity(&self, lun: u16) -> Result<Capacity, Error> {
        match self.read_capacity16(lun).await {
            Ok(c) => Ok(c),
            Err(Error::Scsi { .. }) => self.read_capacity10(lun).await,
            Err(e) => Err(e),
        }
    }

    /// REPORT LUNS.
    pub async fn report_luns(&self) -> Result<Vec<u16>, Error> {
        let r = self
            .run(
                "REPORT LUNS",
                CommandRequest::read(0, scsi::report_luns(16384), 16384),
            )
            .await?;
        scsi::parse_report_luns(&r.data)
            .ok_or_else(|| Error::Protocol("short REPORT LUNS data".into()))
    }

    /// READ `blocks` blocks at `lba` (READ(10) or READ(16) as they need) as ONE command.
    pub async fn read(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        block_size: u32,
    ) -> Result<Bytes, Error> {
        let len = blocks as u64 * block_size as u64;
        let len = u32::try_from(len).map_err(|_| {
            Error::Invalid(format!(
                "a read of {len} bytes is too large for one command"
            ))
        })?;
        let cdb = scsi::read_write(false, lba, blocks, false);
        let what = if cdb.len() == 10 {
            "READ(10)"
        } else {
            "READ(16)"
        };
        Ok(self
            .run(what, CommandRequest::read(lun, cdb, len))
            .await?
            .data)
    }

    /// WRITE `data` (a whole number of blocks) at `lba` as ONE command.
    pub async fn write(
        &self,
        lun: u16,
        lba: u64,
        block_size: u32,
        data: Bytes,
    ) -> Result<(), Error> {
        if block_size == 0 || !data.len().is_multiple_of(block_size as usize) {
            return Err(Error::Invalid(format!(
                "{} bytes is not a whole number of {block_size}-byte blocks",
                data.len()
            )));
        }
        let blocks = u32::try_from(data.len() / block_size as usize)
            .map_err(|_| Error::Invalid("write too large for one command".into()))?;
        let cdb = scsi::read_write(true, lba, blocks, false);
        let what = if cdb.len() == 10 {
            "WRITE(10)"
        } else {
            "WRITE(16)"
        };
        self.run(what, CommandRequest::write(lun, cdb, data))
            .await
            .map(|_| ())
    }

    /// SYNCHRONIZE CACHE of the whole logical unit.
    pub async fn synchronize_cache(&self, lun: u16) -> Result<(), Error> {
        self.run(
            "SYNCHRONIZE CACHE",
            CommandRequest::none(lun, scsi::synchronize_cache(0, 0)),
        )
        .await
        .map(|_| ())
    }

    /// UNMAP the given (LBA, blocks) extents.
    pub async fn unmap(&self, lun: u16, extents: &[(u64, u32)]) -> Result<(), Error> {
        let (cdb, list) = scsi::unmap(extents);
        self.run("UNMAP", CommandRequest::write(lun, cdb, Bytes::from(list)))
            .await
            .map(|_| ())
    }

    /// Any CDB, with optional data in or out; returns the status as it came.
    pub async fn raw(
        &self,
        lun: u16,
        cdb: &[u8],
        read_len: u32,
        write: Bytes,
    ) -> Result<CommandResult, Error> {
        if cdb.is_empty() || cdb.len() > 260 {
            return Err(Error::Invalid(format!("a CDB of {} bytes", cdb.len())));
        }
        self.execute(CommandRequest {
            lun,
            cdb: cdb.to_vec(),
            read_len,
            write,
            attr: 1,
        })
        .await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shutdown(false);
    }
}

/// SendTargets discovery: logs in a discovery session at the URL's portal, asks for
/// `SendTargets=All`, logs out.
pub async fn discover(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Vec<DiscoveredTarget>, Error> {
    // Discovery runs over TCP whatever the URL's transport (as Linux does it): an iser://
    // portal is asked on the same address.
    let addr = url.host_port();
    let mut stream = conn::connect(iscsi_login::TransportKind::Tcp, &addr, cfg).await?;
    let mut r = [0u8; 4];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut r);
    let isid = [0x80, 0x00, r[0], r[1], r[2], r[3]];
    let mut lc = cfg.login_config(None, isid, 0, 0, 1);
    // Digests are pointless for a few hundred bytes of text; keep what the caller asked.
    lc.session.max_connections = 1;
    let done = conn::login(&mut *stream, lc, cfg.login_timeout).await?;
    let digests = Digests {
        header: done.connection.header_digest,
        data: done.connection.data_digest,
    };
    let text = tokio::time::timeout(
        cfg.login_timeout,
        conn::text_exchange(
            &mut *stream,
            digests,
            &done,
            done.exp_cmd_sn,
            b"SendTargets=All\0",
        ),
    )
    .await
    .map_err(|_| Error::Timeout("no SendTargets answer".into()))??;
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        conn::logout_plain(
            &mut *stream,
            digests,
            done.exp_cmd_sn,
            done.exp_stat_sn.wrapping_add(1),
        ),
    )
    .await;
    iscsi_login::parse_send_targets(&text)
        .map_err(|e| Error::Protocol(format!("bad SendTargets answer: {e:?}")))
}
