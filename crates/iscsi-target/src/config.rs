//! The target's configuration: portals, targets, their LUNs (the `scsi` crate's
//! `LunConfig`), ACLs and CHAP secrets, read from TOML. Errors name the file, the line
//! and what to fix.

use crate::auth_throttle::ThrottleLimits;
use datamover::PeerTimeouts;
use iscsi_login::chap::{ChapAlgorithm, ChapCredentials};
use iscsi_login::directory::{AuthRequirement, Portal, TargetDirectory};
use iscsi_login::params::TransportKind;
use iscsi_login::target::DigestPolicy;
use scsi::LunConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The IQN of the embedded default target.
pub const DEFAULT_IQN: &str = "iqn.2026-11.org.ironsan:default";
/// The default portal.
pub const DEFAULT_PORTAL: &str = "127.0.0.1:3260";

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Chap {
    pub user: String,
    pub secret: String,
}

impl Chap {
    fn credentials(&self) -> ChapCredentials {
        ChapCredentials::new(self.user.clone(), self.secret.as_bytes().to_vec())
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DigestSetting {
    Never,
    #[default]
    Allowed,
    Required,
}

impl From<DigestSetting> for DigestPolicy {
    fn from(d: DigestSetting) -> Self {
        match d {
            DigestSetting::Never => DigestPolicy::Never,
            DigestSetting::Allowed => DigestPolicy::Allowed,
            DigestSetting::Required => DigestPolicy::Required,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    pub chap: Option<Chap>,
    pub mutual_chap: Option<Chap>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    pub name: String,
    pub alias: Option<String>,
    /// Initiator names allowed to log in; empty allows all.
    #[serde(default)]
    pub initiators: Vec<String>,
    pub chap: Option<Chap>,
    pub mutual_chap: Option<Chap>,
    #[serde(default)]
    pub header_digest: DigestSetting,
    #[serde(default)]
    pub data_digest: DigestSetting,
    /// Highest ErrorRecoveryLevel this target agrees to over iSCSI/TCP (0: session
    /// recovery only, as most targets; 1: digest errors mended in place with SNACK and
    /// recovery R2Ts). iSER sessions always run at 0.
    #[serde(default)]
    pub error_recovery_level: u8,
    /// LUNs by number: `[target.lun.0]`.
    #[serde(default)]
    pub lun: BTreeMap<String, LunConfig>,
}

fn default_login_deadline() -> u64 {
    60
}

fn default_max_pending_logins() -> u32 {
    4096
}

fn default_max_sessions() -> Option<u32> {
    Some(1024)
}
fn default_max_connections() -> Option<u32> {
    Some(4096)
}
fn default_max_connections_per_initiator() -> Option<u32> {
    Some(256)
}
fn default_session_memory_mib() -> u64 {
    256
}
fn default_connection_memory_mib() -> u64 {
    128
}
fn default_max_immediate_commands() -> u32 {
    16
}
fn default_data_out_timeout() -> u64 {
    30
}
fn default_budget_wait() -> u64 {
    PeerTimeouts::default().budget_wait.as_secs()
}
fn default_auth_failures_per_initiator() -> u32 {
    ThrottleLimits::default().per_initiator
}
fn default_auth_failures_per_address() -> u32 {
    ThrottleLimits::default().per_address
}
fn default_auth_failure_window() -> u64 {
    ThrottleLimits::default().window.as_secs()
}
fn default_auth_lockout() -> u64 {
    ThrottleLimits::default().lockout.as_secs()
}

fn default_queue_depth() -> u32 {
    128
}
fn default_nop_interval() -> u64 {
    10
}
fn default_nop_timeout() -> u64 {
    30
}
fn yes() -> bool {
    true
}
fn default_iser_poll_us() -> u64 {
    datamover::iser_defaults::DEFAULT_POLL.as_micros() as u64
}
fn default_tcp_poll_us() -> u64 {
    datamover::tcp_defaults::DEFAULT_POLL.as_micros() as u64
}

/// The whole configuration; [`Config::to_toml`] writes it back in the syntax it is read in
/// (equality ignores where it was read from).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub portals: Vec<String>,
    /// Commands outstanding per session (CmdSN window).
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    /// Seconds of silence after which the target pings a connection with NOP-In (0: never).
    #[serde(default = "default_nop_interval")]
    pub nop_interval_secs: u64,
    /// Seconds a ping may go unanswered before the connection is dropped.
    #[serde(default = "default_nop_timeout")]
    pub nop_timeout_secs: u64,
    /// Largest MaxRecvDataSegmentLength the target declares.
    pub max_recv_data_segment_length: Option<u32>,
    /// Sessions (normal and discovery) at once; a login that would open one more is refused
    /// with status 0x0302 Out of resources.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: Option<u32>,
    /// Logged-in connections at once, over all sessions; one more is refused with status
    /// 0x0302 Out of resources. (Connections still logging in are bounded by
    /// `max_pending_logins` and the login deadline, not counted here.)
    #[serde(default = "default_max_connections")]
    pub max_connections: Option<u32>,
    /// Logged-in connections of one initiator name at once, over all its sessions; one more is
    /// refused with status 0x0206 Too many connections.
    #[serde(default = "default_max_connections_per_initiator")]
    pub max_connections_per_initiator: Option<u32>,
    /// MiB of data all peers together may make the target hold (left out: an eighth of the
    /// machine's memory, at least 256 MiB and at most 8 GiB): write and read data, and what
    /// is kept until the initiator acknowledges it (status data, at ErrorRecoveryLevel 2 the
    /// tasks). A command whose data does not fit waits for room, then is refused with TASK
    /// SET FULL.
    pub memory_mib: Option<u64>,
    /// MiB of data one session may make the target hold.
    #[serde(default = "default_session_memory_mib")]
    pub session_memory_mib: u64,
    /// MiB of data one connection may make the target hold (at least 64: the largest write
    /// the target takes).
    #[serde(default = "default_connection_memory_mib")]
    pub connection_memory_mib: u64,
    /// Immediate SCSI commands (I bit, outside the CmdSN window) one session may have
    /// running at once; one more is answered with Reject 0x06 (immediate command rejected).
    #[serde(default = "default_max_immediate_commands")]
    pub max_immediate_commands: u32,
    /// Seconds a write may wait for the data it asked for (R2T); then its connection is
    /// dropped (ErrorRecoveryLevel ≥ 1: what is missing is asked for again first).
    #[serde(default = "default_data_out_timeout")]
    pub data_out_timeout_secs: u64,
    /// Seconds a command may wait for room in the memory budgets before it is refused with
    /// TASK SET FULL, unexecuted.
    #[serde(default = "default_budget_wait")]
    pub budget_wait_secs: u64,
    /// Failed CHAP logins of one initiator name within `auth_failure_window_secs` after which
    /// that name's logins that must authenticate are refused for `auth_lockout_secs`.
    #[serde(default = "default_auth_failures_per_initiator")]
    pub auth_failures_per_initiator: u32,
    /// The same from one source address (IPv6: one /64); higher than per initiator, since
    /// many initiators may share an address and a guesser can change its name at will.
    #[serde(default = "default_auth_failures_per_address")]
    pub auth_failures_per_address: u32,
    #[serde(default = "default_auth_failure_window")]
    pub auth_failure_window_secs: u64,
    #[serde(default = "default_auth_lockout")]
    pub auth_lockout_secs: u64,
    /// Connections still being set up at once, per portal: sorted by their first bytes (a
    /// portal serving iSER and iSCSI/TCP on one port) or logging in. One more drops the one
    /// that has waited longest (idle and stalled clients hold bounded resources and never
    /// keep out a client that logs in promptly).
    #[serde(default = "default_max_pending_logins")]
    pub max_pending_logins: u32,
    /// Seconds a whole login (every stage and PDU) may take; past it the connection is
    /// dropped. Each PDU must also come within 15 s of the last.
    #[serde(default = "default_login_deadline")]
    pub login_deadline_secs: u64,
    /// Address of the Prometheus scrape endpoint (`GET /metrics`), e.g. "127.0.0.1:9100";
    /// left out: none. `ironsan target --metrics` overrides it.
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// iSER portals insist on MPA CRC (iWARP); otherwise they use it when the initiator asks.
    #[serde(default)]
    pub iser_mpa_crc: bool,
    /// iSER over the software RNIC aligns each FPDU with a TCP segment on loopback connections
    /// too (network paths always are): for captures of a loopback hop, such as qemu's
    /// user-mode network in front of a guest, that a dissector decodes.
    #[serde(default)]
    pub iser_align_loopback: bool,
    /// iSER over the software RNIC runs on a thread of its own (a reactor): the RNIC's engine,
    /// the connections' completions and their commands, so that a command crosses no thread
    /// between its Send arriving and its status leaving. Off: the engine has a thread of its
    /// own and iSER connections run on the target's multi-threaded runtime like iSCSI/TCP's
    /// (for comparing the two; more than one core's worth of iSER work may need it).
    #[serde(default = "yes")]
    pub iser_reactor: bool,
    /// Microseconds the reactor's RNIC engine polls on after its last work before it sleeps
    /// (0: sleeps at once). Polling catches a busy initiator's next commands awake, which
    /// costs less than a sleep and a wake-up; an idle target stops polling after this long.
    #[serde(default = "default_iser_poll_us")]
    pub iser_poll_us: u64,
    /// Microseconds an iSCSI/TCP connection's reader polls its socket after each PDU before
    /// it sleeps in epoll (0: sleeps at once). Polling catches a busy initiator's next
    /// command awake; an idle connection stops polling after this long.
    #[serde(default = "default_tcp_poll_us")]
    pub tcp_poll_us: u64,
    /// What serves iser:// portals: ironsan's software iWARP RNIC (the default; it can share
    /// a port with iSCSI/TCP), or the first rdma-core device (a build with the rdma-core
    /// feature; rdma_cm owns the port, so iSCSI/TCP needs another).
    #[serde(default)]
    pub iser_provider: IserProvider,
    /// RAM LUNs' images are registered with the iSER device once, so read data leaves in RDMA
    /// Writes straight from the LUN (no copy into a buffer first). Left out: yes on the
    /// software RNIC (it costs nothing up front), no with rdma-core, where the image is pinned
    /// whole (the memlock limit must allow it). A LUN whose image cannot be registered lives in
    /// ordinary memory, with a log line. Only with iser:// portals.
    pub iser_register_ram_luns: Option<bool>,
    /// The CHAP algorithms (CHAP_A) the target accepts, by name: "sha3-256", "sha-256",
    /// "sha-1", "md5". Among them the initiator's CHAP_A order decides (RFC 7143 list
    /// negotiation). Left out: all four.
    pub chap_algorithms: Option<Vec<String>>,
    /// The control socket (`ironsan admin`, docs/admin.md): a Unix socket created owner-only
    /// at this path. Left out: none (or `ironsan target --control`).
    pub control_socket: Option<std::path::PathBuf>,
    /// Write the running configuration back to the file the target started from after
    /// every change made through the control socket (as `ironsan admin save` does).
    #[serde(default)]
    pub save_on_change: bool,
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    /// `[gateway]`: this target process is one of several gateways exporting the same LUNs
    /// (asymmetric logical unit access, `scsi::alua`); left out: a target of its own, as ever.
    #[serde(default)]
    pub gateway: Option<scsi::GatewayConfig>,
    #[serde(default, rename = "target")]
    pub targets: Vec<TargetConfig>,
    /// `[[subsystem]]`: NVM subsystems served over NVMe/TCP, their namespaces the LUNs of
    /// `targets` (`nvme_target`).
    #[serde(default, rename = "subsystem", skip_serializing_if = "Vec::is_empty")]
    pub subsystems: Vec<nvme_target::SubsystemConfig>,
    /// Where each target's LUN tables are in the file read (for errors found when they open).
    #[serde(skip)]
    lun_places: LunPlaces,
}

/// `file:line` of each LUN table read, by (lower-case target name, LUN): not part of what
/// a configuration says, so equal whatever it holds.
#[derive(Debug, Clone, Default)]
struct LunPlaces(BTreeMap<(String, u64), String>);

impl PartialEq for LunPlaces {
    fn eq(&self, _: &LunPlaces) -> bool {
        true
    }
}

/// The RDMA provider behind iser:// portals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IserProvider {
    /// ironsan's software iWARP RNIC.
    #[default]
    Software,
    /// The first device rdma-core reports (librdmacm), e.g. Linux siw or a hardware RNIC.
    RdmaCore,
}

/// One configured portal: its transport and address. Written `ADDR:PORT` (iSCSI/TCP),
/// `tcp://ADDR:PORT` or `iser://ADDR:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortalSpec {
    pub kind: TransportKind,
    pub address: SocketAddr,
}

/// Written back as `tcp://ADDR:PORT` or `iser://ADDR:PORT`, which [`PortalSpec::parse`] reads.
impl std::fmt::Display for PortalSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.kind {
            TransportKind::Tcp => "tcp",
            TransportKind::Iser => "iser",
        };
        write!(f, "{scheme}://{}", self.address)
    }
}

