//! Live administration of a running target: targets added and removed, ACLs and CHAP
//! changed, LUNs made read-only or resized, sessions listed, asked to log out or dropped,
//! the running configuration read back ([`Target::running_config`]) and a whole new one
//! applied as the difference from it ([`Target::reconfigure`]).
//!
//! Every change is a transaction: it is checked whole first, and a refused one changes
//! nothing and says what to fix. A change touches only what it names; other sessions
//! carry on unaware. Changes run one at a time (`Target::changing`). Login and SendTargets
//! read the configuration as one snapshot that a change replaces whole, so a target is
//! complete (its LUNs open) before it is visible, and gone before its sessions are closed.
//!
//! ACL and CHAP changes apply to new logins. An initiator taken off a target's ACL loses
//! its sessions with that target at once: access revoked should not last until the
//! initiator happens to log out.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use iscsi_wire::AsyncMessage;
use serde::Serialize;

use crate::config::{Chap, PortalSpec, TargetConfig};
use crate::session::Session;
use crate::{Config, LunAdminError, Target, DEFAULT_PORTAL};

/// One session, as [`Target::sessions`] reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SessionInfo {
    pub tsih: u16,
    /// The initiator's ISID, 12 hex digits.
    pub isid: String,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// `None` for a discovery session.
    pub target_name: Option<String>,
    /// "Normal" or "Discovery".
    pub session_type: String,
    /// The CHAP user the initiator authenticated as, if it did.
    pub chap_user: Option<String>,
    pub keys: SessionKeys,
    pub connections: Vec<ConnectionInfo>,
}

/// A session's negotiated keys (RFC 7143 §13).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SessionKeys {
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    pub target_portal_group_tag: u16,
}

/// One connection of a session.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub cid: u16,
    pub peer: SocketAddr,
    /// The address of the portal that accepted it.
    pub local: SocketAddr,
    /// "iSCSI/TCP" or "iSER".
    pub transport: String,
    pub header_digest: bool,
    pub data_digest: bool,
    /// What the target receives in one PDU's data.
    pub max_recv_data_segment_length: u32,
    /// What the initiator receives in one PDU's data (as of now: Text may change it).
    pub max_send_data_segment_length: u32,
    /// SCSI commands running on it now.
    pub commands_in_flight: usize,
    /// SCSI commands executed on it so far.
    pub commands: u64,
    /// Write data it brought (bytes).
    pub bytes_written: u64,
    /// Read data produced for it (bytes).
    pub bytes_read: u64,
}

fn session_info(s: &Session) -> SessionInfo {
    let p = &s.params;
    let mut connections: Vec<ConnectionInfo> = s
        .connections()
        .iter()
        .map(|c| ConnectionInfo {
            cid: c.cid,
            peer: c.peer,
            local: c.local,
            transport: match c.transport {
                datamover::TransportKind::Tcp => "iSCSI/TCP".into(),
                datamover::TransportKind::Iser => "iSER".into(),
            },
            header_digest: c.digests.header,
            data_digest: c.digests.data,
            max_recv_data_segment_length: c.max_recv,
            max_send_data_segment_length: c.max_send(),
            commands_in_flight: c.in_flight(),
            commands: c.commands.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
        })
        .collect();
    connections.sort_by_key(|c| c.cid);
    SessionInfo {
        tsih: s.tsih,
        isid: s.identity.isid.iter().map(|b| format!("{b:02x}")).collect(),
        initiator_name: p.initiator_name.clone(),
        initiator_alias: p.initiator_alias.clone(),
        target_name: p.target_name.clone(),
        session_type: p.session_type.as_str().to_string(),
        chap_user: s.chap_user.clone(),
        keys: SessionKeys {
            max_connections: p.max_connections,
            initial_r2t: p.initial_r2t,
            immediate_data: p.immediate_data,
            max_burst_length: p.max_burst_length,
            first_burst_length: p.first_burst_length,
            default_time2wait: p.default_time2wait,
            default_time2retain: p.default_time2retain,
            max_outstanding_r2t: p.max_outstanding_r2t,
            data_pdu_in_order: p.data_pdu_in_order,
            data_sequence_in_order: p.data_sequence_in_order,
            error_recovery_level: p.error_recovery_level,
            target_portal_group_tag: p.target_portal_group_tag,
        },
        connections,
    }
}

fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Sessions, connections and single changes.
impl Target {
    /// Every session, by TSIH.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let mut all: Vec<SessionInfo> = self
            .sessions
            .lock()
            .expect("sessions")
            .values()
            .map(|s| session_info(s))
            .collect();
        all.sort_by_key(|s| s.tsih);
        all
    }

    fn session(&self, tsih: u16) -> Result<Arc<Session>, String> {
        self.sessions
            .lock()
            .expect("sessions")
            .get(&tsih)
            .cloned()
            .ok_or_else(|| format!("no session has TSIH {tsih}"))
    }

    /// Asks the initiator of session `tsih` to log out (Async Message, event 1: logout
    /// requested, within `grace`), and drops the session if it is still there after
    /// `grace`. Returns once the request is sent.
    pub async fn logout_session(
        self: &Arc<Self>,
        tsih: u16,
        grace: Duration,
    ) -> Result<(), String> {
        let s = self.session(tsih)?;
        ask_logout(&s, grace).await;
        let target = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if target.session(tsih).is_ok_and(|now| Arc::ptr_eq(&now, &s)) {
                tracing::info!(tsih, "session did not log out within {grace:?}: dropped");
                target.drop_sessions(&[s]);
            }
        });
        Ok(())
    }

    /// Closes every connection of session `tsih` now (its commands are aborted, as when
    /// the network fails).
    pub fn drop_session(&self, tsih: u16) -> Result<(), String> {
        let s = self.session(tsih)?;
        self.drop_sessions(&[s]);
        Ok(())
    }

    /// A connection that joined its session after the session was dropped (between its
    /// Login Response and its start, when `drop_sessions` found it not there yet) ends
    /// too. The connection is in its session first, then this looks for the session: one
    /// of the two sees the other.
    pub(crate) fn closed_meanwhile(&self, logged_in: &crate::LoggedIn) {
        let s = &logged_in.session;
        if self.session(s.tsih).is_ok_and(|now| Arc::ptr_eq(&now, s)) {
            return;
        }
        tracing::info!(
            tsih = s.tsih,
            "session dropped while its connection started: closing it"
        );
        logged_in.conn.dm.close();
    }

    fn drop_sessions(&self, sessions: &[Arc<Session>]) {
        for s in sessions {
            self.remove_session(s);
            s.close_all();
        }
    }

    /// The sessions with target `name` whose initiator `keep` refuses.
    fn sessions_with(&self, name: &str, keep: impl Fn(&Session) -> bool) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .expect("sessions")
            .values()
            .filter(|s| {
                s.params
                    .target_name
                    .as_deref()
                    .is_some_and(|t| same_name(t, name))
                    && !keep(s)
            })
            .cloned()
            .collect()
    }

    /// Adds target `t` while the target runs: its LUNs are opened first (on a blocking
    /// thread), then it appears in SendTargets and takes logins at once. A name in use or
    /// an invalid table is refused, and nothing changes.
    pub async fn add_target(&self, t: TargetConfig) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        let mut next = Config::clone(&self.config());
        next.targets.push(t.clone());
        next.check(&format!("target {}", t.name)).map_err(|e| e.0)?;
        let device = self.open_device(&t).await?;
        self.devices
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.name.to_ascii_lowercase(), device);
        self.directory.set_config(next);
        Ok(())
    }

    /// Opens target `t`'s LUNs into a device of its own, not yet visible.
    async fn open_device(&self, t: &TargetConfig) -> Result<Arc<scsi::Device>, String> {
        let (name, luns, images) = (t.name.clone(), Config::luns(t), self.images.clone());
        let gateway = self.config().gateway.clone();
        let device = tokio::task::spawn_blocking(move || {
            scsi::Device::with_gateway(&name, luns, images, gateway)
        })
        .await
        .map_err(|e| format!("target {}: opening its LUNs failed: {e}", t.name))?
        .map_err(|e| format!("target {}: {e}", t.name))?;
        Ok(Arc::new(device))
    }

    /// Removes target `name` while the target runs: it leaves SendTargets and refuses
    /// logins at once, its sessions are closed, then its LUNs are closed.
    pub async fn remove_target(&self, name: &str) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        self.remove_target_locked(name)
    }

    fn remove_target_locked(&self, name: &str) -> Result<(), String> {
        let mut next = Config::clone(&self.config());
        let before = next.targets.len();
        next.targets.retain(|t| !same_name(&t.name, name));
        if next.targets.len() == before {
            return Err(format!("no target is named {name}"));
        }
        self.directory.set_config(next);
        self.drop_sessions(&self.sessions_with(name, |_| false));
        self.devices
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name.to_ascii_lowercase());
        Ok(())
    }

    /// Changes target `name`'s table with `change`, checks the whole configuration, and
    /// makes it the one logins see; then drops the sessions its ACL no longer allows.
    async fn change_target(
        &self,
        name: &str,
        change: impl FnOnce(&mut TargetConfig) -> Result<(), String>,
    ) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        let mut next = Config::clone(&self.config());
        let t = next
            .targets
            .iter_mut()
            .find(|t| same_name(&t.name, name))
            .ok_or_else(|| format!("no target is named {name}"))?;
        change(t)?;
        let acl = t.initiators.clone();
        next.check(&format!("target {name}")).map_err(|e| e.0)?;
        self.directory.set_config(next);
        self.enforce_acl(name, &acl);
        Ok(())
    }

    /// Drops target `name`'s sessions of initiators `acl` does not list (none when empty).
    fn enforce_acl(&self, name: &str, acl: &[String]) {
        let allowed = |s: &Session| {
            acl.is_empty() || acl.iter().any(|i| same_name(i, &s.params.initiator_name))
        };
        let refused = self.sessions_with(name, allowed);
        for s in &refused {
            tracing::info!(
                tsih = s.tsih,
                "{} is no longer allowed on {name}: its session is dropped",
                s.params.initiator_name
            );
        }
        self.drop_sessions(&refused);
    }

    /// Sets target `name`'s ACL (empty: every initiator). Sessions of initiators it leaves
    /// out are dropped.
    pub async fn set_initiators(&self, name: &str, initiators: Vec<String>) -> Result<(), String> {
        self.change_target(name, |t| {
            t.initiators = initiators;
            Ok(())
        })
        .await
    }

    /// Adds `initiator` to target `name`'s ACL (an ACL that was empty then allows only it:
    /// the other initiators' sessions are dropped).
    pub async fn add_initiator(&self, name: &str, initiator: &str) -> Result<(), String> {
        self.change_target(name, |t| {
            if t.initiators.iter().any(|i| same_name(i, initiator)) {
                return Err(format!("{initiator} is already in the ACL of {name}"));
            }
            t.initiators.push(initiator.to_string());
            Ok(())
        })
        .await
    }

    /// Removes `initiator` from target `name`'s ACL; its sessions with that target are
    /// dropped. Removing the last name would open the target to everyone: refused (use
    /// [`Target::set_initiators`] with an empty list for that).
    pub async fn remove_initiator(&self, name: &str, initiator: &str) -> Result<(), String> {
        self.change_target(name, |t| {
            let before = t.initiators.len();
            t.initiators.retain(|i| !same_name(i, initiator));
            if t.initiators.len() == before {
                return Err(format!("{initiator} is not in the ACL of {name}"));
            }
            if t.initiators.is_empty() {
                return Err(format!(
                    "{initiator} is the last name in the ACL of {name}: without it every \
                     initiator could log in; set an empty ACL explicitly if that is meant"
                ));
            }
            Ok(())
        })
        .await
    }

    /// Sets (or with `None`, clears) target `name`'s CHAP and mutual CHAP; new logins only.
    pub async fn set_chap(
        &self,
        name: &str,
        chap: Option<Chap>,
        mutual_chap: Option<Chap>,
    ) -> Result<(), String> {
        self.change_target(name, |t| {
            t.chap = chap;
            t.mutual_chap = mutual_chap;
            Ok(())
        })
        .await
    }

    /// Sets (or clears) discovery sessions' CHAP and mutual CHAP; new logins only.
    pub async fn set_discovery_chap(
        &self,
        chap: Option<Chap>,
        mutual_chap: Option<Chap>,
    ) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        let mut next = Config::clone(&self.config());
        next.discovery.chap = chap;
        next.discovery.mutual_chap = mutual_chap;
        next.check("discovery").map_err(|e| e.0)?;
        self.directory.set_config(next);
        Ok(())
    }

    /// Makes LUN `lun` of target `target` read-only (writes then get DATA PROTECT, WRITE
    /// PROTECTED; MODE SENSE sets WP) or writable again.
    pub async fn set_lun_read_only(
        &self,
        target: &str,
        lun: u64,
        read_only: bool,
    ) -> Result<(), LunAdminError> {
        self.device(target)?
            .set_read_only(lun, read_only)
            .map_err(LunAdminError::Lun)
    }

    /// Resizes LUN `lun` of target `target` to `bytes` (see [`scsi::Device::resize_lun`]);
    /// every session of that target hears CAPACITY DATA HAS CHANGED on its next command to
    /// the LUN.
    pub async fn resize_lun(
        &self,
        target: &str,
        lun: u64,
        bytes: u64,
    ) -> Result<(), LunAdminError> {
        self.device(target)?
            .resize_lun(lun, bytes)
            .await
            .map_err(LunAdminError::Lun)
    }

    /// The configuration as it runs now: as started, with every live change since (targets,
    /// ACLs, CHAP, LUNs added and removed, read-only flags, sizes, portals removed).
    pub fn running_config(&self) -> Config {
        let mut c = Config::clone(&self.config());
        for t in &mut c.targets {
            if let Ok(device) = self.device(&t.name) {
                t.lun = device
                    .luns()
                    .into_iter()
                    .filter_map(|n| Some((n.to_string(), device.lun_config(n)?)))
                    .collect();
            }
        }
        c
    }
}

