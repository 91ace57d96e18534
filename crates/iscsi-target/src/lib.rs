//! The ironsan iSCSI target runtime. It listens on portals, runs each connection's login
//! through the sans-IO `iscsi-login` state machine, keeps sessions (TSIH allocation,
//! reinstatement, several connections per session), orders commands across a session's
//! connections with the `iscsi-session` CmdSN window, runs them on the `scsi` engine, and
//! moves data only through the `datamover` boundary: portals accept connections of their
//! transport ([`datamover::Portal`]), login runs over a [`datamover::LoginChannel`] told its
//! transport kind, and full feature phase drives the [`datamover::Datamover`] that channel
//! yields — no socket type appears here, and no transport crate: the portals are built from
//! the configuration by the `transports` crate and handed in ([`Target::serve`]), and more
//! can be added and removed while it runs ([`Target::add_portal`], [`Target::remove_portal`]),
//! kept in one list that SendTargets reads too. Each target's LUNs live in its
//! `scsi::Device`, built from the configuration at start; LUNs can be added and removed
//! while it runs as well ([`Target::add_lun`], [`Target::remove_lun`]), its sessions told
//! by the REPORTED LUNS DATA HAS CHANGED unit attention; [`inspect`] describes each target
//! as it is now, for the control socket.
//! It also answers NOP, Text (SendTargets), Logout and task management, pings idle
//! connections, and announces shutdown with an Async Message. Error recovery above level 0
//! has one module per level: `erl1` (SNACK) and `erl2` (a failed connection's tasks kept for
//! TASK REASSIGN on another). For diagnosis, every
//! connection's bytes can be recorded into a pcapng trace ([`Bound::trace_to`]) and an
//! observer can watch each accepted socket (e.g. sample its TCP_INFO) for as long as the
//! connection lives ([`Bound::observe_connections`]); [`stats`] counts logins, sessions,
//! connections and error recovery for an exporter ([`Target::stats`], [`Target::lun_stats`]). With the `fuzzing` feature (the fuzz
//! workspace's), the sans-IO session core is reachable as `fuzzing`.

mod admin;
pub mod auth_throttle;
pub mod config;
mod erl1;
mod erl2;
pub mod inspect;
mod portals;
mod session;
pub mod stats;

/// The sans-IO session core, reachable by the fuzz target that drives it without sockets
/// (`fuzz/src/session_core.rs`); not an API: it exists only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::session::core::*;
}

pub use admin::{ConnectionInfo, SessionInfo, SessionKeys};
pub use config::{
    error_recovery_level_help, Config, ConfigError, IserProvider, PortalSpec, DEFAULT_IQN,
    DEFAULT_PORTAL, MAX_ERROR_RECOVERY_LEVEL,
};
pub use datamover::ConnectionObserver;

use bytes::Bytes;
use datamover::budget::Budget;
use datamover::{CmdSnState, FfpConfig, LoginChannel, Notice, PeerTimeouts, TransportKind};

use iscsi_login::directory::Portal;
use iscsi_login::params::SessionType;
use iscsi_login::pdu::{LoginRequest, LoginResponse, LoginStatus};
use iscsi_login::target::{
    ExistingSession, LoginState, TargetLimits, TargetLogin, TargetLoginConfig,
};
use iscsi_session::WriteLimits;
use iscsi_wire::{AsyncMessage, Bhs, Digests};
use session::{Conn, Session};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
use config::MAX_WRITE_LEN;

/// A running target: configuration, SCSI devices and live sessions.
pub struct Target {
    directory: Arc<config::Directory>,
    /// Each target's SCSI device by lower-case name; targets come and go while it runs
    /// (`admin`).
    devices: std::sync::RwLock<HashMap<String, Arc<scsi::Device>>>,
    /// Where RAM LUNs' images live, for targets and LUNs added later too.
    images: Arc<scsi::ImageProvider>,
    /// Held by a live change of targets or of the configuration (`admin`), so that two
    /// never interleave.
    changing: tokio::sync::Mutex<()>,
    /// `max_immediate_commands`, read by every command: a top-level setting, fixed until a
    /// restart, so kept here rather than read from the configuration snapshot each time.
    max_immediate_commands: u32,
    sessions: Mutex<HashMap<u16, Arc<Session>>>,
    next_tsih: AtomicU16,
    next_nexus: AtomicU64,
    shutdown: watch::Sender<bool>,
    trace: OnceLock<pcap_trace::PduTrace>,
    observer: OnceLock<ConnectionObserver>,
    /// Held while a completed login is checked against the limits and counted in.
    admission: Mutex<()>,
    /// Connections logging in now (`max_pending_logins`).
    logging_in: Arc<datamover::admission::Admission>,
    /// The memory all peers together may make the target hold (`memory_mib`); each
    /// session's and connection's account counts in it.
    memory: Arc<Budget>,
    /// Failed authentications by initiator name and address, which lock out further tries.
    auth_throttle: Mutex<auth_throttle::AuthThrottle>,
    stats: Arc<stats::TargetStats>,
}

