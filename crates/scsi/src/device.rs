//! The public face of the engine: a [`Device`] (all LUNs of one target), the
//! [`Command`]/[`Response`] pair, I_T nexus bookkeeping and task management.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::cdb::{needs_medium, op};
use crate::cmds::report_luns;
use crate::command::{finish_data_in, finish_error, Command, NexusId, NexusInfo, Response};
use crate::config::{derived_naa, derived_serial, parse_naa, BackendConfig, LunConfig};
use crate::lun::{DeviceView, Lun};
use crate::object::ObjectLun;
use crate::sense::{asc, key, Sense};
use crate::status;

/// Target reset flavour (task management).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    Warm,
    Cold,
}

/// Why a device could not be built.
#[derive(Debug)]
pub struct DeviceError(pub String);

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeviceError {}

/// A SCSI target device: the logical units of one target.
pub struct Device {
    target_name: String,
    luns: BTreeMap<u64, Arc<Lun>>,
    /// Object-based storage LUNs (OSD), numbered apart from the block LUNs.
    objects: BTreeMap<u64, Arc<ObjectLun>>,
    nexuses: Mutex<HashMap<NexusId, NexusInfo>>,
    /// Each block LUN's backend size when last looked at, to notice a backend resized
    /// from outside (see `execute`).
    backend_sizes: BTreeMap<u64, AtomicU64>,
}

impl Device {
    /// Builds the device, opening each LUN's backend. Identifiers not given in the
    /// config (serial, NAA) are derived from `target_name` and the LUN number, so they
    /// are stable across restarts.
    pub fn new(target_name: &str, luns: Vec<(u64, LunConfig)>) -> Result<Device, DeviceError> {
        Device::with_image_memory(target_name, luns, &|_, _| None)
    }

    /// [`Device::new`], with RAM LUNs' images in memory `image(lun, size)` provides when it
    /// provides some (a transport's registered memory, so reads leave from where the data
    /// lies); the heap otherwise.
    pub fn with_image_memory(
        target_name: &str,
        luns: Vec<(u64, LunConfig)>,
        image: &ImageProvider,
    ) -> Result<Device, DeviceError> {
        let mut map = BTreeMap::new();
        let mut objects = BTreeMap::new();
        for (id, cfg) in luns {
            if id >= 16384 {
                return Err(DeviceError(format!(
                    "LUN {id}: numbers must be below 16384"
                )));
            }
            if map.contains_key(&id) || objects.contains_key(&id) {
                return Err(DeviceError(format!("LUN {id} is configured twice")));
            }
            cfg.validate()
                .map_err(|e| DeviceError(format!("LUN {id}: {e}")))?;
            if let BackendConfig::Osd { path } = &cfg.backend {
                let lun = open_object_lun(target_name, id, path, &cfg)
                    .map_err(|e| DeviceError(format!("LUN {id}: {e}")))?;
                objects.insert(id, Arc::new(lun));
                continue;
            }
            let backend =
                open_backend(id, &cfg, image).map_err(|e| DeviceError(format!("LUN {id}: {e}")))?;
            let size = backend.size();
            if size < cfg.block_size as u64 {
                return Err(DeviceError(format!(
                    "LUN {id}: backend of {size} bytes is smaller than one block"
                )));
            }
            let (naa, serial) = identities(target_name, id, &cfg)
                .map_err(|e| DeviceError(format!("LUN {id}: {e}")))?;
            map.insert(
                id,
                Arc::new(Lun::new(id, cfg, backend, naa, serial, target_name)),
            );
        }
        let backend_sizes = map
            .iter()
            .map(|(id, l): (&u64, &Arc<Lun>)| (*id, AtomicU64::new(l.backend.size())))
            .collect();
        Ok(Device {
            backend_sizes,
            target_name: target_name.to_string(),
            luns: map,
            objects,
            nexuses: Mutex::new(HashMap::new()),
        })
    }

    /// The target name this device was built for.
    pub fn target_name(&self) -> &str {
        &self.target_name
    }

    /// Configured LUN numbers (block and object), ascending.
    pub fn luns(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self
            .luns
            .keys()
            .chain(self.objects.keys())
            .copied()
            .collect();
        all.sort_unstable();
        all
    }

    /// Whether `lun` is an object-based storage device (OSD).
    pub fn is_object_lun(&self, lun: u64) -> bool {
        self.objects.contains_key(&lun)
    }

    /// The LUN whose NAA designator (VPD page 0x83) is `naa`, for EXTENDED COPY.
    pub(crate) fn lun_by_naa(&self, naa: &[u8]) -> Option<Arc<Lun>> {
        self.luns.values().find(|l| l.naa == naa).cloned()
    }

    /// Capacity of a LUN as (number of blocks, block size).
    pub fn capacity(&self, lun: u64) -> Option<(u64, u32)> {
        self.luns.get(&lun).map(|l| (l.num_blocks(), l.block_size))
    }

    /// Registers a new I_T nexus. `initiator_port` names the initiator port (for iSCSI
    /// "<initiator name>,i,0x<isid>"); `transport_id` is its SCSI TransportID (used in
    /// PERSISTENT RESERVE IN READ FULL STATUS; may be empty).
    pub fn nexus_added(&self, nexus: NexusId, initiator_port: &str, transport_id: Bytes) {
        let info = NexusInfo {
            port: Arc::from(initiator_port),
            transport_id,
        };
        self.nexuses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(nexus, info);
    }