impl PortalSpec {
    /// Parses a portal as written in the configuration or on the command line; the error
    /// says what to write instead.
    pub fn parse(text: &str) -> Result<PortalSpec, String> {
        let (kind, addr) = match text.split_once("://") {
            None => (TransportKind::Tcp, text),
            Some(("tcp", a)) => (TransportKind::Tcp, a),
            Some(("iser", a)) => (TransportKind::Iser, a),
            Some((scheme, _)) => {
                return Err(format!(
                    "portal {text:?}: unknown transport {scheme:?}; write ADDR:PORT, tcp://ADDR:PORT or iser://ADDR:PORT"
                ))
            }
        };
        let address = addr.parse::<SocketAddr>().map_err(|_| {
            format!(
                "portal {text:?} is not ADDR:PORT (e.g. \"127.0.0.1:3260\", \"iser://[::1]:3260\")"
            )
        })?;
        Ok(PortalSpec { kind, address })
    }
}

/// The highest ErrorRecoveryLevel implemented (level 2: connection recovery).
pub const MAX_ERROR_RECOVERY_LEVEL: u8 = 2;

/// What to write instead of an ErrorRecoveryLevel this target cannot run.
pub fn error_recovery_level_help(level: u8) -> String {
    format!(
        "error_recovery_level {level} is not supported: use 0 (session recovery), 1 (digest \
         errors recovered with SNACK and recovery R2T) or 2 (also connection recovery: tasks \
         reassigned to another connection)"
    )
}

