//! One logical unit through several portals: gateways (separate targets on separate
//! portals) exporting the same LUN. A URL listing several portals
//! (`iscsi://h1,h2:3261/iqn/0`) gives a [`Session`](crate::Session) of this kind, which logs in on every
//! portal (one session per path), checks that they show the same logical unit (the NAA
//! designator of VPD page 0x83 and the unit serial number of page 0x80; refused otherwise),
//! reads each path's ALUA state and routes each command to one path:
//!
//! - **Which path**: the first path, in URL order, in the best usable state: active/optimized,
//!   then active/non-optimized, then (retried with backoff) transitioning. Commands stick to
//!   that one path rather than rotating: a path is one gateway, and keeping a LUN's traffic
//!   on one gateway keeps its cache, its ordering and its per-nexus state (unit attentions,
//!   reservations) in one place. When a better path comes back, commands return to it
//!   (failback). A logical unit that reports no ALUA support (INQUIRY TPGS = 0) has every
//!   path active/optimized, so the first path up is used.
//! - **Path failure**: the path's session gave up (connection lost and not recovered), the
//!   command was not answered within [`MultipathConfig::command_timeout`] (an ABORT TASK is
//!   tried first), or the answer was NOT READY 04/0B (standby) or 04/0C (unavailable): the
//!   command goes to another path, the caller sees nothing. NOT READY 04/0A (in transition)
//!   marks the path transitioning: the command tries another path, or the same one again after
//!   a growing pause. UNIT ATTENTION 2A/06 (asymmetric access state changed) has the states
//!   read again and the command sent again. A command refused with sense was not executed and
//!   is always sent again; a command lost with its path may have run, so only commands that
//!   give the same result when run twice are sent again: COMPARE AND WRITE, PERSISTENT RESERVE
//!   OUT, RESERVE/RELEASE, EXTENDED COPY, SANITIZE and FORMAT UNIT return the path's error.
//! - **No path**: commands wait for one for [`MultipathConfig::no_path_retry`] (as
//!   dm-multipath's `no_path_retry`), then fail with an error naming each path's state.
//! - **Recovery**: a failed path is logged in again in the background, with a doubling pause
//!   between attempts; a path that shows another logical unit when it comes back stays out.
//!   Paths up are checked every [`MultipathConfig::check_interval`] (TEST UNIT READY, and
//!   REPORT TARGET PORT GROUPS when the LU reports ALUA), so a path whose state changes while
//!   it carries nothing is noticed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use iscsi_login::SessionParams;
use tokio::sync::{oneshot, Notify};

use crate::core::{CommandRequest, CommandResult, TaskError};
use crate::pending::PendingCommand;
use crate::scsi::{self, sense_key, status, Sense, UNIT_ATTENTION_TRIES};
use crate::url::IscsiUrl;
use crate::Error;

/// How a multipath session waits, checks and reconnects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipathConfig {
    /// With no usable path, commands wait this long for one before they fail.
    pub no_path_retry: Duration,
    /// A command a path has not answered within this time counts as that path's failure.
    pub command_timeout: Duration,
    /// How often the paths up are checked (their ALUA state read again).
    pub check_interval: Duration,
    /// The first pause before a failed path is logged in again; it doubles up to
    /// `reconnect_max` while the attempts fail.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

impl Default for MultipathConfig {
    fn default() -> Self {
        MultipathConfig {
            no_path_retry: Duration::from_secs(30),
            command_timeout: Duration::from_secs(30),
            check_interval: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(10),
        }
    }
}

/// A target port group's asymmetric access state (SPC-4 6.37, REPORT TARGET PORT GROUPS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AluaState {
    #[default]
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    /// Logical block dependent (4): taken as active/non-optimized.
    LbaDependent,
    Offline,
    Transitioning,
    /// A code SPC-4 reserves.
    Reserved(u8),
}

impl AluaState {
    /// The state of an asymmetric access state code (the low four bits).
    pub fn from_code(code: u8) -> AluaState {
        match code & 0x0f {
            0x0 => AluaState::ActiveOptimized,
            0x1 => AluaState::ActiveNonOptimized,
            0x2 => AluaState::Standby,
            0x3 => AluaState::Unavailable,
            0x4 => AluaState::LbaDependent,
            0xe => AluaState::Offline,
            0xf => AluaState::Transitioning,
            c => AluaState::Reserved(c),
        }
    }