/// Sends the Async Message "logout requested" to every connection of `s`.
async fn ask_logout(s: &Session, grace: Duration) {
    for c in s.connections() {
        let msg = AsyncMessage {
            event: 1,
            param3: grace.as_secs().clamp(1, u64::from(u16::MAX)) as u16,
            ..Default::default()
        };
        c.send_async(msg).await;
    }
}

/// What a new configuration changes in a running one.
#[derive(Default)]
struct Plan {
    targets_removed: Vec<String>,
    targets_added: Vec<TargetConfig>,
    /// (target, LUN, new config): added, or replaced when also in `luns_removed`.
    luns_added: Vec<(String, u64, scsi::LunConfig)>,
    luns_removed: Vec<(String, u64)>,
    read_only: Vec<(String, u64, bool)>,
    resized: Vec<(String, u64, u64)>,
    /// Targets whose table (ACL, CHAP, digests, alias, ErrorRecoveryLevel) changed.
    tables: Vec<String>,
    portals_removed: Vec<SocketAddr>,
    /// What cannot change live, left as it runs.
    restart: Vec<String>,
}

/// The portals a configuration lists (the default one when it lists none).
fn portal_specs(c: &Config) -> Vec<PortalSpec> {
    let listed: Vec<&str> = if c.portals.is_empty() {
        vec![DEFAULT_PORTAL]
    } else {
        c.portals.iter().map(String::as_str).collect()
    };
    listed
        .into_iter()
        .filter_map(|p| PortalSpec::parse(p).ok())
        .collect()
}