/// A configuration error, already phrased for the user.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// The embedded default: one 1 GiB RAM LUN under [`DEFAULT_IQN`].
    pub fn embedded_default() -> Config {
        let mut lun = BTreeMap::new();
        lun.insert("0".to_string(), LunConfig::memory(1 << 30));
        Config {
            portals: vec![],
            queue_depth: default_queue_depth(),
            nop_interval_secs: default_nop_interval(),
            nop_timeout_secs: default_nop_timeout(),
            max_recv_data_segment_length: None,
            max_sessions: default_max_sessions(),
            max_connections: default_max_connections(),
            max_connections_per_initiator: default_max_connections_per_initiator(),
            memory_mib: None,
            session_memory_mib: default_session_memory_mib(),
            connection_memory_mib: default_connection_memory_mib(),
            max_immediate_commands: default_max_immediate_commands(),
            data_out_timeout_secs: default_data_out_timeout(),
            budget_wait_secs: default_budget_wait(),
            auth_failures_per_initiator: default_auth_failures_per_initiator(),
            auth_failures_per_address: default_auth_failures_per_address(),
            auth_failure_window_secs: default_auth_failure_window(),
            auth_lockout_secs: default_auth_lockout(),
            max_pending_logins: default_max_pending_logins(),
            login_deadline_secs: default_login_deadline(),
            metrics: None,
            iser_mpa_crc: false,
            iser_align_loopback: false,
            iser_reactor: true,
            iser_poll_us: default_iser_poll_us(),
            tcp_poll_us: default_tcp_poll_us(),
            iser_provider: IserProvider::Software,
            iser_register_ram_luns: None,
            chap_algorithms: None,
            control_socket: None,
            save_on_change: false,
            discovery: DiscoveryConfig::default(),
            gateway: None,
            subsystems: vec![],
            lun_places: LunPlaces::default(),
            targets: vec![TargetConfig {
                name: DEFAULT_IQN.to_string(),
                alias: Some("ironsan default RAM disk".to_string()),
                initiators: vec![],
                chap: None,
                mutual_chap: None,
                header_digest: DigestSetting::Allowed,
                data_digest: DigestSetting::Allowed,
                error_recovery_level: 0,
                lun,
            }],
        }
    }

    /// Read and validate a TOML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse TOML text; `origin` names the file in messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            // serde reports an unknown field with the whole table as its span: find the key.
            let unknown = msg
                .strip_prefix("unknown field `")
                .and_then(|r| r.split('`').next());
            let line = unknown
                .and_then(|k| line_number(text, 0, |l| l.trim_start().starts_with(k)))
                .or_else(|| {
                    e.span()
                        .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                });
            match line {
                Some(l) => ConfigError(format!("{origin}:{l}: {msg}")),
                None => ConfigError(format!("{origin}: {msg}")),
            }
        })?;
        config.validate(text, origin)?;
        let mut config = config;
        config.lun_places = LunPlaces(lun_places(&config.targets, text, origin));
        Ok(config)
    }

    /// Checks a configuration built or changed in memory (not read from a file) as
    /// [`Config::parse`] checks a file's; errors name `origin`.
    pub fn check(&self, origin: &str) -> Result<(), ConfigError> {
        self.validate("", origin)
    }

    /// Where LUN `lun` of target `target` is configured (`file:line` of its table), when
    /// this configuration was read from a file.
    pub fn lun_place(&self, target: &str, lun: u64) -> Option<&str> {
        self.lun_places
            .0
            .get(&(target.to_ascii_lowercase(), lun))
            .map(String::as_str)
    }

    fn validate(&self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let at = |line: Option<usize>| match line {
            Some(n) => format!("{origin}:{n}"),
            None => origin.to_string(),
        };
        let line_of = |needle: &str| at(line_number(text, 0, |l| l.contains(needle)));
        for p in &self.portals {
            PortalSpec::parse(p).map_err(|why| ConfigError(format!("{}: {why}", line_of(p))))?;
        }
        if !(1..=65535).contains(&self.queue_depth) {
            return Err(ConfigError(format!(
                "{}: queue_depth must be 1..65535",
                line_of("queue_depth")
            )));
        }
        if self.login_deadline_secs == 0 {
            return Err(ConfigError(format!(
                "{}: login_deadline_secs must be at least 1 (default 60)",
                line_of("login_deadline_secs")
            )));
        }
        if self.max_pending_logins == 0 {
            return Err(ConfigError(format!(
                "{}: max_pending_logins must be at least 1 (default 4096)",
                line_of("max_pending_logins")
            )));
        }
        if self.max_sessions.is_some_and(|n| n > MAX_SESSIONS) {
            return Err(ConfigError(format!(
                "{}: max_sessions can be at most {MAX_SESSIONS} (a session's TSIH is 16 bits, 0 unused)",
                line_of("max_sessions")
            )));
        }
        for (key, value) in [
            ("max_sessions", self.max_sessions),
            ("max_connections", self.max_connections),
            (
                "max_connections_per_initiator",
                self.max_connections_per_initiator,
            ),
        ] {
            if value == Some(0) {
                return Err(ConfigError(format!(
                    "{}: {key} must be at least 1",
                    line_of(key)
                )));
            }
        }
        self.validate_memory(text, origin)?;
        if let Some(names) = &self.chap_algorithms {
            let line = line_of("chap_algorithms");
            if names.is_empty() {
                return Err(ConfigError(format!(
                    "{line}: chap_algorithms must name at least one of {} (leave it out for all)",
                    chap_algorithm_names()
                )));
            }
            for name in names {
                if chap_algorithm(name).is_none() {
                    return Err(ConfigError(format!(
                        "{line}: chap_algorithms: unknown CHAP algorithm {name:?}; use {}",
                        chap_algorithm_names()
                    )));
                }
            }
        }
        // The line of `needle` within the table that holds the line with `anchor` (a target's
        // name, or `[discovery`), for keys that many tables have.
        let line_in_table_of = |anchor: &str, needle: &str| {
            let anchor_line = line_number(text, 0, |l| l.contains(anchor)).unwrap_or(1);
            let table = text
                .lines()
                .take(anchor_line)
                .enumerate()
                .filter(|(_, l)| l.trim_start().starts_with('['))
                .last()
                .map_or(0, |(i, _)| i);
            match line_number(text, table, |l| l.contains(needle)) {
                Some(n) => at(Some(n)),
                None => line_of(anchor),
            }
        };
        // RFC 7143 §12.1.3: the secrets of the two directions must differ, else a peer could
        // answer the target's challenge by reflecting it.
        let same_secrets = |chap: &Option<Chap>, mutual: &Option<Chap>| matches!((chap, mutual), (Some(c), Some(m)) if c.secret == m.secret);
        let mut seen = std::collections::HashSet::new();
        for t in &self.targets {
            if !(t.name.starts_with("iqn.")
                || t.name.starts_with("eui.")
                || t.name.starts_with("naa."))
            {
                return Err(ConfigError(format!(
                    "{}: target name {:?} is not an iSCSI name: use iqn.YYYY-MM.reversed.domain:name",
                    line_of(&t.name),
                    t.name
                )));
            }
            if !seen.insert(t.name.to_ascii_lowercase()) {
                return Err(ConfigError(format!(
                    "{}: target {:?} is defined twice",
                    line_of(&t.name),
                    t.name
                )));
            }
            if t.error_recovery_level > MAX_ERROR_RECOVERY_LEVEL {
                return Err(ConfigError(format!(
                    "{}: target {:?}: {}",
                    line_of("error_recovery_level"),
                    t.name,
                    error_recovery_level_help(t.error_recovery_level)
                )));
            }
            if t.mutual_chap.is_some() && t.chap.is_none() {
                return Err(ConfigError(format!(
                    "{}: target {:?}: mutual_chap needs chap too",
                    line_of(&t.name),
                    t.name
                )));
            }
            if same_secrets(&t.chap, &t.mutual_chap) {
                return Err(ConfigError(format!(
                    "{}: target {:?}: the mutual_chap secret must differ from the chap secret \
                     (RFC 7143 §12.1.3)",
                    line_in_table_of(&t.name, "mutual_chap"),
                    t.name
                )));
            }
            for (k, lun) in &t.lun {
                let n: u16 = k.parse().ok().filter(|n| *n < 16384).ok_or_else(|| {
                    ConfigError(format!(
                        "{}: LUN \"{k}\" of target {:?} must be a number 0..16383",
                        line_of(&format!("lun.{k}")),
                        t.name
                    ))
                })?;
                lun.validate().map_err(|e| {
                    ConfigError(format!(
                        "{}: target {:?} LUN {n}: {e}",
                        line_of(&format!("lun.{k}")),
                        t.name
                    ))
                })?;
            }
        }
        self.validate_gateway(text, origin)?;
        self.validate_subsystems(text, origin)?;
        if self.discovery.mutual_chap.is_some() && self.discovery.chap.is_none() {
            return Err(ConfigError(format!(
                "{}: discovery mutual_chap needs chap too",
                line_of("mutual_chap")
            )));
        }
        if same_secrets(&self.discovery.chap, &self.discovery.mutual_chap) {
            return Err(ConfigError(format!(
                "{}: discovery: the mutual_chap secret must differ from the chap secret \
                 (RFC 7143 §12.1.3)",
                line_in_table_of("[discovery", "mutual_chap")
            )));
        }
        Ok(())
    }

    /// `[[subsystem]]`: well formed (`nvme_target::config::validate`), each namespace a
    /// block LUN of a configured target.
    fn validate_subsystems(&self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let at = |needle: &str| match line_number(text, 0, |l| l.contains(needle)) {
            Some(n) => format!("{origin}:{n}"),
            None => origin.to_string(),
        };
        nvme_target::config::validate(&self.subsystems)
            .map_err(|e| ConfigError(format!("{}: {e}", at("[[subsystem]]"))))?;
        for s in &self.subsystems {
            for n in &s.namespaces {
                let lun = self
                    .targets
                    .iter()
                    .find(|t| t.name.eq_ignore_ascii_case(&n.target))
                    .and_then(|t| t.lun.get(&n.lun.to_string()));
                match lun {
                    None => {
                        return Err(ConfigError(format!(
                            "{}: [[subsystem]] {} nsid {}: target {:?} has no LUN {}",
                            at(&n.target),
                            s.nqn,
                            n.nsid,
                            n.target,
                            n.lun
                        )))
                    }
                    Some(l) if matches!(l.backend, scsi::BackendConfig::Osd { .. }) => {
                        return Err(ConfigError(format!(
                            "{}: [[subsystem]] {} nsid {}: LUN {} of {:?} is an object store, not a block LUN",
                            at(&n.target),
                            s.nqn,
                            n.nsid,
                            n.lun,
                            n.target
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    /// `[gateway]`: ids unique among this gateway and its peers, names and timings sane;
    /// `owner_lock` only with it. Errors name the line of the key at fault.
    fn validate_gateway(&self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let section = line_number(text, 0, |l| l.trim_start().starts_with("[gateway]"));
        let Some(gateway) = &self.gateway else {
            for t in &self.targets {
                if let Some((k, _)) = t.lun.iter().find(|(_, l)| l.owner_lock.is_some()) {
                    let line = line_number(text, 0, |l| l.trim_start().starts_with("owner_lock"));
                    let at = line.map_or(origin.to_string(), |n| format!("{origin}:{n}"));
                    return Err(ConfigError(format!(
                        "{at}: target {:?} LUN {k}: owner_lock needs a [gateway] section",
                        t.name
                    )));
                }
            }
            return Ok(());
        };
        gateway.validate().map_err(|e| {
            // The `occurrence`-th `key = value` line from the section on.
            let from = section.unwrap_or(1) - 1;
            let line = text
                .lines()
                .enumerate()
                .skip(from)
                .filter(|(_, l)| {
                    l.trim_start().strip_prefix(e.key).is_some_and(|rest| {
                        rest.trim_start()
                            .strip_prefix('=')
                            .is_some_and(|v| e.value.is_empty() || v.trim().starts_with(&e.value))
                    })
                })
                .nth(e.occurrence.saturating_sub(1))
                .map(|(i, _)| i + 1)
                .or(section);
            let at = line.map_or(origin.to_string(), |n| format!("{origin}:{n}"));
            ConfigError(format!("{at}: [gateway]: {}", e.message))
        })
    }

    /// The memory budgets nest (connection ≤ session ≤ target) and each takes the largest
    /// write; no timeout, lockout count or window is zero. An error names the line of the key that is set (of the two
    /// that do not nest, the one in the file).
    fn validate_memory(&self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let line_of_key = |key: &str| {
            line_number(text, 0, |l| {
                l.trim_start()
                    .strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
            .map(|n| format!("{origin}:{n}"))
        };
        let largest_write_mib = u64::from(MAX_WRITE_LEN >> 20);
        let budgets = [
            ("connection_memory_mib", self.connection_memory_mib),
            ("session_memory_mib", self.session_memory_mib),
            ("memory_mib", self.memory_mib()),
        ];
        for (key, value) in budgets {
            if value < largest_write_mib {
                let at = line_of_key(key).unwrap_or_else(|| origin.to_string());
                return Err(ConfigError(format!(
                    "{at}: {key} = {value} must be at least {largest_write_mib} (the largest write)"
                )));
            }
        }
        for pair in budgets.windows(2) {
            let ((inner, inner_mib), (outer, outer_mib)) = (pair[0], pair[1]);
            if inner_mib > outer_mib {
                let at = line_of_key(inner)
                    .or_else(|| line_of_key(outer))
                    .unwrap_or_else(|| origin.to_string());
                return Err(ConfigError(format!(
                    "{at}: {inner} = {inner_mib} must be at most {outer} = {outer_mib} (a connection counts in its session, a session in the target)"
                )));
            }
        }
        for (key, value) in [
            ("data_out_timeout_secs", self.data_out_timeout_secs),
            ("max_immediate_commands", self.max_immediate_commands.into()),
            ("budget_wait_secs", self.budget_wait_secs),
            (
                "auth_failures_per_initiator",
                self.auth_failures_per_initiator.into(),
            ),
            (
                "auth_failures_per_address",
                self.auth_failures_per_address.into(),
            ),
            ("auth_failure_window_secs", self.auth_failure_window_secs),
            ("auth_lockout_secs", self.auth_lockout_secs),
        ] {
            if value == 0 {
                let at = line_of_key(key).unwrap_or_else(|| origin.to_string());
                return Err(ConfigError(format!("{at}: {key} must be at least 1")));
            }
        }
        Ok(())
    }

    /// The target's memory budget in MiB: `memory_mib`, or an eighth of the machine's memory
    /// (256 MiB to 8 GiB).
    pub fn memory_mib(&self) -> u64 {
        self.memory_mib
            .unwrap_or_else(|| (physical_memory_mib() / 8).clamp(256, 8 << 10))
    }

    /// How failed CHAP logins lock out a name or an address (`auth_failures_per_initiator`,
    /// `auth_failures_per_address`, `auth_failure_window_secs`, `auth_lockout_secs`).
    pub fn auth_throttle_limits(&self) -> ThrottleLimits {
        ThrottleLimits {
            per_initiator: self.auth_failures_per_initiator,
            per_address: self.auth_failures_per_address,
            window: Duration::from_secs(self.auth_failure_window_secs),
            lockout: Duration::from_secs(self.auth_lockout_secs),
            ..ThrottleLimits::default()
        }
    }

    /// The CHAP algorithms the target accepts (`chap_algorithms`; all when left out).
    pub fn chap_algorithms(&self) -> Vec<ChapAlgorithm> {
        match &self.chap_algorithms {
            None => ChapAlgorithm::ALL.to_vec(),
            Some(names) => names.iter().filter_map(|n| chap_algorithm(n)).collect(),
        }
    }

    /// LUN configs of a target as (number, config).
    pub fn luns(t: &TargetConfig) -> Vec<(u64, LunConfig)> {
        t.lun
            .iter()
            .map(|(k, v)| (k.parse::<u64>().expect("validated"), v.clone()))
            .collect()
    }
}

impl Config {
    /// The configuration as TOML, in the syntax [`Config::parse`] reads (every key written,
    /// defaults too): `Config::parse(&c.to_toml(), ..) == c`.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| {
            // Every field is a TOML value or table; nothing here can fail to serialize.
            unreachable!("a configuration that TOML cannot write: {e}")
        })
    }
}

/// Writes `config` to `path` so that a crash at any moment leaves either the old file or
/// the new one whole: the TOML goes to a temporary file in the same directory, which is
/// synced; the old file, if any, is kept as `PATH.bak` (a hard link, so `path` never
/// disappears); the temporary file is renamed over `path`, and the directory synced. On an
/// error the temporary file is removed and `path` is as it was.
pub fn save_atomic(path: &Path, config: &Config) -> Result<(), ConfigError> {
    use std::io::Write;
    let fail = |what: &str, p: &Path, e: std::io::Error| {
        ConfigError(format!("{}: cannot {what}: {e}", p.display()))
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| ConfigError(format!("{}: not a file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let write = || -> Result<(), ConfigError> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| fail("create", &tmp, e))?;
        f.write_all(config.to_toml().as_bytes())
            .map_err(|e| fail("write", &tmp, e))?;
        f.sync_all().map_err(|e| fail("sync", &tmp, e))?;
        if path.exists() {
            let mut bak = path.as_os_str().to_owned();
            bak.push(".bak");
            let bak = std::path::PathBuf::from(bak);
            let _ = std::fs::remove_file(&bak);
            std::fs::hard_link(path, &bak)
                .or_else(|_| std::fs::copy(path, &bak).map(|_| ()))
                .map_err(|e| fail("keep a copy as", &bak, e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| fail("rename over", path, e))
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fail("sync the directory", &dir, e))
}

/// `file:line` of each target's LUN tables: the `[target.lun.N]` header (or a `lun.N` key)
/// after the line that names the target, else that line.
fn lun_places(
    targets: &[TargetConfig],
    text: &str,
    origin: &str,
) -> BTreeMap<(String, u64), String> {
    let mut places = BTreeMap::new();
    for t in targets {
        let Some(named) = line_number(text, 0, |l| l.contains(&format!("\"{}\"", t.name))) else {
            continue;
        };
        for key in t.lun.keys() {
            let Ok(n) = key.parse::<u64>() else { continue };
            let header = format!("lun.{key}");
            let line = line_number(text, named, |l| {
                let l = l.trim_start().trim_start_matches('[');
                l.strip_prefix("target.")
                    .unwrap_or(l)
                    .strip_prefix(&header)
                    .is_some_and(|rest| rest.starts_with([']', ' ', '=']))
            })
            .unwrap_or(named);
            places.insert((t.name.to_ascii_lowercase(), n), format!("{origin}:{line}"));
        }
    }
    places
}

/// The number (from 1) of the first line of `text`, from the line at index `from` on, that
/// `wanted` accepts: where a configuration error points.
fn line_number(text: &str, from: usize, wanted: impl Fn(&str) -> bool) -> Option<usize> {
    text.lines()
        .skip(from)
        .position(wanted)
        .map(|i| from + i + 1)
}

/// Sessions a target can have at once: one per TSIH other than 0.
pub const MAX_SESSIONS: u32 = u16::MAX as u32;

/// The largest write (Expected Data Transfer Length) the target takes for one command.
pub const MAX_WRITE_LEN: u32 = 64 << 20;

/// The machine's memory (MemTotal), or 2 GiB when /proc/meminfo cannot tell.
fn physical_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib >> 10)
        })
        .unwrap_or(2 << 10)
}

/// The CHAP algorithm a `chap_algorithms` entry names (its name in any case).
fn chap_algorithm(name: &str) -> Option<ChapAlgorithm> {
    ChapAlgorithm::ALL
        .into_iter()
        .find(|a| a.name().eq_ignore_ascii_case(name))
}

/// The names `chap_algorithms` accepts, for error messages.
fn chap_algorithm_names() -> String {
    let names: Vec<String> = ChapAlgorithm::ALL
        .iter()
        .map(|a| format!("{:?}", a.name().to_ascii_lowercase()))
        .collect();
    names.join(", ")
}

fn auth(chap: &Option<Chap>, mutual: &Option<Chap>) -> AuthRequirement {
    match chap {
        None => AuthRequirement::None,
        Some(c) => AuthRequirement::Chap {
            credentials: c.credentials(),
            mutual: mutual.as_ref().map(Chap::credentials),
        },
    }
}

/// The login layer's view of the configured targets: the configuration as it runs now
/// (replaced whole by a live change, so a login reads one consistent snapshot per question).
pub struct Directory {
    config: std::sync::RwLock<std::sync::Arc<Config>>,
    /// The target's portals, which SendTargets lists: changed as portals are added and
    /// removed.
    pub(crate) portals: crate::portals::Portals,
}

impl Directory {
    pub(crate) fn new(config: Config, portals: crate::portals::Portals) -> Directory {
        Directory {
            config: std::sync::RwLock::new(std::sync::Arc::new(config)),
            portals,
        }
    }

    /// The configuration as it is now.
    pub fn config(&self) -> std::sync::Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Changes the configuration in place: `change` works on a copy, which replaces it whole,
    /// with no other change in between.
    pub(crate) fn update_config(&self, change: impl FnOnce(&mut Config)) {
        let mut config = self.config.write().unwrap_or_else(|e| e.into_inner());
        let mut next = Config::clone(&config);
        change(&mut next);
        *config = std::sync::Arc::new(next);
    }

    /// Makes `config` the configuration from now on.
    pub(crate) fn set_config(&self, config: Config) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(config);
    }

    fn find(&self, name: &str) -> Option<TargetConfig> {
        self.config()
            .targets
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
            .cloned()
    }
}

impl TargetDirectory for Directory {
    fn target_exists(&self, target: &str) -> bool {
        self.find(target).is_some()
    }
    fn initiator_allowed(&self, target: &str, initiator: &str) -> bool {
        self.find(target).is_some_and(|t| {
            t.initiators.is_empty()
                || t.initiators
                    .iter()
                    .any(|i| i.eq_ignore_ascii_case(initiator))
        })
    }
    fn target_auth(&self, target: &str) -> AuthRequirement {
        self.find(target)
            .map(|t| auth(&t.chap, &t.mutual_chap))
            .unwrap_or_default()
    }
    fn discovery_auth(&self) -> AuthRequirement {
        let config = self.config();
        auth(&config.discovery.chap, &config.discovery.mutual_chap)
    }
    fn target_alias(&self, target: &str) -> Option<String> {
        self.find(target).and_then(|t| t.alias)
    }
    fn target_names(&self) -> Vec<String> {
        self.config()
            .targets
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }
    /// This target's portals, then its peer gateways' (`[gateway]`), so that one discovery
    /// finds every path.
    fn portals(&self, _target: &str) -> Vec<Portal> {
        let mut portals = self.portals.entries();
        let tpgt = portals.first().map_or(1, |p| p.tpgt);
        if let Some(gateway) = &self.config().gateway {
            let peers = gateway.peers.iter().flat_map(|p| &p.portals);
            for address in peers.filter_map(|a| a.parse().ok()) {
                portals.push(Portal { address, tpgt });
            }
        }
        portals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portal_specs_are_written_as_they_are_read() {
        for text in [
            "tcp://127.0.0.1:3260",
            "iser://[::1]:3261",
            "tcp://0.0.0.0:0",
        ] {
            assert_eq!(PortalSpec::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            PortalSpec::parse("10.0.0.1:3260").unwrap().to_string(),
            "tcp://10.0.0.1:3260"
        );
    }

    #[test]
    fn error_recovery_level_is_checked() {
        let text = |erl: u8| {
            format!(
                "[[target]]\nname = \"iqn.2026-11.org.ironsan:t\"\nerror_recovery_level = {erl}\n"
            )
        };
        let c = Config::parse(&text(2), "t.toml").expect("level 2");
        assert_eq!(c.targets[0].error_recovery_level, 2);
        let e = Config::parse(&text(3), "t.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("t.toml:3: ") && e.contains("use 0") && e.contains("or 2"),
            "{e}"
        );
    }

    #[test]
    fn parses_a_full_config() {
        let text = r#"
portals = ["127.0.0.1:3261", "[::1]:3262"]
queue_depth = 64

[discovery]
chap = { user = "disc", secret = "discsecret12" }

[[target]]
name = "iqn.2026-11.org.ironsan:t1"
initiators = ["iqn.1994-05.com.redhat:x"]
chap = { user = "u", secret = "secretsecret" }
mutual_chap = { user = "t", secret = "targetsecret" }
header_digest = "required"

[target.lun.0]
size = "64MiB"
backend = "memory"

[target.lun.3]
size = "1MiB"
backend = "memory"
read_only = true
"#;
        let c = Config::parse(text, "t.toml").unwrap();
        assert_eq!(c.portals.len(), 2);
        assert_eq!(c.targets[0].header_digest, DigestSetting::Required);
        assert_eq!(
            Config::luns(&c.targets[0])
                .iter()
                .map(|l| l.0)
                .collect::<Vec<_>>(),
            vec![0, 3]
        );
    }

    /// The full example in docs/target.md is a valid configuration, and means what it says.
    #[test]
    fn lun_places_point_at_each_lun_table() {
        let text = "[[target]]\nname = \"iqn.2026-11.org.x:a\"\n[target.lun.1]\nbackend = \"memory\"\nsize = \"1MiB\"\n[target.lun.10]\nbackend = \"memory\"\nsize = \"1MiB\"\n\n[[target]]\nname = \"iqn.2026-11.org.x:b\"\nlun.1 = { backend = \"memory\", size = \"1MiB\" }\n";
        let c = Config::parse(text, "t.toml").unwrap();
        assert_eq!(c.lun_place("iqn.2026-11.org.x:a", 1), Some("t.toml:3"));
        assert_eq!(c.lun_place("iqn.2026-11.org.x:a", 10), Some("t.toml:6"));
        assert_eq!(c.lun_place("IQN.2026-11.org.x:B", 1), Some("t.toml:12"));
        assert_eq!(c.lun_place("iqn.2026-11.org.x:b", 2), None);
        assert_eq!(Config::embedded_default().lun_place(DEFAULT_IQN, 0), None);
    }

    #[test]
    fn documented_example_parses() {
        let page = include_str!("../../../docs/target.md");
        let start = page
            .find("```toml\n")
            .expect("a toml block in docs/target.md")
            + 8;
        let len = page[start..].find("```").expect("end of the toml block");
        let c = Config::parse(&page[start..start + len], "docs/target.md").unwrap();
        let luns = Config::luns(&c.targets[0]);
        assert_eq!(luns.len(), 6);
        assert!(matches!(luns[4].1.backend, scsi::BackendConfig::Osd { .. }));
        assert!(matches!(luns[5].1.backend, scsi::BackendConfig::Rbd(_)));
        let lun3 = &luns[3].1;
        assert!(lun3.sanitize && lun3.serial.as_deref() == Some("DISK3-0001"));
        // The derived identities must accept the example's WWN too.
        scsi::Device::new(&c.targets[0].name, vec![(3, lun3.clone())]).unwrap();
    }

    /// Every TOML block of docs/target.md that is a whole configuration.
    fn documented_configs() -> Vec<Config> {
        let page = include_str!("../../../docs/target.md");
        page.split("```toml\n")
            .skip(1)
            .filter_map(|b| b.split("```").next())
            .filter_map(|b| Config::parse(b, "docs/target.md").ok())
            .collect()
    }

    #[test]
    fn to_toml_parses_back_equal() {
        let mut configs = documented_configs();
        assert!(!configs.is_empty());
        configs.push(Config::embedded_default());
        let mut every_key = Config::parse(
            "memory_mib = 512\nchap_algorithms = [\"sha-256\"]\nmax_sessions = 9\n\
             [discovery]\nchap = { user = \"d\", secret = \"discsecret12\" }\n",
            "k.toml",
        )
        .unwrap();
        every_key.targets = Config::embedded_default().targets;
        let mut lun = scsi::LunConfig::memory(3 * 512);
        lun.backend = scsi::BackendConfig::File {
            path: "/tmp/x.img".into(),
            create: true,
        };
        lun.wwn = Some("0x3fedcba987654321".into());
        lun.io = scsi::IoConfig::Threads;
        every_key.targets[0].lun.insert("7".into(), lun);
        every_key.targets[0].chap = Some(Chap {
            user: "u".into(),
            secret: "secretsecret".into(),
        });
        every_key.targets[0].initiators = vec!["iqn.2026-11.org.x:i".into()];
        configs.push(every_key);
        for c in configs {
            let text = c.to_toml();
            let back = Config::parse(&text, "saved.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(back, c, "{text}");
        }
    }

    #[test]
    fn save_atomic_keeps_the_old_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("ironsan-save-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("target.toml");
        let first = Config::embedded_default();
        save_atomic(&path, &first).unwrap();
        assert_eq!(Config::load(&path).unwrap(), first);
        let mut second = first.clone();
        second.queue_depth = 7;
        save_atomic(&path, &second).unwrap();
        assert_eq!(Config::load(&path).unwrap(), second);
        assert_eq!(Config::load(&dir.join("target.toml.bak")).unwrap(), first);
        let names = |d: &Path| {
            let mut n: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&dir), ["target.toml", "target.toml.bak"]);
        // A path whose rename fails (a directory stands there): an error, the directory's
        // contents as they were, no temporary file left.
        let blocked = dir.join("blocked");
        std::fs::create_dir(blocked.join("")).unwrap();
        std::fs::write(blocked.join("inside"), "x").unwrap();
        let e = save_atomic(&blocked, &second).unwrap_err().0;
        assert!(e.contains("blocked"), "{e}");
        assert_eq!(names(&dir), ["blocked", "target.toml", "target.toml.bak"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn portals_name_their_transport() {
        let tcp = PortalSpec::parse("127.0.0.1:3260").unwrap();
        assert_eq!(tcp.kind, TransportKind::Tcp);
        assert_eq!(PortalSpec::parse("tcp://127.0.0.1:3260").unwrap(), tcp);
        let iser = PortalSpec::parse("iser://[::1]:3260").unwrap();
        assert_eq!(iser.kind, TransportKind::Iser);
        assert_eq!(iser.address, "[::1]:3260".parse().unwrap());
        let e = PortalSpec::parse("fc://127.0.0.1:3260").unwrap_err();
        assert!(
            e.contains("unknown transport \"fc\"") && e.contains("iser://"),
            "{e}"
        );
        let e = Config::parse("portals = [\"iser://nowhere\"]\n", "p.toml").unwrap_err();
        assert!(e.0.starts_with("p.toml:1: portal"), "{}", e.0);
    }

    #[test]
    fn a_mutual_chap_secret_equal_to_the_chap_secret_is_refused() {
        let target = "[[target]]\nname = \"iqn.2026-11.org.ironsan:t\"\n\
                      chap = { user = \"u\", secret = \"samesecret12\" }\n\
                      mutual_chap = { user = \"t\", secret = \"samesecret12\" }\n";
        let e = Config::parse(target, "t.toml").unwrap_err().0;
        assert!(
            e.starts_with("t.toml:4: ") && e.contains("must differ") && !e.contains('\n'),
            "{e}"
        );
        // The second target's mutual_chap line, not the first target's.
        let two = format!(
            "[[target]]\nname = \"iqn.2026-11.org.ironsan:a\"\n\
             chap = {{ user = \"u\", secret = \"secretsecret\" }}\n\
             mutual_chap = {{ user = \"t\", secret = \"targetsecret\" }}\n{}",
            target.replace(":t\"", ":b\"")
        );
        let e = Config::parse(&two, "t.toml").unwrap_err().0;
        assert!(e.starts_with("t.toml:8: ") && e.contains(":b"), "{e}");
        let discovery = "queue_depth = 8\n[discovery]\n\
                         chap = { user = \"d\", secret = \"discsecret12\" }\n\
                         mutual_chap = { user = \"t\", secret = \"discsecret12\" }\n";
        let e = Config::parse(discovery, "d.toml").unwrap_err().0;
        assert!(
            e.starts_with("d.toml:4: ") && e.contains("discovery") && e.contains("must differ"),
            "{e}"
        );
        // Different secrets are fine.
        Config::parse(
            &discovery.replace(
                "t\", secret = \"discsecret12",
                "t\", secret = \"othersecret1",
            ),
            "d.toml",
        )
        .expect("different secrets");
    }

    #[test]
    fn chap_algorithms_name_implemented_ones() {
        let c = Config::parse("queue_depth = 8\n", "c.toml").unwrap();
        assert_eq!(c.chap_algorithms(), ChapAlgorithm::ALL.to_vec());
        let c = Config::parse("chap_algorithms = [\"SHA-256\", \"sha3-256\"]\n", "c.toml").unwrap();
        assert_eq!(
            c.chap_algorithms(),
            vec![ChapAlgorithm::Sha256, ChapAlgorithm::Sha3_256]
        );
        let e = Config::parse(
            "queue_depth = 8\nchap_algorithms = [\"sha-512\"]\n",
            "c.toml",
        )
        .unwrap_err()
        .0;
        assert!(
            e.starts_with("c.toml:2: ") && e.contains("\"sha-512\"") && e.contains("\"md5\""),
            "{e}"
        );
        let e = Config::parse("chap_algorithms = []\n", "c.toml")
            .unwrap_err()
            .0;
        assert!(
            e.starts_with("c.toml:1: ") && e.contains("at least one"),
            "{e}"
        );
    }

    const GATEWAY: &str = r#"
[gateway]
group = "cluster-1"
name = "gw-a"
port_group = 1
relative_port = 1
[[gateway.peer]]
name = "gw-b"
port_group = 2
relative_port = 2
portals = ["127.0.0.2:3260"]
[[target]]
name = "iqn.2026-11.org.x:shared"
[target.lun.0]
backend = { type = "file", path = "/srv/lun0.img" }
owner_lock = "/srv/lun0.owner"
"#;

    #[test]
    fn a_gateway_section_parses_and_writes_back() {
        let c = Config::parse(GATEWAY, "g.toml").unwrap();
        let g = c.gateway.as_ref().unwrap();
        assert_eq!(
            (g.name.as_str(), g.port_group, g.relative_port),
            ("gw-a", 1, 1)
        );
        assert_eq!((g.hold_down_ms, g.check_interval_ms), (5000, 1000));
        assert_eq!(g.peers[0].portals, vec!["127.0.0.2:3260".to_string()]);
        let lun = &c.targets[0].lun["0"];
        assert_eq!(
            lun.owner_lock.as_deref(),
            Some(Path::new("/srv/lun0.owner"))
        );
        assert_eq!(Config::parse(&c.to_toml(), "again.toml").unwrap(), c);
        assert!(Config::embedded_default().gateway.is_none());
    }

    #[test]
    fn gateway_mistakes_name_their_line() {
        let e = |text: String| Config::parse(&text, "g.toml").unwrap_err().0;
        // Line 9 is the peer's `port_group = 2`; 1 repeats this gateway's.
        let err = e(GATEWAY.replace("port_group = 2", "port_group = 1"));
        assert!(
            err.starts_with("g.toml:9: ") && err.contains("target port group id 1 is used twice"),
            "{err}"
        );
        let err = e(GATEWAY.replace("relative_port = 2", "relative_port = 1"));
        assert!(
            err.starts_with("g.toml:10: ") && err.contains("relative target port id 1"),
            "{err}"
        );
        let err = e(GATEWAY.replace("relative_port = 1", "relative_port = 0"));
        assert!(
            err.starts_with("g.toml:6: ") && err.contains("reserved"),
            "{err}"
        );
        let err = e(GATEWAY.replace("\"gw-b\"", "\"gw-a\""));
        assert!(
            err.starts_with("g.toml:8: ") && err.contains("used twice"),
            "{err}"
        );
        let err = e(GATEWAY.replace("127.0.0.2:3260", "somewhere"));
        assert!(
            err.starts_with("g.toml:11: ") && err.contains("ADDR:PORT"),
            "{err}"
        );
        let err = e(GATEWAY.replace(
            "relative_port = 1\n",
            "relative_port = 1\ncheck_interval_ms = 0\n",
        ));
        assert!(
            err.starts_with("g.toml:7: ") && err.contains("check_interval_ms"),
            "{err}"
        );
        // owner_lock without [gateway].
        let alone = GATEWAY.split("[[target]]").nth(1).unwrap();
        let err = e(format!("[[target]]{alone}"));
        assert!(
            err.starts_with("g.toml:5: ") && err.contains("needs a [gateway]"),
            "{err}"
        );
    }

    #[test]
    fn errors_name_file_line_and_fix() {
        let e = Config::parse(
            "portals = [\"127.0.0.1:3260\"]\nqueue_depht = 3\n",
            "x.toml",
        )
        .unwrap_err()
        .0;
        assert!(e.starts_with("x.toml:2:"), "{e}");
        assert!(e.contains("queue_depht"), "{e}");
        let e = Config::parse("portals = [\"localhost\"]\n", "x.toml")
            .unwrap_err()
            .0;
        assert!(e.starts_with("x.toml:1:") && e.contains("ADDR:PORT"), "{e}");
        let e = Config::parse("[[target]]\nname = \"target1\"\n", "x.toml")
            .unwrap_err()
            .0;
        assert!(e.starts_with("x.toml:2:") && e.contains("iqn."), "{e}");
        let e = Config::parse("[[target]]\nname = \"iqn.2026-11.x:y\"\n[target.lun.zero]\nbackend = \"memory\"\nsize = \"1MiB\"\n", "x.toml").unwrap_err().0;
        assert!(
            e.contains("x.toml:3:") && e.contains("must be a number"),
            "{e}"
        );
    }

    #[test]
    fn rbd_backend_mistakes_name_their_line() {
        let head = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[target.lun.1]\n";
        let c = Config::parse(
            &format!("{head}backend = {{ type = \"rbd\", pool = \"rbd\", image = \"disk1\" }}\n"),
            "x.toml",
        )
        .unwrap();
        assert!(matches!(
            &Config::luns(&c.targets[0])[0].1.backend,
            scsi::BackendConfig::Rbd(s) if s.pool == "rbd" && s.image == "disk1" && !s.create
        ));
        let e = Config::parse(
            &format!("{head}backend = {{ type = \"rbd\", pool = \"rbd\", image = \"d\", create = true }}\n"),
            "x.toml",
        )
        .unwrap_err()
        .0;
        assert!(
            e.starts_with("x.toml:3:") && e.contains("needs a size"),
            "{e}"
        );
        let e = Config::parse(
            &format!("{head}backend = {{ type = \"rbd\", pool = \"rbd\" }}\n"),
            "x.toml",
        )
        .unwrap_err()
        .0;
        assert!(e.starts_with("x.toml:4:") && e.contains("image"), "{e}");
        let e = Config::parse(&format!("{head}backend = \"rbd\"\n"), "x.toml")
            .unwrap_err()
            .0;
        assert!(e.starts_with("x.toml:4:") && e.contains("pool"), "{e}");
    }

    #[test]
    fn auth_lockout_and_budget_wait_are_configured() {
        let defaults = Config::parse("", "x.toml").expect("no keys");
        assert_eq!(
            defaults.auth_throttle_limits(),
            ThrottleLimits::default(),
            "left out, the throttle keeps its defaults"
        );
        assert_eq!(defaults.budget_wait_secs, 5);
        let c = Config::parse(
            "auth_failures_per_initiator = 3\nauth_failures_per_address = 7\n\
             auth_failure_window_secs = 120\nauth_lockout_secs = 300\nbudget_wait_secs = 9\n",
            "x.toml",
        )
        .expect("valid keys");
        let limits = c.auth_throttle_limits();
        assert_eq!(limits.per_initiator, 3);
        assert_eq!(limits.per_address, 7);
        assert_eq!(limits.window, Duration::from_secs(120));
        assert_eq!(limits.lockout, Duration::from_secs(300));
        assert_eq!(limits.capacity, ThrottleLimits::default().capacity);
        assert_eq!(c.budget_wait_secs, 9);
    }

    #[test]
    fn a_zero_auth_limit_or_budget_wait_names_its_line() {
        for key in [
            "auth_failures_per_initiator",
            "auth_failures_per_address",
            "auth_failure_window_secs",
            "auth_lockout_secs",
            "budget_wait_secs",
        ] {
            let e = Config::parse(&format!("queue_depth = 8\n{key} = 0\n"), "x.toml")
                .unwrap_err()
                .0;
            assert_eq!(e, format!("x.toml:2: {key} must be at least 1"));
        }
        let e = Config::parse("auth_lockout_secs = -1\n", "x.toml")
            .unwrap_err()
            .0;
        assert!(e.starts_with("x.toml:1:"), "{e}");
    }
}