    /// Preference among usable states (lower first); `None`: the path takes no commands.
    fn rank(self) -> Option<u8> {
        match self {
            AluaState::ActiveOptimized => Some(0),
            AluaState::ActiveNonOptimized | AluaState::LbaDependent => Some(1),
            AluaState::Transitioning => Some(2),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active/optimized",
            AluaState::ActiveNonOptimized => "active/non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
            AluaState::LbaDependent => "logical block dependent",
            AluaState::Offline => "offline",
            AluaState::Transitioning => "transitioning",
            AluaState::Reserved(_) => "reserved state",
        }
    }
}

/// One path of a multipath session, as [`crate::Session::paths`] reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathStatus {
    /// `host:port`.
    pub portal: String,
    /// Logged in.
    pub up: bool,
    /// Its ALUA state (active/optimized when the LU reports no ALUA); `None` while down.
    pub state: Option<AluaState>,
    /// VPD 0x83 target port group and relative target port, when reported.
    pub target_port_group: Option<u16>,
    pub relative_target_port: Option<u16>,
    /// Commands sent on it so far (each try counts).
    pub commands: u64,
    /// Why it is down.
    pub down_because: Option<String>,
}

/// What names the logical unit: the NAA designator (VPD 0x83, LU association) and the unit
/// serial number (VPD 0x80).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LunIdentity {
    pub naa: Option<Vec<u8>>,
    pub serial: Option<String>,
}