/// Listeners bound for a target, ready to serve.
pub struct Bound {
    target: Arc<Target>,
}

/// Why a LUN could not be added to or removed from a running target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LunAdminError {
    /// No configured target has this name.
    NoSuchTarget(String),
    /// The target's SCSI device refused the change.
    Lun(scsi::LunChangeError),
}

impl std::fmt::Display for LunAdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LunAdminError::NoSuchTarget(name) => write!(f, "no target is named {name}"),
            LunAdminError::Lun(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LunAdminError {}

impl Target {
    /// Open every LUN's backend and serve on `portals` (of any transport).
    pub fn with_portals(
        config: Config,
        portals: Vec<Arc<dyn datamover::Portal>>,
    ) -> Result<Bound, String> {
        Target::serve(config, portals, None)
    }

    /// [`Target::with_portals`], with RAM LUNs' images in memory from `images` (an iSER
    /// device's registered memory) where it gives some, for the configured LUNs and those
    /// added later ([`Target::add_lun`]).
    pub fn serve(
        config: Config,
        portals: Vec<Arc<dyn datamover::Portal>>,
        images: Option<Arc<scsi::ImageProvider>>,
    ) -> Result<Bound, String> {
        let images = images.unwrap_or_else(|| Arc::new(|_, _| None));
        let mut devices = HashMap::new();
        for t in &config.targets {
            let luns = Config::luns(t);
            let gateway = config.gateway.clone();
            let device = scsi::Device::with_gateway(&t.name, luns, images.clone(), gateway)
                .map_err(|e| {
                    let place = e.lun.and_then(|lun| config.lun_place(&t.name, lun));
                    match place {
                        Some(place) => format!("{place}: target {}: {e}", t.name),
                        None => format!("target {}: {e}", t.name),
                    }
                })?;
            devices.insert(t.name.to_ascii_lowercase(), Arc::new(device));
        }
        let (shutdown, _) = watch::channel(false);
        let max_pending_logins = config.max_pending_logins as usize;
        let max_immediate_commands = config.max_immediate_commands;
        let memory = Budget::root("target", config.memory_mib() << 20);
        let auth_limits = config.auth_throttle_limits();
        let target = Arc::new(Target {
            directory: Arc::new(config::Directory::new(
                config,
                portals::Portals::new(portals),
            )),
            devices: std::sync::RwLock::new(devices),
            images,
            changing: tokio::sync::Mutex::new(()),
            max_immediate_commands,
            sessions: Mutex::new(HashMap::new()),
            next_tsih: AtomicU16::new(1),
            next_nexus: AtomicU64::new(1),
            shutdown,
            trace: OnceLock::new(),
            observer: OnceLock::new(),
            admission: Mutex::new(()),
            logging_in: datamover::admission::Admission::new(max_pending_logins),
            memory,
            auth_throttle: Mutex::new(auth_throttle::AuthThrottle::new(auth_limits)),
            stats: Arc::default(),
        });
        Ok(Bound { target })
    }

    fn config(&self) -> Arc<Config> {
        self.directory.config()
    }

    /// Tell every session the target is going away (Async Message: logout requested),
    /// give initiators a moment to log out, then close what is left.
    pub async fn shutdown(&self, grace: Duration) {
        let sessions: Vec<_> = self
            .sessions
            .lock()
            .expect("sessions")
            .values()
            .cloned()
            .collect();
        for s in &sessions {
            for c in s.connections() {
                let msg = AsyncMessage {
                    event: 1,
                    param3: grace.as_secs().max(1) as u16,
                    ..Default::default()
                };
                c.send_async(msg).await;
            }
        }
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline
            && !self.sessions.lock().expect("sessions").is_empty()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.release_ownership().await;
        let _ = self.shutdown.send(true);
        for s in self.sessions.lock().expect("sessions").values() {
            s.close_all();
        }
    }

    /// A gateway (`[gateway]`) stopping hands its shared LUNs over: each is released after
    /// the writes it admitted (a few seconds at most), so a peer takes it at once.
    async fn release_ownership(&self) {
        let devices: Vec<Arc<scsi::Device>> = self
            .devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for d in devices.iter().filter(|d| d.gateway().is_some()) {
            d.release_ownership(Duration::from_secs(5)).await;
        }
    }

    /// Number of live sessions (for tests and status).
    pub fn session_count(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    fn base_limits(&self) -> TargetLimits {
        let mut l = TargetLimits {
            max_outstanding_r2t: 8,
            // What the iSER receive buffers hold (LIO declares the same).
            iser_recv_data_segment_length: datamover::iser_defaults::DEFAULT_RECV_DATA,
            // The receives kept posted beyond the command window.
            max_outstanding_unexpected_pdus: datamover::iser_defaults::UNEXPECTED_RECVS,
            chap_algorithms: self.config().chap_algorithms(),
            ..TargetLimits::default()
        };
        if let Some(m) = self.config().max_recv_data_segment_length {
            l.max_recv_data_segment_length = m.clamp(512, (1 << 24) - 1);
        }
        l
    }

    fn limits_for(&self, target_name: Option<&str>) -> TargetLimits {
        let mut l = self.base_limits();
        let config = self.config();
        if let Some(t) = target_name.and_then(|n| {
            config
                .targets
                .iter()
                .find(|t| t.name.eq_ignore_ascii_case(n))
        }) {
            l.header_digest = t.header_digest.into();
            l.data_digest = t.data_digest.into();
            l.error_recovery_level = t.error_recovery_level;
        }
        l
    }
}

impl Bound {
    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.target.portals().into_iter().map(|(a, _)| a).collect()
    }

    pub fn target(&self) -> Arc<Target> {
        self.target.clone()
    }

    /// Record every connection's bytes (login included) into `trace`. Set once, before
    /// serving.
    pub fn trace_to(&self, trace: pcap_trace::PduTrace) {
        let _ = self.target.trace.set(trace);
    }

    /// Call `observer` with every accepted connection's socket. Set once, before serving.
    pub fn observe_connections(&self, observer: ConnectionObserver) {
        let _ = self.target.observer.set(observer);
    }

    /// Starts accepting connections on these portals at once (call it within the target's
    /// runtime), and returns what runs until the target shuts down; portals added meanwhile
    /// ([`Target::add_portal`]) are served too.
    pub fn serve(self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let target = self.target;
        let mut stop = target.shutdown.subscribe();
        target
            .directory
            .portals
            .start(|portal| tokio::spawn(accept_loop(target.clone(), portal)));
        async move {
            let _ = stop.wait_for(|down| *down).await;
            for task in target.directory.portals.close() {
                let _ = task.await;
            }
        }
    }
}

impl Target {
    /// Starts accepting connections on `portal`, a portal bound while the target runs, and
    /// lists it in SendTargets answers. Call it within the target's runtime, after
    /// [`Bound::serve`].
    /// The running configuration ([`Target::running_config`]) lists it from now on.
    pub fn add_portal(self: &Arc<Self>, portal: Arc<dyn datamover::Portal>) {
        let spec = PortalSpec {
            kind: portal.kind(),
            address: portal.local_addr(),
        };
        let target = self.clone();
        self.directory
            .portals
            .add(portal, |p| tokio::spawn(accept_loop(target, p)));
        self.directory.update_config(|c| {
            let listed = c
                .portals
                .iter()
                .any(|p| PortalSpec::parse(p).ok() == Some(spec));
            if !listed {
                c.portals.push(spec.to_string());
            }
        });
    }

    /// Stops accepting connections on the portal bound to `address` (its accept loop ends,
    /// dropping it closes its listener) and no longer lists it in SendTargets answers, nor
    /// the running configuration; the connections it accepted stay. Whether a portal was
    /// there.
    pub fn remove_portal(&self, address: SocketAddr) -> bool {
        let removed = self.directory.portals.remove(address);
        if removed {
            self.directory.update_config(|c| {
                c.portals
                    .retain(|p| PortalSpec::parse(p).map_or(true, |s| s.address != address));
            });
        }
        removed
    }

    /// The target's portals, in the order they were bound or added: each one's address
    /// and what it serves ("iSCSI/TCP", "iSER", "iSCSI/TCP and iSER").
    pub fn portals(&self) -> Vec<(SocketAddr, String)> {
        self.directory.portals.describe()
    }

    /// Adds LUN `lun` to the target named `target` while it runs, built from `config` as
    /// the configured LUNs are (a RAM LUN's image in the same memory as theirs). Its
    /// backend is opened first, on a blocking thread; then REPORT LUNS lists it, it takes
    /// commands, and every session of that target hears REPORTED LUNS DATA HAS CHANGED.
    /// A number in use is refused. The [`Config`] the target started with is left as it
    /// was.
    pub async fn add_lun(
        &self,
        target: &str,
        lun: u64,
        config: scsi::LunConfig,
    ) -> Result<(), LunAdminError> {
        let device = self.device(target)?;
        tokio::task::spawn_blocking(move || device.add_lun(lun, config))
            .await
            .unwrap_or_else(|e| {
                Err(scsi::LunChangeError::Build(format!(
                    "LUN {lun}: opening it failed: {e}"
                )))
            })
            .map_err(LunAdminError::Lun)
    }

    /// Removes LUN `lun` from the target named `target` while it runs: REPORT LUNS leaves
    /// it out at once, commands to it get LOGICAL UNIT NOT SUPPORTED, and every session of
    /// that target hears REPORTED LUNS DATA HAS CHANGED; returns once the commands already
    /// running on it have finished (see [`scsi::Device::remove_lun`]).
    pub async fn remove_lun(&self, target: &str, lun: u64) -> Result<(), LunAdminError> {
        let device = self.device(target)?;
        device.remove_lun(lun).await.map_err(LunAdminError::Lun)
    }

    /// The LUN numbers of the target named `target`, ascending; `None` when there is no
    /// such target.
    pub fn luns(&self, target: &str) -> Option<Vec<u64>> {
        self.device(target).ok().map(|d| d.luns())
    }

    /// Block LUN `lun` of the target named `target`, for another front end (NVMe/TCP) to
    /// serve the same storage; `None` when there is no such target or block LUN.
    pub fn lun_export(&self, target: &str, lun: u64) -> Option<scsi::LunExport> {
        self.device(target).ok()?.lun_export(lun)
    }

    /// This gateway's ALUA state for each block LUN of `target` (`[gateway]`; empty
    /// without it); `None` when there is no such target.
    pub fn alua_status(&self, target: &str) -> Option<Vec<(u64, scsi::AluaStatus)>> {
        self.device(target).ok().map(|d| d.alua_status())
    }

    fn device(&self, target: &str) -> Result<Arc<scsi::Device>, LunAdminError> {
        self.devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&target.to_ascii_lowercase())
            .cloned()
            .ok_or_else(|| LunAdminError::NoSuchTarget(target.to_string()))
    }
}