/// The top-level settings of `c` other than portals, discovery and targets, as TOML values.
fn settings(c: &Config) -> BTreeMap<String, toml::Value> {
    let mut v = toml::Value::try_from(c).ok();
    let table = v.as_mut().and_then(|v| v.as_table_mut());
    let Some(table) = table else {
        return BTreeMap::new();
    };
    for key in ["portals", "discovery", "target"] {
        table.remove(key);
    }
    table.clone().into_iter().collect()
}

impl Plan {
    fn of(running: &Config, new: &Config) -> Plan {
        let mut plan = Plan::default();
        let (old_settings, new_settings) = (settings(running), settings(new));
        for (key, value) in &new_settings {
            if old_settings.get(key) != Some(value) {
                plan.restart.push(format!(
                    "{key} = {value}: needs a restart (it runs with {})",
                    old_settings
                        .get(key)
                        .map_or("its default".to_string(), |v| v.to_string())
                ));
            }
        }
        for key in old_settings
            .keys()
            .filter(|k| !new_settings.contains_key(*k))
        {
            plan.restart
                .push(format!("{key} left out: needs a restart"));
        }
        let (old_portals, new_portals) = (portal_specs(running), portal_specs(new));
        for p in &old_portals {
            if !new_portals.contains(p) {
                plan.portals_removed.push(p.address);
            }
        }
        for p in &new_portals {
            if !old_portals.contains(p) {
                plan.restart.push(format!(
                    "portal {:?} {}: needs a restart (portals are bound at start)",
                    p.kind, p.address
                ));
            }
        }
        let find = |c: &Config, name: &str| -> Option<TargetConfig> {
            c.targets.iter().find(|t| same_name(&t.name, name)).cloned()
        };
        for old in &running.targets {
            if find(new, &old.name).is_none() {
                plan.targets_removed.push(old.name.clone());
            }
        }
        for t in &new.targets {
            match find(running, &t.name) {
                None => plan.targets_added.push(t.clone()),
                Some(old) => plan.target_changes(&old, t),
            }
        }
        plan
    }