impl LunIdentity {
    /// Whether `other` names the same logical unit: what both report agrees, and they report
    /// one thing in common at least.
    pub fn check_same(&self, other: &LunIdentity) -> Result<(), String> {
        let mut compared = false;
        if let (Some(a), Some(b)) = (&self.naa, &other.naa) {
            if a != b {
                return Err(format!("NAA {} and NAA {}", hex(a), hex(b)));
            }
            compared = true;
        }
        if let (Some(a), Some(b)) = (&self.serial, &other.serial) {
            if a != b {
                return Err(format!("serial {a:?} and serial {b:?}"));
            }
            compared = true;
        }
        if !compared {
            return Err("no NAA designator or serial number reported by both to compare".into());
        }
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The designators of a Device Identification VPD page (0x83) a multipath session uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Designators {
    /// The first NAA designator (type 3) associated with the logical unit.
    pub naa: Option<Vec<u8>>,
    /// Relative target port identifier (type 4).
    pub relative_target_port: Option<u16>,
    /// Target port group (type 5).
    pub target_port_group: Option<u16>,
}

/// Parses VPD page 0x83; malformed descriptors end the walk (what came before is kept).
pub fn parse_designators(page: &[u8]) -> Designators {
    let mut d = Designators::default();
    if page.len() < 4 || page[1] != 0x83 {
        return d;
    }
    let end = (4 + u16::from_be_bytes([page[2], page[3]]) as usize).min(page.len());
    let mut at = 4;
    // Bounded: each step moves past one descriptor of four bytes at least.
    while at + 4 <= end {
        let association = (page[at + 1] >> 4) & 3;
        let kind = page[at + 1] & 0x0f;
        let len = page[at + 3] as usize;
        let Some(value) = page
            .get(at + 4..at + 4 + len)
            .filter(|_| at + 4 + len <= end)
        else {
            break;
        };
        let low16 = || (len >= 4).then(|| u16::from_be_bytes([value[2], value[3]]));
        match (kind, association) {
            (3, 0) if d.naa.is_none() && len > 0 => d.naa = Some(value.to_vec()),
            (4, 1) => d.relative_target_port = d.relative_target_port.or_else(low16),
            (5, 1) => d.target_port_group = d.target_port_group.or_else(low16),
            _ => {}
        }
        at += 4 + len;
    }
    d
}

/// One descriptor of REPORT TARGET PORT GROUPS data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AluaState,
    /// PREF: the preferred group.
    pub preferred: bool,
    pub relative_target_ports: Vec<u16>,
}

/// Parses REPORT TARGET PORT GROUPS parameter data (length-only or extended header);
/// a descriptor cut short ends the walk.
pub fn parse_rtpg(b: &[u8]) -> Vec<PortGroup> {
    let mut out = Vec::new();
    if b.len() < 4 {
        return out;
    }
    let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let extended = b.len() >= 8 && (b[4] >> 4) & 7 == 1;
    let mut at = if extended { 8 } else { 4 };
    let end = (4usize.saturating_add(len)).min(b.len());
    // Bounded: each step moves past one descriptor of eight bytes at least.
    while at + 8 <= end {
        let ports = b[at + 7] as usize;
        let next = at + 8 + 4 * ports;
        if next > end {
            break;
        }
        out.push(PortGroup {
            id: u16::from_be_bytes([b[at + 2], b[at + 3]]),
            state: AluaState::from_code(b[at]),
            preferred: b[at] & 0x80 != 0,
            relative_target_ports: (0..ports)
                .map(|i| {
                    let p = at + 8 + 4 * i;
                    u16::from_be_bytes([b[p + 2], b[p + 3]])
                })
                .collect(),
        });
        at = next;
    }
    out
}

/// REPORT TARGET PORT GROUPS (MAINTENANCE IN, service action 0x0A), length-only header.
pub fn rtpg_cdb(alloc: u32) -> Vec<u8> {
    let mut c = vec![0u8; 12];
    c[0] = scsi_spec::cdb::op::MAINTENANCE_IN;
    c[1] = 0x0a;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// What a status says about the path that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The command's own result, for the caller.
    Done,
    /// NOT READY 04/0A: the path is changing state; try again later or elsewhere.
    Transitioning,
    /// NOT READY 04/0B or 04/0C: this path takes no commands in this state.
    Unusable(AluaState),
    /// UNIT ATTENTION 2A/06: the access states changed; read them again.
    StatesChanged,
}

/// The [`Verdict`] of a command's status and sense.
pub fn verdict(r: &CommandResult) -> Verdict {
    if r.status != status::CHECK_CONDITION {
        return Verdict::Done;
    }
    let Some(s) = Sense::parse(&r.sense) else {
        return Verdict::Done;
    };
    use scsi_spec::sense::asc;
    match (s.key, (s.asc, s.ascq)) {
        (sense_key::NOT_READY, asc::ALUA_TRANSITIONING) => Verdict::Transitioning,
        (sense_key::NOT_READY, asc::ALUA_STANDBY) => Verdict::Unusable(AluaState::Standby),
        (sense_key::NOT_READY, asc::ALUA_UNAVAILABLE) => Verdict::Unusable(AluaState::Unavailable),
        (sense_key::UNIT_ATTENTION, asc::ASYMMETRIC_ACCESS_STATE_CHANGED) => Verdict::StatesChanged,
        _ => Verdict::Done,
    }
}

/// Whether running the command twice gives what running it once does: only such commands
/// are sent again after their path failed with them in flight.
pub fn is_idempotent(cdb: &[u8]) -> bool {
    use scsi_spec::cdb::op;
    !matches!(
        cdb.first().copied(),
        Some(
            op::COMPARE_AND_WRITE
                | op::PR_OUT
                | op::RESERVE_6
                | op::RELEASE_6
                | 0x56 // RESERVE(10)
                | 0x57 // RELEASE(10)
                | op::EXTENDED_COPY
                | op::SANITIZE
                | op::FORMAT_UNIT
        )
    )
}

pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One path's commands: a session, or a test's stand-in.
pub(crate) trait PathLink: Send + Sync {
    fn submit(&self, req: CommandRequest) -> PendingCommand;
    /// Why the path takes no more commands, once it does not.
    fn failure(&self) -> Option<String>;
    /// ABORT TASK of a command [`PathLink::submit`] returned.
    fn abort(&self, itt: u32) -> BoxFut<'_, Result<u8, Error>>;
    fn logout(&self) -> BoxFut<'_, Result<(), Error>>;
    /// Closes the path without a logout.
    fn close(&self);
    /// The path's negotiated parameters, when it is a session.
    fn params(&self) -> Option<SessionParams>;
    /// The path's CmdSN window, when it is a session.
    fn window(&self) -> Option<u32>;
    /// The link itself, for the session that opened it to find its own type again.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Opens path `i` (logs in).
pub(crate) type Opener =
    Arc<dyn Fn(usize) -> BoxFut<'static, Result<Arc<dyn PathLink>, Error>> + Send + Sync>;

struct Slot {
    portal: String,
    link: Option<Arc<dyn PathLink>>,
    state: AluaState,
    /// The LU reports ALUA (TPGS ≠ 0) through this path.
    alua: bool,
    designators: Designators,
    down_because: Option<String>,
    /// When a down path is tried again, and the pause after that.
    retry_at: Instant,
    backoff: Duration,
    connecting: bool,
    commands: u64,
    params: Option<SessionParams>,
}

struct Paths {
    slots: Vec<Slot>,
    identity: LunIdentity,
    /// The states are to be read again at the next check.
    recheck: bool,
    next_check: Instant,
    checking: bool,
}

/// The router behind a multipath [`Session`](crate::Session).
pub(crate) struct Multipath {
    url: IscsiUrl,
    lun: u16,
    cfg: MultipathConfig,
    opener: Opener,
    paths: Mutex<Paths>,
    /// A path became usable (wakes commands waiting for one).
    usable: Notify,
    /// Wakes the monitor early (a path failed, states changed).
    kick: Arc<Notify>,
    closing: AtomicBool,
    /// The first path's parameters, for [`crate::Session::params`] while no path is up.
    first_params: SessionParams,
}

/// A path logged in at the start: its index, session and probe.
type Opened = (usize, (Arc<dyn PathLink>, Probe));

/// How a path reports itself when admitted.
struct Probe {
    identity: LunIdentity,
    alua: bool,
    designators: Designators,
}

impl Multipath {
    /// Opens every path, checks they show one LU, and starts the monitor. Fails when no
    /// path opens or two show different LUs.
    pub(crate) async fn start(
        url: IscsiUrl,
        portals: Vec<String>,
        cfg: MultipathConfig,
        opener: Opener,
    ) -> Result<Arc<Multipath>, Error> {
        let lun = url.lun.unwrap_or(0);
        let t = cfg.command_timeout;
        let tasks: Vec<_> = (0..portals.len())
            .map(|i| {
                let open = opener(i);
                tokio::spawn(async move {
                    let link = open.await?;
                    match probe_identity(&*link, lun, t).await {
                        Ok(p) => Ok((link, p)),
                        Err(e) => {
                            link.close();
                            Err(e)
                        }
                    }
                })
            })
            .collect();
        let mut opened = Vec::new();
        let mut failed = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await {
                Ok(Ok(x)) => opened.push((i, x)),
                Ok(Err(e)) => failed.push((i, e.to_string())),
                Err(e) => failed.push((i, format!("login task ended: {e}"))),
            }
        }
        let close_all = |opened: &[Opened]| {
            for (_, (l, _)) in opened {
                l.close();
            }
        };
        let Some((first, (_, first_probe))) = opened.first() else {
            let why: Vec<String> = failed
                .iter()
                .map(|(i, e)| format!("{}: {e}", portals[*i]))
                .collect();
            return Err(Error::Io(format!(
                "no path to {url} could log in ({})",
                why.join("; ")
            )));
        };
        for (i, (_, p)) in &opened[1..] {
            if let Err(why) = first_probe.identity.check_same(&p.identity) {
                let e = Error::Invalid(format!(
                    "the paths {} and {} show different logical units ({why}): refusing to use them as one",
                    portals[*first], portals[*i]
                ));
                close_all(&opened);
                return Err(e);
            }
        }
        let identity = first_probe.identity.clone();
        let now = Instant::now();
        let mut slots: Vec<Slot> = portals
            .iter()
            .map(|p| Slot {
                portal: p.clone(),
                link: None,
                state: AluaState::ActiveOptimized,
                alua: false,
                designators: Designators::default(),
                down_because: Some("not logged in yet".into()),
                retry_at: now + cfg.reconnect_min,
                backoff: cfg.reconnect_min,
                connecting: false,
                commands: 0,
                params: None,
            })
            .collect();
        for (i, e) in failed {
            tracing::warn!(path = %portals[i], "path down at start: {e}");
            slots[i].down_because = Some(e);
        }
        let mut first_params = None;
        for (i, (link, p)) in opened {
            let params = link.params();
            first_params = first_params.or(params.clone());
            let s = &mut slots[i];
            s.link = Some(link);
            s.alua = p.alua;
            s.designators = p.designators;
            s.down_because = None;
            s.params = params;
        }
        let m = Arc::new(Multipath {
            lun,
            cfg,
            opener,
            paths: Mutex::new(Paths {
                slots,
                identity,
                recheck: false,
                next_check: now,
                checking: false,
            }),
            usable: Notify::new(),
            kick: Arc::new(Notify::new()),
            closing: AtomicBool::new(false),
            first_params: first_params.unwrap_or_default(),
            url,
        });
        // The first states are read before any command is routed.
        m.check_all().await;
        tokio::spawn(monitor(Arc::downgrade(&m)));
        Ok(m)
    }