/// Accepts connections on `l` and starts each one's login, until its task is aborted (the
/// portal removed, or the target shut down).
async fn accept_loop(target: Arc<Target>, l: Arc<dyn datamover::Portal>) {
    let portal = portals::entry(&*l);
    loop {
        match l.accept(target.trace.get()).await {
            Ok(channel) => {
                // Counted in arrival order, so the longest waiting goes first.
                let admitted = target.logging_in.admit();
                let t = target.clone();
                // Where the transport wants its connections run (iSER on the software
                // RNIC's reactor), else here.
                let on = channel
                    .runtime()
                    .unwrap_or_else(tokio::runtime::Handle::current);
                on.spawn(async move { handle_connection(t, channel, portal, admitted).await });
            }
            Err(e) => {
                tracing::warn!("accept failed on {}: {e}", portal.address);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn system_entropy(buf: &mut [u8]) {
    use rand::RngCore;
    rand::thread_rng().fill_bytes(buf);
}

/// The iSCSI TransportID (SPC-4, protocol 5, format 01b) of an initiator port.
fn transport_id(initiator_port: &str) -> Bytes {
    let mut name = initiator_port.as_bytes().to_vec();
    name.push(0);
    while !name.len().is_multiple_of(4) || name.len() < 20 {
        name.push(0);
    }
    let mut id = vec![0x45, 0];
    id.extend_from_slice(&(name.len() as u16).to_be_bytes());
    id.extend_from_slice(&name);
    Bytes::from(id)
}

struct LoggedIn {
    session: Arc<Session>,
    conn: Arc<Conn>,
    notices: tokio::sync::mpsc::Receiver<Notice>,
}

async fn handle_connection(
    target: Arc<Target>,
    conn: Box<dyn LoginChannel>,
    portal: Portal,
    mut admitted: datamover::admission::Admitted,
) {
    let peer = conn.peer();
    let _observed = target
        .observer
        .get()
        .and_then(|observe| observe(conn.socket()?, peer));
    // The whole login has a deadline too: a client that sends each PDU just inside
    // LOGIN_TIMEOUT holds its place no longer.
    let deadline = Duration::from_secs(target.config().login_deadline_secs);
    let outcome = tokio::select! {
        r = tokio::time::timeout(deadline, login(&target, conn, portal)) => r,
        _ = admitted.evicted() => {
            target.stats.refused(stats::Refusal::Limits);
            tracing::info!(
                %peer,
                "connection dropped: the longest waiting of {} still logging in (max_pending_logins)",
                target.logging_in.cap()
            );
            return;
        }
    };
    drop(admitted);
    if matches!(outcome, Ok(Err(_)) | Err(_)) {
        target.stats.refused(stats::Refusal::Incomplete);
    }
    match outcome {
        Ok(Ok(Some(logged_in))) => {
            let _live = target.stats.connection_started(&logged_in.conn.recovery);
            session::run_full_feature(target, logged_in.session, logged_in.conn, logged_in.notices)
                .await
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => tracing::warn!(%peer, "login failed: {e}"),
        Err(_) => tracing::warn!(
            %peer,
            "login failed: not finished within {} s (login_deadline_secs; the connection is dropped)",
            deadline.as_secs()
        ),
    }
}

async fn recv(c: &mut dyn LoginChannel) -> Result<datamover::InPdu, String> {
    match tokio::time::timeout(LOGIN_TIMEOUT, c.recv()).await {
        Err(_) => Err("timed out waiting for a Login Request".to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(p)) => Ok(p),
    }
}

async fn login(
    target: &Arc<Target>,
    mut conn: Box<dyn LoginChannel>,
    portal: Portal,
) -> Result<Option<LoggedIn>, String> {
    let peer = conn.peer();
    let mut pdu = recv(conn.as_mut()).await?;
    let Bhs::LoginRequest(first) = &pdu.pdu.bhs else {
        return Err(format!(
            "first PDU is a {}, not a Login Request",
            pdu.pdu.bhs.opcode().name()
        ));
    };
    let depth = target.config().queue_depth;
    let existing = existing_session(target, conn.as_mut(), first, &pdu.pdu.data).await?;
    let named = named_target(existing.as_deref(), &pdu.pdu.data);
    let mut tl = TargetLogin::new(TargetLoginConfig {
        portal_group_tag: portal.tpgt,
        existing_session: existing.as_ref().map(|s| ExistingSession {
            params: s.params.clone(),
            isid: s.identity.isid,
            chap_user: s.chap_user.clone(),
        }),
        transport: conn.kind(),
        limits: target.limits_for(named.as_deref()),
        directory: target.directory.clone(),
    });
    let mut stat_sn: u32 = rand::random::<u32>() & 0x00ff_ffff;
    // Whether the auth throttle was asked: once, when the first request is whole.
    let mut throttle_asked = false;
    loop {
        let Bhs::LoginRequest(bhs) = &pdu.pdu.bhs else {
            return Err(format!("{} during login", pdu.pdu.bhs.opcode().name()));
        };
        let req = LoginRequest::from_pdu(bhs, &pdu.pdu.data);
        let (exp, max) = match &existing {
            Some(s) => s.sn.load(),
            None => (req.header.cmd_sn, req.header.cmd_sn.wrapping_add(depth - 1)),
        };
        let step = tl.on_request(&req, &mut system_entropy);
        let mut rsp = step.response;
        let respond =
            |rsp: &LoginResponse, exp: u32, max: u32| rsp.clone().into_pdu(stat_sn, exp, max);
        if let (false, Some(name)) = (throttle_asked, tl.initiator_name()) {
            throttle_asked = true;
            let locked_out = tl.requires_chap()
                && step.state != LoginState::Failed
                && target.auth_throttle.lock().expect("auth throttle").refuses(
                    name,
                    peer.ip(),
                    Instant::now(),
                );
            if locked_out {
                let status = LoginStatus::AUTHENTICATION_FAILURE;
                let fail = LoginResponse::failure(&req, status);
                let _ = conn.send(&respond(&fail, exp, max)).await;
                target.stats.refused(stats::Refusal::LockedOut);
                tracing::warn!(
                    %peer,
                    initiator = name,
                    "login refused: too many failed authentications of this initiator name or \
                     from this address lately ({}, 0x{:04x})",
                    status.meaning(),
                    status.code()
                );
                return Ok(None);
            }
        }
        match step.state {
            LoginState::Continue => {
                conn.send(&respond(&rsp, exp, max))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            LoginState::Failed => {
                let status = rsp.status();
                // Only where a secret was at stake: an initiator insisting on CHAP with a
                // target that needs none is refused 0x0201 too, but guessed nothing.
                if let (LoginStatus::AUTHENTICATION_FAILURE, Some(name), true) =
                    (status, tl.initiator_name(), tl.requires_chap())
                {
                    target.auth_throttle.lock().expect("auth throttle").failed(
                        name,
                        peer.ip(),
                        Instant::now(),
                    );
                }
                let _ = conn.send(&respond(&rsp, exp, max)).await;
                target.stats.refused_with(status);
                tracing::warn!(%peer, "login rejected: {} (0x{:04x})", status.meaning(), status.code());
                return Ok(None);
            }
            LoginState::Complete(outcome) => {
                let admitted = {
                    let _admission = target.admission.lock().expect("admission");
                    match target.over_limits(&outcome, existing.as_deref()) {
                        Some(refused) => Err(refused),
                        None => {
                            let session = if outcome.leading {
                                create_session(target, &outcome, req.header.cmd_sn, depth)
                            } else {
                                existing.clone().expect("non-leading login has a session")
                            };
                            if let Some(ticket) = session.reserve_connection(outcome.cid) {
                                Ok((session, ticket))
                            } else {
                                Err((
                                    LoginStatus::TOO_MANY_CONNECTIONS,
                                    format!(
                                        "the session has MaxConnections={} connections",
                                        session.params.max_connections
                                    ),
                                ))
                            }
                        }
                    }
                };
                let (session, ticket) = match admitted {
                    Ok(s) => s,
                    Err((status, why)) => {
                        let fail = LoginResponse::failure(&req, status);
                        let _ = conn.send(&respond(&fail, exp, max)).await;
                        target.stats.refused_with(status);
                        tracing::warn!(
                            %peer,
                            "login refused: {why} ({}, 0x{:04x})",
                            status.meaning(),
                            status.code()
                        );
                        return Ok(None);
                    }
                };
                let (exp, max) = session.sn.load();
                rsp.header.tsih = session.tsih;
                if let Err(e) = conn.send(&respond(&rsp, exp, max)).await {
                    session.release_connection(outcome.cid, ticket);
                    return Err(e.to_string());
                }
                let logged_in = enter_full_feature(
                    &target.config(),
                    session,
                    conn,
                    &outcome,
                    stat_sn.wrapping_add(1),
                    ticket,
                    portal.address,
                );
                target.closed_meanwhile(&logged_in);
                return Ok(Some(logged_in));
            }
        }
        stat_sn = stat_sn.wrapping_add(1);
        pdu = recv(conn.as_mut()).await?;
    }
}

/// The session a login with a non-zero TSIH joins; when none has that TSIH, the initiator
/// is told so (session does not exist) and the login ends.
async fn existing_session(
    target: &Target,
    conn: &mut dyn LoginChannel,
    first: &iscsi_wire::LoginRequest,
    data: &[u8],
) -> Result<Option<Arc<Session>>, String> {
    if first.tsih == 0 {
        return Ok(None);
    }
    let found = target
        .sessions
        .lock()
        .expect("sessions")
        .get(&first.tsih)
        .cloned();
    if found.is_none() {
        let req = LoginRequest::from_pdu(first, data);
        let rsp = LoginResponse::failure(&req, LoginStatus::SESSION_DOES_NOT_EXIST);
        let pdu = rsp.into_pdu(0, first.cmd_sn, first.cmd_sn);
        let _ = conn.send(&pdu).await;
        return Err(format!("TSIH {} names no session", first.tsih));
    }
    Ok(found)
}

/// The target whose limits (digest policy) apply: the session's, or the one the first
/// request names.
fn named_target(existing: Option<&Session>, first_data: &[u8]) -> Option<String> {
    match existing {
        Some(s) => s.params.target_name.clone(),
        None => iscsi_login::text::parse(first_data)
            .ok()?
            .into_iter()
            .find(|(k, _)| k == "TargetName")
            .map(|(_, v)| v),
    }
}

/// Switches a logged-in connection to full feature phase with what was negotiated and adds
/// it to its session (replacing a connection with the same CID: connection reinstatement).
fn enter_full_feature(
    config: &Config,
    session: Arc<Session>,
    conn: Box<dyn LoginChannel>,
    outcome: &iscsi_login::target::LoginOutcome,
    next_stat_sn: u32,
    ticket: u64,
    local: SocketAddr,
) -> LoggedIn {
    let peer = conn.peer();
    let cp = &outcome.connection;
    let sp = &session.params;
    let status = datamover::status_numbering(next_stat_sn);
    let recovery = Arc::new(datamover::RecoveryCounters::default());
    let transport = conn.kind();
    // Control PDUs (NOP-In, Text) must fit what the initiator receives. Over iSER its data
    // arrives in RDMA Writes and only control PDUs use its receive buffers, which Linux
    // sizes for 128 bytes whatever InitiatorRecvDataSegmentLength it declares.
    let control_data_max = conn.control_data_max();
    // iSER declares its receive limits with its own keys.
    let (recv_len, send_len) = match transport {
        TransportKind::Tcp => (
            cp.max_recv_data_segment_length,
            cp.max_send_data_segment_length,
        ),
        TransportKind::Iser => (
            cp.target_recv_data_segment_length,
            cp.initiator_recv_data_segment_length,
        ),
    };
    let ffp = FfpConfig {
        digests: Digests {
            header: cp.header_digest,
            data: cp.data_digest,
        },
        max_recv_data_segment_length: recv_len,
        max_send_data_segment_length: send_len,
        max_burst_length: sp.max_burst_length,
        write_limits: WriteLimits {
            first_burst_length: sp.first_burst_length,
            max_burst_length: sp.max_burst_length,
            initial_r2t: sp.initial_r2t,
            immediate_data: sp.immediate_data,
            max_outstanding_r2t: sp.max_outstanding_r2t as u32,
            max_recv_data_segment_length: recv_len,
        },
        status: status.clone(),
        max_write_len: MAX_WRITE_LEN,
        error_recovery_level: sp.error_recovery_level,
        recovery: recovery.clone(),
        budget: session
            .budget
            .child("connection", config.connection_memory_mib << 20),
        timeouts: PeerTimeouts {
            data_out: Duration::from_secs(config.data_out_timeout_secs),
            send_stall: Duration::from_secs(config.nop_timeout_secs.max(1)),
            budget_wait: Duration::from_secs(config.budget_wait_secs),
        },
    };
    let (dm, notices) = conn.into_full_feature(ffp.clone(), session.sn.clone());
    let cid = outcome.cid;
    let control_send = send_len.min(control_data_max);
    let c = Arc::new(Conn::new(
        cid,
        peer,
        local,
        transport,
        dm,
        control_send,
        &ffp,
    ));
    match session.add_connection(c.clone(), ticket) {
        Ok(Some(old)) => {
            tracing::info!(%peer, cid, "connection reinstatement: closing the old connection");
            old.dm.close();
        }
        Ok(None) => {}
        // Its Login Response went out first, but it got here after the login that
        // reinstated it: it ends as a reinstated connection does.
        Err(stale) => {
            tracing::info!(%peer, cid, "connection reinstated by a later login before it started: closing it");
            stale.dm.close();
        }
    }
    tracing::info!(
        %peer,
        tsih = session.tsih,
        cid,
        "login complete: {} session for {} ({})",
        outcome.session_type.as_str(),
        outcome.target_name.as_deref().unwrap_or("-"),
        outcome.initiator_name
    );
    LoggedIn {
        session,
        conn: c,
        notices,
    }
}

fn create_session(
    target: &Arc<Target>,
    outcome: &iscsi_login::target::LoginOutcome,
    cmd_sn: u32,
    depth: u32,
) -> Arc<Session> {
    let identity = outcome.identity();
    // Session reinstatement: same initiator name, ISID and target closes the old session.
    let old: Vec<Arc<Session>> = target
        .sessions
        .lock()
        .expect("sessions")
        .values()
        .filter(|s| s.identity == identity)
        .cloned()
        .collect();
    for s in old {
        target.stats.session_reinstated();
        tracing::info!(
            tsih = s.tsih,
            "session reinstatement: closing the old session"
        );
        target.remove_session(&s);
        s.close_all();
    }
    let device = outcome
        .target_name
        .as_ref()
        .and_then(|n| target.device(n).ok());
    let nexus = scsi::NexusId(target.next_nexus.fetch_add(1, Ordering::Relaxed));
    let isid_hex: String = outcome.isid.iter().map(|b| format!("{b:02x}")).collect();
    let port = format!("{},i,0x{isid_hex}", outcome.initiator_name);
    if let (Some(d), SessionType::Normal) = (&device, outcome.session_type) {
        d.nexus_added(nexus, &port, transport_id(&port));
    }
    let mut sessions = target.sessions.lock().expect("sessions");
    let tsih = loop {
        let t = target.next_tsih.fetch_add(1, Ordering::Relaxed);
        if t != 0 && !sessions.contains_key(&t) {
            break t;
        }
    };
    let session = Arc::new(Session {
        tsih,
        nexus,
        identity,
        chap_user: outcome.chap_user.clone(),
        params: outcome.session.clone(),
        device,
        core: Mutex::new(session::core::SessionCore::new(
            cmd_sn,
            depth,
            outcome.session.session_type == SessionType::Discovery,
        )),
        sn: CmdSnState::new(cmd_sn, cmd_sn.wrapping_add(depth - 1)),
        conns: Mutex::new(HashMap::new()),
        joining: Mutex::new(Default::default()),
        latest_login: Mutex::new(HashMap::new()),
        erl2: (outcome.session.error_recovery_level >= 2).then(|| {
            session::Allegiances::new(Duration::from_secs(u64::from(
                outcome.session.default_time2retain,
            )))
        }),
        budget: target
            .memory
            .child("session", target.config().session_memory_mib << 20),
    });
    sessions.insert(tsih, session.clone());
    session
}

impl Target {
    /// Whether a completed login passes the configured limits (`max_sessions`,
    /// `max_connections`, `max_connections_per_initiator`); if not, the status to refuse it with
    /// and why. A session this login reinstates (same initiator, ISID and target) and a
    /// connection it replaces (same CID) are not counted: they are about to go.
    fn over_limits(
        &self,
        o: &iscsi_login::target::LoginOutcome,
        existing: Option<&Session>,
    ) -> Option<(LoginStatus, String)> {
        let c = self.config();
        if c.max_sessions.is_none()
            && c.max_connections.is_none()
            && c.max_connections_per_initiator.is_none()
        {
            return None;
        }
        let identity = o.identity();
        let sessions = self.sessions.lock().expect("sessions");
        let staying = || {
            sessions
                .values()
                .filter(|s| !(o.leading && s.identity == identity))
        };
        if let (true, Some(max)) = (o.leading, c.max_sessions) {
            let n = staying().count();
            if n >= max as usize {
                return Some((
                    LoginStatus::OUT_OF_RESOURCES,
                    format!("{n} sessions are open (max_sessions = {max})"),
                ));
            }
        }
        if existing.is_some_and(|s| !o.leading && s.has_connection(o.cid)) {
            return None;
        }
        if let Some(max) = c.max_connections {
            let n: usize = staying().map(|s| s.connection_count()).sum();
            if n >= max as usize {
                return Some((
                    LoginStatus::OUT_OF_RESOURCES,
                    format!("{n} connections are logged in (max_connections = {max})"),
                ));
            }
        }
        if let Some(max) = c.max_connections_per_initiator {
            let n: usize = staying()
                .filter(|s| {
                    s.identity
                        .initiator_name
                        .eq_ignore_ascii_case(&o.initiator_name)
                })
                .map(|s| s.connection_count())
                .sum();
            if n >= max as usize {
                return Some((
                    LoginStatus::TOO_MANY_CONNECTIONS,
                    format!(
                        "{} has {n} connections logged in (max_connections_per_initiator = {max})",
                        o.initiator_name
                    ),
                ));
            }
        }
        None
    }

    /// The sessions of the iSCSI target whose SCSI device is `device` (a reset there
    /// touches no other target's sessions).
    fn sessions_of(&self, device: &Arc<scsi::Device>) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .expect("sessions")
            .values()
            .filter(|s| s.device.as_ref().is_some_and(|d| Arc::ptr_eq(d, device)))
            .cloned()
            .collect()
    }

    /// Removes `s` (not another session that has taken its TSIH since).
    fn remove_session(&self, s: &Session) {
        let removed = {
            let mut sessions = self.sessions.lock().expect("sessions");
            let same = sessions
                .get(&s.tsih)
                .is_some_and(|x| std::ptr::eq(Arc::as_ptr(x), s));
            if same {
                sessions.remove(&s.tsih)
            } else {
                None
            }
        };
        if removed.is_some() {
            if let Some(d) = &s.device {
                d.nexus_removed(s.nexus);
            }
        }
    }
}