    /// I_T nexus loss (session closed or dropped): aborts its tasks (without waiting for
    /// them to end), revokes the ranges its ended reads hold while their data is sent,
    /// releases RESERVE(6) reservations and PREVENT state held through it, and drops its
    /// unit attentions. Persistent reservation registrations survive (they belong to the
    /// initiator port).
    pub fn nexus_removed(&self, nexus: NexusId) {
        self.nexuses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
        for lun in self.luns.values() {
            lun.tasks.mark_aborted(|t| t.nexus == nexus);
            lun.ranges.revoke_sending(|n, _| n == nexus);
            lun.nexus_lost(nexus);
        }
    }

    pub(crate) fn nexus_info(&self, nexus: NexusId) -> Option<NexusInfo> {
        self.nexuses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&nexus)
            .cloned()
    }

    pub(crate) fn known_nexuses(&self) -> Vec<NexusId> {
        self.nexuses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    pub(crate) fn known_nexus_ports(&self) -> Vec<(NexusId, Arc<str>)> {
        self.nexuses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, i)| (*n, i.port.clone()))
            .collect()
    }

    /// Executes one command to completion.
    pub async fn execute(&self, cmd: Command) -> Response {
        if let Some(object) = self.objects.get(&cmd.lun) {
            return object.execute(&self.luns(), cmd).await;
        }
        let lun = match self.luns.get(&cmd.lun) {
            Some(l) => l.clone(),
            None => return self.no_such_lun(&cmd),
        };
        // A backend whose size changes by itself (an RBD image resized in the cluster):
        // the LUN follows, and every nexus hears CAPACITY DATA HAS CHANGED.
        if let Some(seen) = self.backend_sizes.get(&cmd.lun) {
            let now = lun.backend.size();
            if seen.load(Ordering::Acquire) != now && seen.swap(now, Ordering::AcqRel) != now {
                let blocks = now >> lun.bs_shift;
                if blocks != 0 {
                    lun.set_num_blocks(blocks, &self.known_nexuses());
                }
            }
        }
        // A backend that has not reached its storage yet (an RBD cluster unreachable at
        // start): commands that need the medium wait for it, as for a spinning-up disk.
        if !lun.backend.ready() && cmd.cdb.first().is_some_and(|&op| needs_medium(op)) {
            let sense = Sense::new(key::NOT_READY, asc::NOT_READY_BECOMING_READY);
            let descriptor = lun.d_sense.load(Ordering::Relaxed);
            return finish_error(
                &cmd,
                status::CHECK_CONDITION,
                Some(sense.encode(descriptor)),
            );
        }
        let info = self.nexus_info(cmd.nexus);
        lun.execute(self, cmd, info).await
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
        for lun in self.luns.values() {
            found |= lun.abort_where(|n, t| n == nexus && t == tag).await > 0;
        }
        found
    }

    /// ABORT TASK SET: every task of `nexus` on `lun`, and the ranges its reads hold
    /// while their data is sent.
    pub async fn abort_task_set(&self, nexus: NexusId, lun: u64) -> usize {
        match self.luns.get(&lun) {
            Some(l) => l.abort_where(|n, _| n == nexus).await,
            None => 0,
        }
    }

    /// CLEAR TASK SET: every task on `lun`, from any nexus, and every range held while
    /// read data is sent.
    pub async fn clear_task_set(&self, lun: u64) -> usize {
        match self.luns.get(&lun) {
            Some(l) => l.abort_all().await,
            None => 0,
        }
    }

    /// LOGICAL UNIT RESET: aborts all tasks (as CLEAR TASK SET), releases RESERVE(6),
    /// clears PREVENT, and raises a reset unit attention for every nexus. Returns false if
    /// no such LUN.
    pub async fn lun_reset(&self, lun: u64) -> bool {
        let Some(l) = self.luns.get(&lun) else {
            return false;
        };
        l.abort_all().await;
        l.reset(&self.known_nexuses());
        true
    }

    /// TARGET WARM/COLD RESET: a LUN reset of every LUN.
    pub async fn target_reset(&self, _kind: ResetKind) {
        let nexuses = self.known_nexuses();
        for l in self.luns.values() {
            l.abort_all().await;
            l.reset(&nexuses);
        }
    }

    /// Changes a LUN's capacity (the backend must already hold `blocks` blocks); every
    /// nexus gets CAPACITY DATA HAS CHANGED.
    pub fn set_capacity(&self, lun: u64, blocks: u64) -> Result<(), DeviceError> {
        let l = self
            .luns
            .get(&lun)
            .ok_or_else(|| DeviceError(format!("no LUN {lun}")))?;
        if blocks == 0 || blocks.saturating_mul(l.block_size as u64) > l.backend.size() {
            return Err(DeviceError(format!(
                "LUN {lun}: {blocks} blocks do not fit the backend"
            )));
        }
        l.set_num_blocks(blocks, &self.known_nexuses());
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

/// An object store LUN: its capacity is `size` (default 1 GiB).
fn open_object_lun(
    target_name: &str,
    id: u64,
    dir: &std::path::Path,
    cfg: &LunConfig,
) -> Result<ObjectLun, String> {
    let (naa, serial) = identities(target_name, id, cfg)?;
    let capacity = cfg.size.map_or(1 << 30, |s| s.0);
    ObjectLun::open(dir, capacity, cfg, serial, naa)
}

/// Memory for a RAM LUN's image (LUN number, size in bytes), or `None` for the heap.
pub type ImageProvider = dyn Fn(u64, u64) -> Option<Arc<dyn storage::ImageMemory>>;

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
            storage::FileBackend::open_with(path, size, *create, cfg.read_only, cfg.io.into())
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