    fn lock(&self) -> MutexGuard<'_, Paths> {
        self.paths.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn url(&self) -> &IscsiUrl {
        &self.url
    }

    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The path commands go to now: the first, in URL order, of the best usable state.
    fn pick(&self) -> Option<(usize, Arc<dyn PathLink>, AluaState)> {
        let mut failed = Vec::new();
        let picked = {
            let p = self.lock();
            let mut best: Option<(u8, usize)> = None;
            for (i, s) in p.slots.iter().enumerate() {
                let Some(link) = &s.link else { continue };
                if let Some(why) = link.failure() {
                    failed.push((i, link.clone(), why));
                    continue;
                }
                if let Some(r) = s.state.rank() {
                    if best.is_none_or(|(b, _)| r < b) {
                        best = Some((r, i));
                    }
                }
            }
            best.map(|(_, i)| {
                let s = &p.slots[i];
                (i, s.link.clone().expect("up"), s.state)
            })
        };
        for (i, link, why) in failed {
            self.path_failed(i, &link, &why);
        }
        if picked.is_some() {
            return picked;
        }
        // Paths found failed just now are out; look again once.
        let p = self.lock();
        p.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.link.is_some() && s.state.rank().is_some())
            .min_by_key(|(_, s)| s.state.rank())
            .map(|(i, s)| (i, s.link.clone().expect("up"), s.state))
    }

