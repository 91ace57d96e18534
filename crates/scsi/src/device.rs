//! The public face of the engine: a [`Device`] (all LUNs of one target, added and removed
//! while it runs), the [`Command`]/[`Response`] pair, I_T nexus bookkeeping and task
//! management.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;

use crate::alua::{AluaStatus, LunAlua};
use crate::cdb::op;
use crate::cmds::report_luns;
use crate::command::{finish_data_in, finish_error, Command, NexusId, NexusInfo, Response};
use crate::config::{
    derived_naa, derived_serial, parse_naa, BackendConfig, GatewayConfig, LunConfig,
};
use crate::lun::{ua_exempt, DeviceView, Lun};
use crate::object::ObjectLun;
use crate::pr::PrState;
use crate::pr_shared::SharedPr;
use crate::sense::{asc, key, Sense};
use crate::status;

/// Target reset flavour (task management).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    Warm,
    Cold,
}

/// Why a device could not be built or changed: what to fix, and the LUN it is about
/// (so a caller can point at that LUN's place in its configuration).
#[derive(Debug)]
pub struct DeviceError {
    pub message: String,
    pub lun: Option<u64>,
}

impl DeviceError {
    fn of_lun(lun: u64, message: String) -> DeviceError {
        DeviceError {
            message,
            lun: Some(lun),
        }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeviceError {}

/// Why a LUN could not be added to or removed from a running device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LunChangeError {
    /// A LUN (block or object) already has this number.
    InUse(u64),
    /// No LUN has this number.
    NotFound(u64),
    /// The number is out of range, the configuration invalid, or the backend would not
    /// open: what went wrong, naming the LUN.
    Build(String),
}

impl fmt::Display for LunChangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LunChangeError::InUse(n) => write!(f, "LUN {n} is already in use"),
            LunChangeError::NotFound(n) => write!(f, "there is no LUN {n}"),
            LunChangeError::Build(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for LunChangeError {}

/// How long [`Device::remove_lun`] waits for the commands running on the LUN it removed.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// One logical unit of a device: a block device (SBC) or an object store (OSD).
#[derive(Clone)]
enum Unit {
    Block(Arc<Lun>),
    Object(Arc<ObjectLun>),
}

/// The device's LUNs at one moment, by number. A change builds a new map and publishes it
/// whole (see [`Device`]), so nothing ever edits a map that someone reads.
type LunMap = BTreeMap<u64, Unit>;

/// What the device keeps about an I_T nexus.
struct Nexus {
    info: NexusInfo,
    /// The LUN inventory changed since this nexus last heard of it: the next command it
    /// sends to a LUN (but INQUIRY and REPORT LUNS) carries REPORTED LUNS DATA HAS CHANGED.
    luns_changed: bool,
}

/// A SCSI target device: the logical units of one target.
///
/// The LUN map is read by every command and changed only by [`Device::add_lun`] and
/// [`Device::remove_lun`], so it is an `Arc` snapshot behind a `RwLock`: a command takes
/// the read lock for one lookup and an `Arc` clone (uncontended but for the instant a
/// change swaps the pointer: readers never wait on each other, and no change is built
/// while the lock is held), and walks over every LUN (task management, nexus loss) work
/// on a snapshot without holding any lock across their awaits.
pub struct Device {
    target_name: String,
    luns: RwLock<Arc<LunMap>>,
    /// Held by a change from reading the current map until the next one is published, so
    /// two changes never build from the same map.
    changing: Mutex<()>,
    /// Where RAM LUNs' images live, for LUNs built at start and later alike.
    image: Arc<ImageProvider>,
    nexuses: Mutex<HashMap<NexusId, Nexus>>,
    /// Each LUN's configuration as it runs (read-only flag and size as changed since), for
    /// [`Device::lun_config`]; changed under `changing`.
    configs: Mutex<BTreeMap<u64, LunConfig>>,
    /// The relative target port identifier of this device's one target port (SPC-4): the
    /// gateways exporting one LUN each have their own; 1 unless set.
    rel_port: AtomicU16,
    /// This process as one of several gateways of the same LUNs (ALUA), with `[gateway]`.
    gateway: Option<Arc<GatewayConfig>>,
}

impl Device {
    /// Builds the device, opening each LUN's backend. Identifiers not given in the
    /// config (serial, NAA) are derived from `target_name` and the LUN number, so they
    /// are stable across restarts.
    pub fn new(target_name: &str, luns: Vec<(u64, LunConfig)>) -> Result<Device, DeviceError> {
        Device::with_image_memory(target_name, luns, Arc::new(|_, _| None))
    }

    /// [`Device::new`], with RAM LUNs' images in memory `image(lun, size)` provides when it
    /// provides some (a transport's registered memory, so reads leave from where the data
    /// lies); the heap otherwise. LUNs added later get theirs from `image` too.
    pub fn with_image_memory(
        target_name: &str,
        luns: Vec<(u64, LunConfig)>,
        image: Arc<ImageProvider>,
    ) -> Result<Device, DeviceError> {
        Device::with_gateway(target_name, luns, image, None)
    }

    /// [`Device::with_image_memory`], as one of several gateways exporting the same LUNs
    /// when `gateway` is given: every block LUN reports asymmetric access (module
    /// [`crate::alua`]), a shared one (with `owner_lock`, or a backend that has a lock of its
    /// own) following its ownership.
    pub fn with_gateway(
        target_name: &str,
        luns: Vec<(u64, LunConfig)>,
        image: Arc<ImageProvider>,
        gateway: Option<GatewayConfig>,
    ) -> Result<Device, DeviceError> {
        // Reservations name an I_T nexus by this gateway's relative target port too.
        let rel_port = gateway.as_ref().map_or(1, |g| g.relative_port);
        let mut device = Device {
            gateway: gateway.map(Arc::new),
            target_name: target_name.to_string(),
            luns: RwLock::default(),
            changing: Mutex::new(()),
            image,
            nexuses: Mutex::new(HashMap::new()),
            configs: Mutex::default(),
            rel_port: AtomicU16::new(rel_port),
        };
        let mut map = LunMap::new();
        for (id, cfg) in luns {
            if map.contains_key(&id) {
                return Err(DeviceError::of_lun(
                    id,
                    format!("LUN {id} is configured twice"),
                ));
            }
            let unit = device
                .build_unit(id, cfg.clone())
                .map_err(|e| DeviceError::of_lun(id, e))?;
            map.insert(id, unit);
            device.configs().insert(id, cfg);
        }
        *device.luns.get_mut().unwrap_or_else(|e| e.into_inner()) = Arc::new(map);
        Ok(device)
    }

    /// Builds LUN `id` from its configuration, opening its backend: the one place a LUN is
    /// made, at start ([`Device::with_image_memory`]) and while running
    /// ([`Device::add_lun`]). Errors name the LUN.
    fn build_unit(&self, id: u64, cfg: LunConfig) -> Result<Unit, String> {
        let fail = |e: String| format!("LUN {id}: {e}");
        if id >= 16384 {
            return Err(fail("numbers must be below 16384".into()));
        }
        cfg.validate().map_err(fail)?;
        let (naa, serial) = identities(&self.target_name, id, &cfg).map_err(fail)?;
        if let BackendConfig::Osd { path } = &cfg.backend {
            let capacity = cfg.size.map_or(1 << 30, |s| s.0);
            let lun = ObjectLun::open(path, capacity, &cfg, serial, naa).map_err(fail)?;
            return Ok(Unit::Object(Arc::new(lun)));
        }
        let backend = open_backend(id, &cfg, &*self.image).map_err(fail)?;
        let size = backend.size();
        if size < cfg.block_size as u64 {
            return Err(fail(format!(
                "backend of {size} bytes is smaller than one block"
            )));
        }
        let shared = crate::pr_shared::source_of(&cfg, &*backend);
        let alua = self.lun_alua(id, &cfg, &backend).map_err(fail)?;
        let mut lun = Lun::new(id, cfg, backend, naa, serial, &self.target_name, alua);
        if let Some(src) = shared {
            let (shared, pr) = if src.read_at_start {
                SharedPr::open(src.blob, src.file).map_err(fail)?
            } else {
                (SharedPr::unread(src.blob, src.file), PrState::default())
            };
            lun = lun.with_shared_pr(shared, pr);
        }
        Ok(Unit::Block(Arc::new(lun)))
    }

    /// LUN `id`'s ALUA side with `[gateway]`: its owner is the lock file `owner_lock`
    /// names, or the backend's own lock; neither: the LUN is not shared.
    fn lun_alua(
        &self,
        id: u64,
        cfg: &LunConfig,
        backend: &Arc<dyn storage::Backend>,
    ) -> Result<Option<LunAlua>, String> {
        let Some(gateway) = &self.gateway else {
            return match &cfg.owner_lock {
                Some(_) => Err("owner_lock needs a [gateway] section".into()),
                None => Ok(None),
            };
        };
        let owner: Option<Arc<dyn storage::ExclusiveOwner>> =
            match (&cfg.owner_lock, backend.exclusive_owner()) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "its {} backend has an ownership lock of its own: leave owner_lock out",
                        backend.kind()
                    ))
                }
                (Some(path), None) => {
                    let lock = storage::owner_file::FileOwner::open(path, &gateway.name)
                        .map_err(|e| format!("owner_lock: {e}"))?;
                    Some(crate::gateway_roster::beside_lock_file(
                        Arc::new(lock),
                        path,
                        gateway,
                        id,
                    ))
                }
                (None, own) => own,
            };
        Ok(Some(LunAlua::new(gateway.clone(), id, owner)))
    }

    /// Adds LUN `id` while the device runs. Its backend is opened first, with no lock held
    /// (this blocks: call it where blocking is allowed); only then does the LUN appear in
    /// REPORT LUNS and take commands, and every registered nexus gets REPORTED LUNS DATA
    /// HAS CHANGED (once, on its next command to any LUN). A number already in use is
    /// refused, before anything is opened.
    pub fn add_lun(&self, id: u64, cfg: LunConfig) -> Result<(), LunChangeError> {
        if self.snapshot().contains_key(&id) {
            return Err(LunChangeError::InUse(id));
        }
        let unit = self
            .build_unit(id, cfg.clone())
            .map_err(LunChangeError::Build)?;
        {
            let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
            let mut next = LunMap::clone(&self.snapshot());
            if next.contains_key(&id) {
                // Added meanwhile by another caller: what was opened here is dropped.
                return Err(LunChangeError::InUse(id));
            }
            next.insert(id, unit);
            self.publish(next);
            self.configs().insert(id, cfg);
        }
        self.luns_changed();
        Ok(())
    }

    /// Removes LUN `id` while the device runs: from now on REPORT LUNS leaves it out and
    /// commands to it get LOGICAL UNIT NOT SUPPORTED, and every registered nexus gets
    /// REPORTED LUNS DATA HAS CHANGED (once, on its next command to any LUN). Commands
    /// already running on it finish and answer as usual; this returns once they have
    /// (waiting at most 30 s: one that runs longer still finishes, and its backend closes
    /// after it). Its reservations, unit attentions and mode settings go with it: a LUN
    /// added later under the same number starts afresh.
    pub async fn remove_lun(&self, id: u64) -> Result<(), LunChangeError> {
        let removed = {
            let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
            let mut next = LunMap::clone(&self.snapshot());
            let Some(removed) = next.remove(&id) else {
                return Err(LunChangeError::NotFound(id));
            };
            self.publish(next);
            self.configs().remove(&id);
            removed
        };
        self.luns_changed();
        if let Unit::Block(lun) = removed {
            if !lun.tasks.wait_empty(DRAIN_LIMIT).await {
                tracing::warn!(
                    target_name = %self.target_name,
                    lun = id,
                    "LUN removed with commands still running after {} s; they finish on their own",
                    DRAIN_LIMIT.as_secs()
                );
            }
        }
        Ok(())
    }

    /// The LUN map as it is now.
    fn snapshot(&self) -> Arc<LunMap> {
        self.luns.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `next` the LUN map (the caller holds `changing`).
    fn publish(&self, next: LunMap) {
        *self.luns.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    }

    /// The LUN numbered `id`: a command's one lookup.
    fn unit(&self, id: u64) -> Option<Unit> {
        self.luns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// The block LUN numbered `id`.
    pub(crate) fn block(&self, id: u64) -> Option<Arc<Lun>> {
        match self.unit(id)? {
            Unit::Block(l) => Some(l),
            Unit::Object(_) => None,
        }
    }

    /// The block LUN numbered `id`, for tests that look inside it.
    #[cfg(test)]
    pub(crate) fn block_lun(&self, id: u64) -> Option<Arc<Lun>> {
        self.block(id)
    }

    /// Every block LUN of a snapshot.
    fn blocks(map: &LunMap) -> impl Iterator<Item = &Arc<Lun>> {
        map.values().filter_map(|u| match u {
            Unit::Block(l) => Some(l),
            Unit::Object(_) => None,
        })
    }

    /// Tells every registered nexus that the LUN inventory changed.
    fn luns_changed(&self) {
        for n in self.nexus_map().values_mut() {
            n.luns_changed = true;
        }
    }

    fn nexus_map(&self) -> std::sync::MutexGuard<'_, HashMap<NexusId, Nexus>> {
        self.nexuses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the relative target port identifier of this device's target port (SPC-4; the
    /// `[gateway]`'s `relative_port`, else 1), which persistent reservations name the I_T nexuses by: the gateways
    /// exporting one LUN as one target each set their own. Commands from then on use it.
    pub fn set_relative_port(&self, id: u16) {
        self.rel_port.store(id, Ordering::Relaxed);
    }

    /// The relative target port identifier (see [`Device::set_relative_port`]).
    pub fn relative_port(&self) -> u16 {
        self.rel_port.load(Ordering::Relaxed)
    }

    /// The target name this device was built for.
    pub fn target_name(&self) -> &str {
        &self.target_name
    }

    /// Configured LUN numbers (block and object), ascending.
    pub fn luns(&self) -> Vec<u64> {
        self.snapshot().keys().copied().collect()
    }

    /// Whether `lun` is an object-based storage device (OSD).
    pub fn is_object_lun(&self, lun: u64) -> bool {
        matches!(self.unit(lun), Some(Unit::Object(_)))
    }

    /// The LUN whose NAA designator (VPD page 0x83) is `naa`, for EXTENDED COPY.
    pub(crate) fn lun_by_naa(&self, naa: &[u8]) -> Option<Arc<Lun>> {
        Device::blocks(&self.snapshot())
            .find(|l| l.naa == naa)
            .cloned()
    }

    /// Capacity of a LUN as (number of blocks, block size).
    pub fn capacity(&self, lun: u64) -> Option<(u64, u32)> {
        self.block(lun).map(|l| (l.num_blocks(), l.block_size))
    }

    /// Registers a new I_T nexus. `initiator_port` names the initiator port (for iSCSI
    /// "<initiator name>,i,0x<isid>"); `transport_id` is its SCSI TransportID (used in
    /// PERSISTENT RESERVE IN READ FULL STATUS; may be empty).
    pub fn nexus_added(&self, nexus: NexusId, initiator_port: &str, transport_id: Bytes) {
        let info = NexusInfo {
            port: Arc::from(initiator_port),
            transport_id,
            rel_port: self.relative_port(),
        };
        let entry = Nexus {
            info,
            luns_changed: false,
        };
        self.nexus_map().insert(nexus, entry);
        // Shared LUNs' states may have changed since the host last asked (the path was to a
        // gateway that restarted since, say): the new nexus is told to read them again.
        for lun in Device::blocks(&self.snapshot()) {
            if lun.alua.as_ref().is_some_and(|a| a.shared()) {
                lun.queue_ua(nexus, asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
            }
        }
    }

    /// I_T nexus loss (session closed or dropped): aborts its tasks (without waiting for
    /// them to end), revokes the ranges its ended reads hold while their data is sent,
    /// releases RESERVE(6) reservations and PREVENT state held through it, and drops its
    /// unit attentions. Persistent reservation registrations survive (they belong to the
    /// initiator port).
    pub fn nexus_removed(&self, nexus: NexusId) {
        self.nexus_map().remove(&nexus);
        for lun in Device::blocks(&self.snapshot()) {
            lun.tasks.mark_aborted(|t| t.nexus == nexus);
            lun.ranges.revoke_sending(|n, _| n == nexus);
            lun.nexus_lost(nexus);
        }
    }

    pub(crate) fn known_nexuses(&self) -> Vec<NexusId> {
        self.nexus_map().keys().copied().collect()
    }

    pub(crate) fn known_nexus_ports(&self) -> Vec<(NexusId, Arc<str>)> {
        self.nexus_map()
            .iter()
            .map(|(n, e)| (*n, e.info.port.clone()))
            .collect()
    }

    /// A command's view of its nexus: what the device knows of it, and whether it is to
    /// hear now that the LUN inventory changed (taken, when `take`: the command may report
    /// a unit attention).
    fn nexus_for_command(&self, nexus: NexusId, take: bool) -> (Option<NexusInfo>, bool) {
        let mut map = self.nexus_map();
        let Some(n) = map.get_mut(&nexus) else {
            return (None, false);
        };
        let tell = take && std::mem::take(&mut n.luns_changed);
        let mut info = n.info.clone();
        info.rel_port = self.relative_port();
        (Some(info), tell)
    }

    /// Executes one command to completion.
    pub async fn execute(&self, cmd: Command) -> Response {
        let opcode = cmd.cdb.first().copied().unwrap_or(0xFF);
        if opcode == op::REPORT_LUNS {
            self.luns_reported(cmd.nexus);
        }
        let lun = match self.unit(cmd.lun) {
            Some(Unit::Block(l)) => l,
            Some(Unit::Object(object)) => {
                let (_, tell) = self.nexus_for_command(cmd.nexus, !ua_exempt(opcode));
                if tell {
                    let sense = Sense::new(key::UNIT_ATTENTION, asc::REPORTED_LUNS_CHANGED);
                    return finish_error(&cmd, status::CHECK_CONDITION, Some(sense.encode(true)));
                }
                return object.execute(&self.luns(), cmd).await;
            }
            None => return self.no_such_lun(&cmd),
        };
        lun.follow_backend_size(|| self.known_nexuses());
        // The inventory news joins this LUN's unit attentions for the nexus, reported in
        // turn by the LUN's pipeline (or REQUEST SENSE).
        let take = !matches!(opcode, op::INQUIRY | op::REPORT_LUNS);
        let (info, tell) = self.nexus_for_command(cmd.nexus, take);
        if tell {
            lun.queue_ua(cmd.nexus, asc::REPORTED_LUNS_CHANGED);
        }
        let running = lun.stats.start();
        let direction = crate::stats::Direction::of(opcode);
        let out_len = cmd.data_out.len() as u64;
        let rsp = lun.execute(self, cmd, info).await;
        let bytes = match direction {
            crate::stats::Direction::Write => out_len,
            _ => rsp.data_in.len() as u64,
        };
        running.finish(direction, bytes);
        rsp
    }

    /// The counters of every block LUN, by LUN number (ascending).
    pub fn lun_stats(&self) -> Vec<(u64, crate::stats::LunStatsSnapshot)> {
        Device::blocks(&self.snapshot())
            .map(|l| (l.id, l.stats.snapshot()))
            .collect()
    }

    /// REPORT LUNS from `nexus` gives it the current inventory: the news that it changed,
    /// not heard yet (pending, or queued on a LUN already), is dropped (SPC-4).
    fn luns_reported(&self, nexus: NexusId) {
        if let Some(n) = self.nexus_map().get_mut(&nexus) {
            n.luns_changed = false;
        }
        for lun in Device::blocks(&self.snapshot()) {
            lun.drop_ua(nexus, asc::REPORTED_LUNS_CHANGED);
        }
    }

    /// Commands to an unconfigured LUN: INQUIRY reports "no device", REPORT LUNS and
    /// REQUEST SENSE work, everything else is LOGICAL UNIT NOT SUPPORTED.
    fn no_such_lun(&self, cmd: &Command) -> Response {
        let op = cmd.cdb.first().copied().unwrap_or(0xFF);
        let data: Option<Bytes> = match op {
            op::REPORT_LUNS => Some(report_luns(&self.luns(), &cmd.cdb).unwrap_or_default()),
            op::INQUIRY if cmd.cdb.len() >= 6 && cmd.cdb[1] & 1 == 0 => {
                let mut d = vec![0u8; 36];
                d[0] = 0x7F; // peripheral qualifier 3: no device at this LUN
                d[2] = 0x06;
                d[3] = 0x02;
                d[4] = 31;
                let alloc = u16::from_be_bytes([cmd.cdb[3], cmd.cdb[4]]) as usize;
                d.truncate(alloc);
                Some(Bytes::from(d))
            }
            op::REQUEST_SENSE => {
                let s = Sense::illegal(asc::LUN_NOT_SUPPORTED).to_fixed();
                let alloc = cmd.cdb.get(4).copied().unwrap_or(0) as usize;
                Some(Bytes::copy_from_slice(&s[..alloc.min(18)]))
            }
            _ => None,
        };
        match data {
            Some(d) => finish_data_in(cmd, d, status::GOOD),
            None => finish_error(
                cmd,
                status::CHECK_CONDITION,
                Some(Sense::illegal(asc::LUN_NOT_SUPPORTED).encode(false)),
            ),
        }
    }

    /// ABORT TASK: aborts the task `tag` of `nexus` if it is in the task set; returns
    /// whether it was found. Returns once the task has left the task set. A read of that
    /// task whose data is still being sent loses its range (see
    /// `RangeLock::revoke_sending`).
    pub async fn abort_task(&self, nexus: NexusId, tag: u64) -> bool {
        let mut found = false;
        for lun in Device::blocks(&self.snapshot()) {
            found |= lun.abort_where(|n, t| n == nexus && t == tag).await > 0;
        }
        found
    }

    /// ABORT TASK SET: every task of `nexus` on `lun`, and the ranges its reads hold
    /// while their data is sent.
    pub async fn abort_task_set(&self, nexus: NexusId, lun: u64) -> usize {
        match self.block(lun) {
            Some(l) => l.abort_where(|n, _| n == nexus).await,
            None => 0,
        }
    }

    /// CLEAR TASK SET: every task on `lun`, from any nexus, and every range held while
    /// read data is sent.
    pub async fn clear_task_set(&self, lun: u64) -> usize {
        match self.block(lun) {
            Some(l) => l.abort_all().await,
            None => 0,
        }
    }

    /// LOGICAL UNIT RESET: aborts all tasks (as CLEAR TASK SET), releases RESERVE(6),
    /// clears PREVENT, and raises a reset unit attention for every nexus. Returns false if
    /// no such LUN.
    pub async fn lun_reset(&self, lun: u64) -> bool {
        let Some(l) = self.block(lun) else {
            return false;
        };
        l.abort_all().await;
        l.reset(&self.known_nexuses());
        true
    }

    /// TARGET WARM/COLD RESET: a LUN reset of every LUN.
    pub async fn target_reset(&self, _kind: ResetKind) {
        let nexuses = self.known_nexuses();
        for l in Device::blocks(&self.snapshot()) {
            l.abort_all().await;
            l.reset(&nexuses);
        }
    }

    /// Changes a LUN's capacity (the backend must already hold `blocks` blocks); every
    /// nexus gets CAPACITY DATA HAS CHANGED.
    pub fn set_capacity(&self, lun: u64, blocks: u64) -> Result<(), DeviceError> {
        let l = self
            .block(lun)
            .ok_or_else(|| DeviceError::of_lun(lun, format!("no LUN {lun}")))?;
        if blocks == 0 || blocks.saturating_mul(l.block_size as u64) > l.backend.size() {
            return Err(DeviceError::of_lun(
                lun,
                format!("LUN {lun}: {blocks} blocks do not fit the backend"),
            ));
        }
        l.set_num_blocks(blocks, &self.known_nexuses());
        Ok(())
    }
}

/// The ALUA side of a gateway's LUNs.
impl Device {
    /// This gateway's `[gateway]` configuration, if it is one of several.
    pub fn gateway(&self) -> Option<&GatewayConfig> {
        self.gateway.as_deref()
    }

    /// This gateway's ALUA state for each block LUN (ascending), with `[gateway]`.
    pub fn alua_status(&self) -> Vec<(u64, AluaStatus)> {
        Device::blocks(&self.snapshot())
            .filter_map(|l| Some((l.id, l.alua.as_ref()?.status())))
            .collect()
    }

    /// Gives up ownership of every shared LUN (a gateway stopping hands its LUNs over
    /// cleanly): from now on they are unavailable here. Returns once every LUN released,
    /// each after its admitted writes (at most 30 s), or after `limit`.
    pub async fn release_ownership(&self, limit: Duration) {
        let luns: Vec<Arc<Lun>> = Device::blocks(&self.snapshot()).cloned().collect();
        for l in &luns {
            if let Some(a) = &l.alua {
                a.stop();
            }
        }
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline
            && luns
                .iter()
                .any(|l| l.alua.as_ref().is_some_and(|a| !a.stopped()))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Live changes of a LUN's settings: read-only flag and size.
impl Device {
    fn configs(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, LunConfig>> {
        self.configs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// LUN `lun`'s configuration as it runs now: as built, with the read-only flag and the
    /// size as changed since ([`Device::set_read_only`], [`Device::resize_lun`]).
    pub fn lun_config(&self, lun: u64) -> Option<LunConfig> {
        self.configs().get(&lun).cloned()
    }

    /// Makes LUN `lun` read-only (writes get DATA PROTECT, WRITE PROTECTED; MODE SENSE
    /// reports WP) or writable again, at once for every nexus. A file or block device
    /// opened read-only cannot become writable here (its descriptor does not allow writes):
    /// remove the LUN and add it again.
    pub fn set_read_only(&self, lun: u64, read_only: bool) -> Result<(), LunChangeError> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let l = match self.unit(lun) {
            Some(Unit::Block(l)) => l,
            Some(Unit::Object(_)) => {
                return Err(LunChangeError::Build(format!(
                    "LUN {lun} is an object store: its read_only cannot change while it runs"
                )))
            }
            None => return Err(LunChangeError::NotFound(lun)),
        };
        if !read_only && opened_read_only(&l) {
            return Err(LunChangeError::Build(format!(
                "LUN {lun} was opened read-only (its {} is open for reading only): remove it \
                 and add it again with read_only = false",
                l.backend.kind()
            )));
        }
        l.set_read_only(read_only);
        if let Some(c) = self.configs().get_mut(&lun) {
            c.read_only = read_only;
        }
        Ok(())
    }

    /// Whether LUN `lun`'s backend was opened for reading only (a file or block device
    /// configured read-only), so that it cannot become writable while it runs; `None` when
    /// there is no such block LUN.
    pub fn opened_read_only(&self, lun: u64) -> Option<bool> {
        self.block(lun).map(|l| opened_read_only(&l))
    }

    /// Resizes LUN `lun` to `bytes` (a multiple of its block size): a RAM LUN within what
    /// its image can hold, a file LUN by setting the file's length; a block device or RBD
    /// image is resized outside (the LUN follows an RBD image by itself). Every nexus hears
    /// CAPACITY DATA HAS CHANGED. Shrinking refuses commands past the new end at once, waits
    /// (at most 5 s) for the LUN's running commands, then cuts the backend.
    pub async fn resize_lun(&self, lun: u64, bytes: u64) -> Result<(), LunChangeError> {
        let l = match self.unit(lun) {
            Some(Unit::Block(l)) => l,
            Some(Unit::Object(_)) => {
                return Err(LunChangeError::Build(format!(
                    "LUN {lun} is an object store: its capacity cannot change while it runs"
                )))
            }
            None => return Err(LunChangeError::NotFound(lun)),
        };
        let bs = u64::from(l.block_size);
        if bytes == 0 || !bytes.is_multiple_of(bs) {
            return Err(LunChangeError::Build(format!(
                "LUN {lun}: size {bytes} must be a non-zero multiple of its block size {bs}"
            )));
        }
        let fail =
            |e: std::io::Error| LunChangeError::Build(format!("LUN {lun}: cannot resize: {e}"));
        match &l.cfg.backend {
            BackendConfig::Block { path } => {
                return Err(LunChangeError::Build(format!(
                    "LUN {lun}: a block device's size is the device's: resize {} itself",
                    path.display()
                )))
            }
            BackendConfig::Rbd(spec) => {
                return Err(LunChangeError::Build(format!(
                    "LUN {lun}: resize the image (rbd resize {}/{}); the LUN follows it",
                    spec.pool, spec.image
                )))
            }
            _ => {}
        }
        let nexuses = self.known_nexuses();
        if bytes < l.num_blocks() * bs {
            l.set_num_blocks(bytes / bs, &[]);
            if !l.tasks.wait_empty(Duration::from_secs(5)).await {
                tracing::warn!(lun, "LUN shrunk with commands still running after 5 s");
            }
        }
        if let Err(e) = l.backend.resize(bytes) {
            // What shrank before the backend refused comes back.
            l.take_backend_size(&[]);
            return Err(fail(e));
        }
        l.take_backend_size(&nexuses);
        if let Some(c) = self.configs().get_mut(&lun) {
            c.size = Some(crate::ByteSize(bytes));
        }
        Ok(())
    }
}

impl DeviceView for Device {
    fn luns(&self) -> Vec<u64> {
        Device::luns(self)
    }

    fn known_nexus_ports(&self) -> Vec<(NexusId, Arc<str>)> {
        Device::known_nexus_ports(self)
    }

    fn lun_by_naa(&self, naa: &[u8]) -> Option<Arc<Lun>> {
        Device::lun_by_naa(self, naa)
    }

    fn relative_port(&self) -> u16 {
        Device::relative_port(self)
    }
}

fn opened_read_only(l: &Lun) -> bool {
    l.cfg.read_only
        && matches!(
            l.cfg.backend,
            BackendConfig::File { .. } | BackendConfig::Block { .. }
        )
}

/// A LUN's NAA designator (VPD 0x83) and serial number (VPD 0x80): as configured, or
/// derived from the target name and LUN number (stable across restarts).
fn identities(target_name: &str, id: u64, cfg: &LunConfig) -> Result<(Vec<u8>, String), String> {
    let naa = match &cfg.wwn {
        Some(w) => parse_naa(w)?,
        None => derived_naa(target_name, id),
    };
    let serial = cfg
        .serial
        .clone()
        .unwrap_or_else(|| derived_serial(target_name, id));
    Ok((naa, serial))
}

/// Memory for a RAM LUN's image (LUN number, size in bytes), or `None` for the heap.
pub type ImageProvider = dyn Fn(u64, u64) -> Option<Arc<dyn storage::ImageMemory>> + Send + Sync;

fn open_backend(
    id: u64,
    cfg: &LunConfig,
    image: &ImageProvider,
) -> Result<Arc<dyn storage::Backend>, String> {
    let size = cfg.size.map(|s| s.0);
    Ok(match &cfg.backend {
        BackendConfig::Memory => {
            let size = size.unwrap_or(0);
            match image(id, size) {
                Some(mem) if mem.len() as u64 == size => {
                    Arc::new(storage::MemoryBackend::with_image(mem))
                }
                _ => Arc::new(storage::MemoryBackend::new(size)),
            }
        }
        BackendConfig::File { path, create } => Arc::new(
            storage::FileBackend::open_direct(
                path,
                size,
                *create,
                cfg.read_only,
                cfg.io.into(),
                cfg.direct,
            )
            .map_err(|e| e.to_string())?,
        ),
        BackendConfig::Block { path } => Arc::new(
            storage::BlockBackend::open_with(path, size, cfg.read_only, cfg.io.into())
                .map_err(|e| e.to_string())?,
        ),
        BackendConfig::Osd { .. } => return Err("an object store is not a block backend".into()),
        BackendConfig::Rbd(spec) => {
            Arc::new(storage_rbd::RbdBackend::open(spec, size).map_err(|e| e.to_string())?)
        }
    })
}