    fn target_changes(&mut self, old: &TargetConfig, new: &TargetConfig) {
        let name = &new.name;
        let (mut a, mut b) = (old.clone(), new.clone());
        a.lun.clear();
        b.lun.clear();
        if a != b {
            self.tables.push(name.clone());
        }
        let old_luns: BTreeMap<u64, scsi::LunConfig> = Config::luns(old).into_iter().collect();
        let new_luns: BTreeMap<u64, scsi::LunConfig> = Config::luns(new).into_iter().collect();
        for n in old_luns.keys().filter(|n| !new_luns.contains_key(n)) {
            self.luns_removed.push((name.clone(), *n));
        }
        for (n, cfg) in &new_luns {
            let Some(was) = old_luns.get(n) else {
                self.luns_added.push((name.clone(), *n, cfg.clone()));
                continue;
            };
            let mut same_but = was.clone();
            same_but.read_only = cfg.read_only;
            same_but.size = cfg.size;
            if same_but != *cfg {
                // Another backend or identity: another LUN under the same number.
                self.luns_removed.push((name.clone(), *n));
                self.luns_added.push((name.clone(), *n, cfg.clone()));
                continue;
            }
            if was.read_only != cfg.read_only {
                self.read_only.push((name.clone(), *n, cfg.read_only));
            }
            if let (Some(size), true) = (cfg.size, was.size != cfg.size) {
                self.resized.push((name.clone(), *n, size.0));
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.targets_removed.is_empty()
            && self.targets_added.is_empty()
            && self.luns_added.is_empty()
            && self.luns_removed.is_empty()
            && self.read_only.is_empty()
            && self.resized.is_empty()
            && self.tables.is_empty()
            && self.portals_removed.is_empty()
    }
}

/// A whole new configuration applied live.
impl Target {
    /// Applies `new` as the difference from the running configuration: targets added and
    /// removed, LUNs added, removed, replaced (another backend or identity), made read-only
    /// or writable and resized, ACL, CHAP, digest and alias changes, portals removed.
    /// Settings that cannot change live (top-level keys such as `memory_mib`, portals
    /// added) are left as they run and reported as needing a restart. `new` is checked
    /// whole first, and the new targets' and LUNs' backends opened before anything else
    /// changes: a configuration refused then changes nothing. A step that fails later (a
    /// LUN that cannot be removed or resized) stops there, its error saying so. Returns
    /// one line per change made.
    pub async fn reconfigure(&self, new: Config) -> Result<Vec<String>, String> {
        let _changing = self.changing.lock().await;
        new.check("new configuration").map_err(|e| e.0)?;
        let running = self.running_config();
        let plan = Plan::of(&running, &new);
        self.check_plan(&plan)?;
        // Everything that can fail to open is opened first, while nothing has changed.
        let mut opened = Vec::new();
        for t in &plan.targets_added {
            opened.push((t.name.to_ascii_lowercase(), self.open_device(t).await?));
        }
        let mut done = plan.restart.clone();
        if plan.is_empty() {
            return Ok(done);
        }
        self.apply_luns(&plan, &mut done).await?;
        // The configuration logins read: the new one, but for what needs a restart.
        let mut next = new.clone();
        next.clone_settings_from(&running);
        next.portals = running
            .portals
            .iter()
            .filter(|p| {
                PortalSpec::parse(p).is_ok_and(|s| !plan.portals_removed.contains(&s.address))
            })
            .cloned()
            .collect();
        {
            let mut devices = self.devices.write().unwrap_or_else(|e| e.into_inner());
            for (name, device) in opened {
                devices.insert(name, device);
            }
        }
        self.directory.set_config(next);
        for t in &plan.targets_added {
            done.push(format!("target {}: added", t.name));
        }
        for name in &plan.targets_removed {
            self.drop_sessions(&self.sessions_with(name, |_| false));
            self.devices
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&name.to_ascii_lowercase());
            done.push(format!("target {name}: removed"));
        }
        for name in &plan.tables {
            if let Some(t) = new.targets.iter().find(|t| same_name(&t.name, name)) {
                self.enforce_acl(name, &t.initiators);
            }
            done.push(format!(
                "target {name}: ACL, CHAP, digests or alias changed (new logins)"
            ));
        }
        for address in &plan.portals_removed {
            self.remove_portal(*address);
            done.push(format!("portal {address}: removed"));
        }
        Ok(done)
    }

    /// What the plan asks of existing LUNs that they may refuse, asked before anything
    /// changes: the LUNs exist, sizes fit the block size, a LUN opened read-only is not
    /// made writable.
    fn check_plan(&self, plan: &Plan) -> Result<(), String> {
        for (target, lun, read_only) in &plan.read_only {
            if !read_only && self.lun_was_opened_read_only(target, *lun) {
                return Err(format!(
                    "target {target} LUN {lun}: it was opened read-only; to make it writable \
                     change its backend too (it is then opened again) or restart"
                ));
            }
        }
        for (target, lun, _) in &plan.resized {
            let cfg = self.lun_config_of(target, *lun)?;
            match cfg.backend {
                scsi::BackendConfig::Memory | scsi::BackendConfig::File { .. } => {}
                _ => {
                    return Err(format!(
                        "target {target} LUN {lun}: its size cannot change here (only RAM and \
                         file LUNs are resized live)"
                    ))
                }
            }
        }
        Ok(())
    }

    fn lun_config_of(&self, target: &str, lun: u64) -> Result<scsi::LunConfig, String> {
        self.device(target)
            .map_err(|e| e.to_string())?
            .lun_config(lun)
            .ok_or_else(|| format!("target {target} has no LUN {lun}"))
    }

    /// Whether the LUN's backend was opened read-only (a live flag set later does not
    /// reopen it).
    fn lun_was_opened_read_only(&self, target: &str, lun: u64) -> bool {
        self.device(target)
            .ok()
            .and_then(|d| d.opened_read_only(lun))
            .unwrap_or(false)
    }

    /// LUNs of existing targets: removed (replaced ones too), added, flags and sizes. An
    /// added LUN that fails to open undoes the additions before it and the whole change
    /// is refused; removals come after the additions for that reason.
    async fn apply_luns(&self, plan: &Plan, done: &mut Vec<String>) -> Result<(), String> {
        let replaced = |t: &str, n: u64| {
            plan.luns_removed
                .iter()
                .any(|(rt, rn)| same_name(rt, t) && *rn == n)
        };
        let mut added: Vec<(String, u64)> = Vec::new();
        for (t, n, cfg) in plan.luns_added.iter().filter(|(t, n, _)| !replaced(t, *n)) {
            if let Err(e) = self.add_lun(t, *n, cfg.clone()).await {
                for (t, n) in &added {
                    let _ = self.remove_lun(t, *n).await;
                }
                return Err(format!("target {t}: {e}; nothing was changed"));
            }
            added.push((t.clone(), *n));
            done.push(format!("target {t} LUN {n}: added"));
        }
        for (t, n) in &plan.luns_removed {
            self.remove_lun(t, *n)
                .await
                .map_err(|e| format!("target {t}: {e} (the changes before it were made)"))?;
            if let Some((_, _, cfg)) = plan
                .luns_added
                .iter()
                .find(|(at, an, _)| same_name(at, t) && an == n)
            {
                self.add_lun(t, *n, cfg.clone())
                    .await
                    .map_err(|e| format!("target {t} LUN {n}: removed to be replaced, but {e}"))?;
                done.push(format!(
                    "target {t} LUN {n}: replaced (backend or identity changed)"
                ));
            } else {
                done.push(format!("target {t} LUN {n}: removed"));
            }
        }
        for (t, n, ro) in &plan.read_only {
            self.set_lun_read_only(t, *n, *ro)
                .await
                .map_err(|e| format!("target {t}: {e} (the changes before it were made)"))?;
            let now = if *ro { "read-only" } else { "writable" };
            done.push(format!("target {t} LUN {n}: {now}"));
        }
        for (t, n, bytes) in &plan.resized {
            self.resize_lun(t, *n, *bytes)
                .await
                .map_err(|e| format!("target {t}: {e} (the changes before it were made)"))?;
            done.push(format!("target {t} LUN {n}: resized to {bytes} bytes"));
        }
        Ok(())
    }
}

impl Config {
    /// Takes `from`'s top-level settings (all but portals, discovery and targets): those
    /// that need a restart keep running as they are.
    fn clone_settings_from(&mut self, from: &Config) {
        let (portals, discovery, targets) = (
            std::mem::take(&mut self.portals),
            std::mem::take(&mut self.discovery),
            std::mem::take(&mut self.targets),
        );
        *self = from.clone();
        self.portals = portals;
        self.discovery = discovery;
        self.targets = targets;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
portals = ["127.0.0.1:3260"]
[[target]]
name = "iqn.2026-11.org.x:a"
[target.lun.0]
size = "1MiB"
backend = "memory"
[target.lun.1]
size = "1MiB"
backend = "memory"
"#;

    #[test]
    fn a_plan_names_each_difference() {
        let running = Config::parse(BASE, "a.toml").unwrap();
        let new = BASE
            .replace("[target.lun.1]\nsize = \"1MiB\"", "[target.lun.1]\nsize = \"2MiB\"\nread_only = true")
            .replace("portals = [", "memory_mib = 512\nportals = [")
            + "[target.lun.2]\nsize = \"1MiB\"\nbackend = \"memory\"\n\
               [[target]]\nname = \"iqn.2026-11.org.x:b\"\ninitiators = [\"iqn.2026-11.org.x:i\"]\n";
        let new = Config::parse(&new, "b.toml").unwrap();
        let plan = Plan::of(&running, &new);
        assert_eq!(plan.targets_added.len(), 1);
        assert_eq!(plan.luns_added.len(), 1);
        assert_eq!(
            plan.read_only,
            vec![("iqn.2026-11.org.x:a".to_string(), 1, true)]
        );
        assert_eq!(
            plan.resized,
            vec![("iqn.2026-11.org.x:a".to_string(), 1, 2 << 20)]
        );
        assert!(plan.tables.is_empty() && plan.luns_removed.is_empty());
        assert_eq!(plan.restart.len(), 1, "{:?}", plan.restart);
        assert!(plan.restart[0].starts_with("memory_mib = 512: needs a restart"));
        assert!(Plan::of(&running, &running).is_empty());
    }
}