    fn send(&self, i: usize, link: &Arc<dyn PathLink>, req: CommandRequest) -> PendingCommand {
        self.lock().slots[i].commands += 1;
        link.submit(req)
    }

    /// Routes a command (sent at once when a path is usable, so commands submitted in order
    /// leave in that order).
    pub(crate) fn submit(self: &Arc<Self>, req: CommandRequest) -> PendingCommand {
        let (tx, rx) = oneshot::channel();
        let first = self
            .pick()
            .filter(|(_, _, st)| *st != AluaState::Transitioning)
            .map(|(i, link, _)| {
                let p = self.send(i, &link, req.clone());
                (i, link, p)
            });
        let me = self.clone();
        tokio::spawn(async move {
            let r = me.drive(req, first).await;
            let _ = tx.send(r);
        });
        PendingCommand::routed(rx)
    }

    /// Carries one command to its end: sends it again on another path (or the same one
    /// later) as long as the paths' answers say it was not executed, or it may be sent
    /// twice; bounded by the route count, the no-path wait and the session's close.
    async fn drive(
        self: Arc<Self>,
        req: CommandRequest,
        mut sent: Option<(usize, Arc<dyn PathLink>, PendingCommand)>,
    ) -> Result<CommandResult, Error> {
        const MAX_ROUTES: u32 = 1000;
        let mut no_path_since: Option<Instant> = None;
        let mut transitions = 0u32;
        // The path that last answered "in transition".
        let mut transiting: Option<usize> = None;
        for _ in 0..MAX_ROUTES {
            let (i, link, pending) = match sent.take() {
                Some(s) => s,
                None => {
                    let (i, link, state) = self.wait_for_path(&mut no_path_since).await?;
                    if state == AluaState::Transitioning || transiting == Some(i) {
                        // No better path: the one in transition again, after a growing
                        // pause, for no longer than a command waits for a path.
                        let since = *no_path_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.cfg.no_path_retry {
                            return Err(self.no_path_error());
                        }
                        tokio::time::sleep(transition_pause(transitions)).await;
                        transitions += 1;
                    } else {
                        no_path_since = None;
                    }
                    let p = self.send(i, &link, req.clone());
                    (i, link, p)
                }
            };
            let itt = pending.itt();
            let (why, in_doubt) =
                match tokio::time::timeout(self.cfg.command_timeout, pending.wait()).await {
                    Ok(Ok(r)) => match verdict(&r) {
                        Verdict::Done => {
                            if self.state_of(i) == Some(AluaState::Transitioning) {
                                // It answered: its transition is over; learn its state.
                                self.request_check();
                            }
                            return Ok(r);
                        }
                        Verdict::Transitioning => {
                            transiting = Some(i);
                            self.set_state(i, &link, AluaState::Transitioning);
                            self.request_check();
                            continue;
                        }
                        Verdict::Unusable(state) => {
                            self.set_state(i, &link, state);
                            self.request_check();
                            continue;
                        }
                        Verdict::StatesChanged => {
                            self.request_check();
                            continue;
                        }
                    },
                    Ok(Err(e)) if !is_path_error(&e) => return Err(e),
                    Ok(Err(e)) => (e.to_string(), true),
                    Err(_) => {
                        // Ask the path to drop it, so that it does not run after its retry.
                        let _ = tokio::time::timeout(Duration::from_secs(2), link.abort(itt)).await;
                        (
                            format!(
                                "no answer within {} s",
                                self.cfg.command_timeout.as_secs_f64()
                            ),
                            true,
                        )
                    }
                };
            let portal = self.path_failed(i, &link, &why);
            if in_doubt && !is_idempotent(&req.cdb) {
                return Err(Error::Io(format!(
                    "{} failed on path {portal} ({why}); not sent again on another path since it may have run",
                    command_name(&req.cdb)
                )));
            }
        }
        Err(Error::Io(format!(
            "{} moved between paths {MAX_ROUTES} times without an answer",
            command_name(&req.cdb)
        )))
    }

    /// A usable path, waiting up to `no_path_retry` (from `since`, set on the first wait)
    /// for one.
    async fn wait_for_path(
        &self,
        since: &mut Option<Instant>,
    ) -> Result<(usize, Arc<dyn PathLink>, AluaState), Error> {
        let start = *since.get_or_insert_with(Instant::now);
        let deadline = start + self.cfg.no_path_retry;
        // Bounded by the deadline; wakes when a path comes back, and polls meanwhile.
        loop {
            if self.closing() {
                return Err(Error::Task(TaskError::SessionClosed));
            }
            let notified = self.usable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(p) = self.pick() {
                return Ok(p);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.no_path_error());
            }
            let nap = (deadline - now).min(Duration::from_millis(100));
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }

    /// The error of a command that found no usable path in time.
    pub(crate) fn no_path_error(&self) -> Error {
        Error::Timeout(format!(
            "no usable path to {} for {} s ({})",
            self.url,
            self.cfg.no_path_retry.as_secs_f64(),
            self.describe_paths()
        ))
    }

    fn describe_paths(&self) -> String {
        let p = self.lock();
        p.slots
            .iter()
            .map(|s| match (&s.link, &s.down_because) {
                (Some(_), _) => format!("{}: {}", s.portal, s.state.name()),
                (None, Some(why)) => format!("{}: down, {why}", s.portal),
                (None, None) => format!("{}: down", s.portal),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Takes path `i` out (if `link` is still its session) and schedules its reconnection;
    /// returns its portal.
    fn path_failed(&self, i: usize, link: &Arc<dyn PathLink>, why: &str) -> String {
        let (portal, took) = {
            let mut p = self.lock();
            let s = &mut p.slots[i];
            let took = s.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link));
            if took {
                s.link = None;
                s.down_because = Some(why.to_string());
                s.backoff = self.cfg.reconnect_min;
                s.retry_at = Instant::now() + s.backoff;
            }
            (s.portal.clone(), took)
        };
        if took {
            link.close();
            tracing::warn!(path = %portal, "path failed: {why}; its commands move to another path");
            self.kick.notify_one();
        }
        portal
    }

    fn state_of(&self, i: usize) -> Option<AluaState> {
        let p = self.lock();
        p.slots[i].link.as_ref().map(|_| p.slots[i].state)
    }

    /// Path `i` (if `link` is still its session) is in `state` now.
    fn set_state(&self, i: usize, link: &Arc<dyn PathLink>, state: AluaState) {
        let changed = {
            let mut p = self.lock();
            let s = &mut p.slots[i];
            let same = s.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link));
            let changed = same && s.state != state;
            if changed {
                tracing::info!(path = %s.portal, "path is {} (was {})", state.name(), s.state.name());
                s.state = state;
            }
            changed
        };
        if changed && state.rank().is_some() {
            self.usable.notify_waiters();
        }
    }

    fn request_check(&self) {
        self.lock().recheck = true;
        self.kick.notify_one();
    }

    /// Reads every path's state again (bounded by the command timeout per path).
    async fn check_all(&self) {
        let links: Vec<(usize, Arc<dyn PathLink>, bool, Designators)> = {
            let p = self.lock();
            p.slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.link.clone()?, s.alua, s.designators.clone())))
                .collect()
        };
        for (i, link, alua, ports) in links {
            match probe_state(&*link, self.lun, alua, &ports, self.cfg.command_timeout).await {
                Ok(state) => self.set_state(i, &link, state),
                Err(e) => {
                    self.path_failed(i, &link, &e.to_string());
                }
            }
        }
    }

    /// Starts what is due (reconnections, state checks); returns how long until the next.
    fn tick(self: &Arc<Self>) -> Duration {
        let now = Instant::now();
        let mut due = Vec::new();
        let mut check = false;
        let mut next = now + self.cfg.check_interval;
        {
            let mut p = self.lock();
            for (i, s) in p.slots.iter_mut().enumerate() {
                if s.link.is_some() || s.connecting {
                    continue;
                }
                if s.retry_at <= now {
                    s.connecting = true;
                    due.push(i);
                } else {
                    next = next.min(s.retry_at);
                }
            }
            if !p.checking && (p.recheck || p.next_check <= now) {
                p.recheck = false;
                p.checking = true;
                // A path in transition is looked at again soon.
                let soon = p
                    .slots
                    .iter()
                    .any(|s| s.link.is_some() && s.state == AluaState::Transitioning);
                let every = if soon {
                    self.cfg.check_interval.min(TRANSITION_CHECK)
                } else {
                    self.cfg.check_interval
                };
                p.next_check = now + every;
                check = true;
            }
            next = next.min(p.next_check);
        }
        for i in due {
            tokio::spawn(self.clone().reconnect(i));
        }
        if check {
            let m = self.clone();
            tokio::spawn(async move {
                m.check_all().await;
                m.lock().checking = false;
                m.kick.notify_one();
            });
        }
        next.saturating_duration_since(now)
            .max(Duration::from_millis(10))
    }

    /// One attempt to log path `i` in again and admit it.
    async fn reconnect(self: Arc<Self>, i: usize) {
        let r = self.admit(i).await;
        let back = {
            let mut p = self.lock();
            let max = self.cfg.reconnect_max;
            let s = &mut p.slots[i];
            s.connecting = false;
            match r {
                Ok(()) => Some((s.portal.clone(), s.state)),
                Err(e) => {
                    s.down_because = Some(e);
                    s.retry_at = Instant::now() + s.backoff;
                    s.backoff = (s.backoff * 2).min(max);
                    None
                }
            }
        };
        if let Some((portal, state)) = back {
            tracing::info!(path = %portal, "path is back ({})", state.name());
            self.usable.notify_waiters();
        }
        self.kick.notify_one();
    }

    async fn admit(&self, i: usize) -> Result<(), String> {
        if self.closing() {
            return Err("the session is closing".into());
        }
        let link = (self.opener)(i).await.map_err(|e| e.to_string())?;
        let t = self.cfg.command_timeout;
        let checked = async {
            let p = probe_identity(&*link, self.lun, t)
                .await
                .map_err(|e| e.to_string())?;
            let known = self.lock().identity.clone();
            known
                .check_same(&p.identity)
                .map_err(|why| format!("it shows another logical unit now ({why})"))?;
            let state = probe_state(&*link, self.lun, p.alua, &p.designators, t)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((p, state))
        }
        .await;
        let (p, state) = match checked {
            Ok(x) => x,
            Err(e) => {
                link.close();
                return Err(e);
            }
        };
        let mut paths = self.lock();
        if self.closing() {
            drop(paths);
            link.close();
            return Err("the session is closing".into());
        }
        let s = &mut paths.slots[i];
        s.params = link.params();
        s.link = Some(link);
        s.alua = p.alua;
        s.designators = p.designators;
        s.state = state;
        s.down_because = None;
        s.backoff = self.cfg.reconnect_min;
        Ok(())
    }

    /// The links of the paths up now.
    pub(crate) fn links(&self) -> Vec<Arc<dyn PathLink>> {
        self.lock()
            .slots
            .iter()
            .filter_map(|s| s.link.clone())
            .collect()
    }

    /// The link of the path commands go to now.
    pub(crate) fn current(&self) -> Option<Arc<dyn PathLink>> {
        self.pick().map(|(_, l, _)| l)
    }

    pub(crate) fn params(&self) -> SessionParams {
        let i = self.pick().map(|(i, _, _)| i);
        i.and_then(|i| self.lock().slots[i].params.clone())
            .unwrap_or_else(|| self.first_params.clone())
    }

    /// The path in use's CmdSN window (32 while none is usable).
    pub(crate) fn window(&self) -> u32 {
        self.current().and_then(|l| l.window()).unwrap_or(32)
    }

    pub(crate) fn status(&self) -> Vec<PathStatus> {
        let p = self.lock();
        p.slots
            .iter()
            .map(|s| PathStatus {
                portal: s.portal.clone(),
                up: s.link.is_some(),
                state: s.link.as_ref().map(|_| s.state),
                target_port_group: s.designators.target_port_group,
                relative_target_port: s.designators.relative_target_port,
                commands: s.commands,
                down_because: s.down_because.clone(),
            })
            .collect()
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.closing().then(|| "the session was closed".to_string())
    }

    /// Stops routing and closes every path.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let links: Vec<_> = {
            let mut p = self.lock();
            p.slots.iter_mut().filter_map(|s| s.link.take()).collect()
        };
        for l in links {
            l.close();
        }
        self.usable.notify_waiters();
        self.kick.notify_one();
    }

    /// Logs out of every path up; the first failure is returned.
    pub(crate) async fn logout(&self) -> Result<(), Error> {
        self.closing.store(true, Ordering::Release);
        let links = self.links();
        let mut result = Ok(());
        for l in &links {
            let r = l.logout().await;
            result = result.and(r);
        }
        self.close();
        result
    }
}

/// How often paths in transition are checked.
const TRANSITION_CHECK: Duration = Duration::from_millis(200);

/// The pause before a command tries a path in transition again: 50 ms doubling to 1 s.
fn transition_pause(n: u32) -> Duration {
    Duration::from_millis(50u64 << n.min(5)).min(Duration::from_secs(1))
}

/// Errors that mean the path (not the command) failed.
fn is_path_error(e: &Error) -> bool {
    matches!(
        e,
        Error::Task(TaskError::ConnectionLost(_))
            | Error::Task(TaskError::SessionClosed)
            | Error::Task(TaskError::Aborted)
            | Error::Io(_)
            | Error::Timeout(_)
    )
}

fn command_name(cdb: &[u8]) -> String {
    let op = cdb.first().copied().unwrap_or(0);
    scsi_spec::cdb::opcode_name(op)
        .map(str::to_string)
        .unwrap_or_else(|| format!("command 0x{op:02x}"))
}

/// One command on one path with a deadline, sent again past unit attentions (a path's
/// new nexus reports its own, which are not the caller's business).
async fn exec(
    link: &dyn PathLink,
    req: CommandRequest,
    t: Duration,
) -> Result<CommandResult, Error> {
    let mut last = None;
    for _ in 0..UNIT_ATTENTION_TRIES {
        let r = tokio::time::timeout(t, link.submit(req.clone()).wait())
            .await
            .map_err(|_| Error::Timeout(format!("no answer within {} s", t.as_secs_f64())))??;
        if !r.is_unit_attention() {
            return Ok(r);
        }
        last = Some(r);
    }
    Ok(last.expect("tried"))
}

/// INQUIRY (TPGS), VPD 0x83 and 0x80 through one path.
async fn probe_identity(link: &dyn PathLink, lun: u16, t: Duration) -> Result<Probe, Error> {
    let std = exec(
        link,
        CommandRequest::read(lun, scsi::inquiry(None, 96), 96),
        t,
    )
    .await?;
    let std = std.good("INQUIRY")?;
    let alua = std.data.get(5).is_some_and(|b| (b >> 4) & 3 != 0);
    let p83 = exec(
        link,
        CommandRequest::read(lun, scsi::inquiry(Some(0x83), 1024), 1024),
        t,
    )
    .await?;
    let designators = if p83.status == status::GOOD {
        parse_designators(&p83.data)
    } else {
        Designators::default()
    };
    let p80 = exec(
        link,
        CommandRequest::read(lun, scsi::inquiry(Some(0x80), 255), 255),
        t,
    )
    .await?;
    let serial = (p80.status == status::GOOD)
        .then(|| scsi::parse_unit_serial(&p80.data))
        .flatten()
        .filter(|s| !s.is_empty());
    Ok(Probe {
        identity: LunIdentity {
            naa: designators.naa.clone(),
            serial,
        },
        alua,
        designators,
    })
}

/// A path's state now: TEST UNIT READY (NOT READY 04/0A-0C say it), then, when the LU
/// reports ALUA, REPORT TARGET PORT GROUPS for the path's own group (by its target port
/// group designator, else the group listing its relative target port).
async fn probe_state(
    link: &dyn PathLink,
    lun: u16,
    alua: bool,
    ports: &Designators,
    t: Duration,
) -> Result<AluaState, Error> {
    let tur = exec(link, CommandRequest::none(lun, scsi::test_unit_ready()), t).await?;
    let from_tur = match verdict(&tur) {
        Verdict::Transitioning => Some(AluaState::Transitioning),
        Verdict::Unusable(s) => Some(s),
        _ => None,
    };
    if !alua {
        return Ok(from_tur.unwrap_or(AluaState::ActiveOptimized));
    }
    let r = exec(link, CommandRequest::read(lun, rtpg_cdb(4096), 4096), t).await?;
    if r.status != status::GOOD {
        // ALUA reported but its states unreadable: judge by TEST UNIT READY.
        return Ok(from_tur.unwrap_or(AluaState::ActiveOptimized));
    }
    let groups = parse_rtpg(&r.data);
    let own = own_group(&groups, ports);
    Ok(match (own, from_tur) {
        (Some(g), _) => g.state,
        (None, Some(s)) => s,
        (None, None) => AluaState::ActiveOptimized,
    })
}

/// The group of REPORT TARGET PORT GROUPS data a path belongs to: the one its target port
/// group designator names, else the one listing its relative target port.
pub fn own_group<'a>(groups: &'a [PortGroup], ports: &Designators) -> Option<&'a PortGroup> {
    match (ports.target_port_group, ports.relative_target_port) {
        (Some(g), _) => groups.iter().find(|x| x.id == g),
        (None, Some(p)) => groups.iter().find(|x| x.relative_target_ports.contains(&p)),
        (None, None) => None,
    }
}

/// Runs the checks and reconnections while the session lives (ends when it is closed or
/// dropped).
async fn monitor(weak: Weak<Multipath>) {
    loop {
        let Some(m) = weak.upgrade() else { return };
        if m.closing() {
            return;
        }
        let wait = m.tick();
        let kick = m.kick.clone();
        drop(m);
        let _ = tokio::time::timeout(wait, kick.notified()).await;
    }
}

#[cfg(test)]
mod tests;
