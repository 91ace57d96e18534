//! Per-LUN configuration, deserialized from the target's TOML config.
//!
//! ```toml
//! [target.lun.0]            # (the enclosing table is the target crate's business)
//! size = "1GiB"             # or a byte count; optional for file/block (file/device size)
//! block_size = 512          # 512 or 4096
//! backend = "memory"        # or { type = "file", path = "/var/lib/ironsan/lun0.img", create = true }
//!                           # or { type = "block", path = "/dev/loop0" }
//! read_only = false
//! thin_provisioning = true
//! serial = "lun0-serial"    # default: derived from target name + LUN number
//! wwn = "0x3fedcba987654321" # NAA designator, 16 or 32 hex digits; default derived likewise
//! vendor = "IRONSAN"
//! product = "VIRTUAL-DISK"
//! revision = "0001"
//! removable = false
//! sanitize = false          # offer SANITIZE (wipes the whole LUN)
//! io = "uring"              # file/block I/O path: "uring" (default) or "threads"
//! reservations = "/shared/lun0.pr" # persistent reservations in this file, shared by the
//!                           # gateways exporting the LUN (docs/reservations.md)
//! owner_lock = "/shared/lun0.owner" # with [gateway]: the lock file deciding which gateway
//!                           # writes this LUN, where the backend has no lock of its own
//! ```
//!
//! Several gateways exporting the same LUNs (ALUA, [`GatewayConfig`]) share a `[gateway]`
//! section of the target's file:
//!
//! ```toml
//! [gateway]
//! group = "cluster-1"       # the gateways' common name (logs, admin)
//! name = "gw-a"             # this gateway: its id in ownership locks
//! port_group = 1            # this gateway's target port group id
//! relative_port = 1         # this gateway's relative target port id (1..65535)
//! [[gateway.peer]]
//! name = "gw-b"
//! port_group = 2
//! relative_port = 2
//! portals = ["10.0.0.2:3260"] # optional: listed by SendTargets beside this gateway's own
//! ```

use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A byte count given as an integer or a string with a binary/decimal suffix
/// ("1GiB", "512MiB", "64k", "1000000").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses "123", "4k", "4KiB", "1.5GiB", "10MB" (KB/MB/GB/TB decimal; K/M/G/T, KiB..
    /// binary), as configuration files write sizes ([`byte_size::parse_size_si`]).
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        byte_size::parse_size_si(text)
            .map(ByteSize)
            .map_err(|e| e.to_string())
    }
}

/// Written as the configuration writes sizes: the largest binary unit that divides it
/// exactly ("64MiB"), else a byte count.
impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        match units
            .iter()
            .find(|(shift, _)| self.0 != 0 && self.0.is_multiple_of(1u64 << shift))
        {
            Some((shift, unit)) => s.serialize_str(&format!("{}{unit}", self.0 >> shift)),
            None => s.serialize_u64(self.0),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size in bytes (integer) or a string such as \"1GiB\" or \"512MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("size must not be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Where a LUN's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// RAM, lazily allocated ("memory mode"). Needs `size`.
    Memory,
    /// A sparse regular file. `create`: create it (with `size`) if missing.
    File { path: PathBuf, create: bool },
    /// A block device (O_DIRECT where aligned).
    Block { path: PathBuf },
    /// An object store in a directory (created if missing): the LUN is a T10 OSD-2 object
    /// storage device, not a block device; `size` is its capacity.
    Osd { path: PathBuf },
    /// A Ceph RBD image (crate `storage-rbd`); `size` defaults to the image's.
    Rbd(storage_rbd::RbdSpec),
}

#[derive(Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum BackendTable {
    Memory,
    File {
        path: PathBuf,
        #[serde(default)]
        create: bool,
    },
    Block {
        path: PathBuf,
    },
    Osd {
        path: PathBuf,
    },
    Rbd(storage_rbd::RbdSpec),
}

/// Written as read: `"memory"`, or the table of the other kinds.
impl Serialize for BackendConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let table = match self.clone() {
            BackendConfig::Memory => return s.serialize_str("memory"),
            BackendConfig::File { path, create } => BackendTable::File { path, create },
            BackendConfig::Block { path } => BackendTable::Block { path },
            BackendConfig::Osd { path } => BackendTable::Osd { path },
            BackendConfig::Rbd(spec) => BackendTable::Rbd(spec),
        };
        table.serialize(s)
    }
}

impl<'de> Deserialize<'de> for BackendConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BackendConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"memory\", or a table { type = \"file\", path = \"...\", create = true }, { type = \"block\", path = \"/dev/...\" } or { type = \"osd\", path = \"dir\" } or { type = \"rbd\", pool = \"rbd\", image = \"...\" }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<BackendConfig, E> {
                match v {
                    "memory" | "ram" => Ok(BackendConfig::Memory),
                    "file" | "block" | "osd" => Err(E::custom(format!(
                        "backend \"{v}\" needs a path: write backend = {{ type = \"{v}\", path = \"...\" }}"
                    ))),
                    "rbd" => Err(E::custom(
                        "backend \"rbd\" needs a pool and an image: write backend = { type = \"rbd\", pool = \"rbd\", image = \"...\" }",
                    )),
                    other => Err(E::custom(format!("unknown backend {other:?}: expected memory, file, block, osd or rbd"))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<BackendConfig, A::Error> {
                let t = BackendTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(match t {
                    BackendTable::Memory => BackendConfig::Memory,
                    BackendTable::File { path, create } => BackendConfig::File { path, create },
                    BackendTable::Block { path } => BackendConfig::Block { path },
                    BackendTable::Osd { path } => BackendConfig::Osd { path },
                    BackendTable::Rbd(spec) => BackendConfig::Rbd(spec),
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// Configuration of one logical unit (written back as read: [`Serialize`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LunConfig {
    /// Capacity. Required for memory; for file/block defaults to the file/device size.
    #[serde(default)]
    pub size: Option<ByteSize>,
    /// Logical block size: 512 or 4096.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    pub backend: BackendConfig,
    #[serde(default)]
    pub read_only: bool,
    /// Report thin provisioning (UNMAP, WRITE SAME with UNMAP, GET LBA STATUS).
    #[serde(default = "default_true")]
    pub thin_provisioning: bool,
    /// Unit serial number (VPD 0x80). Default: derived from target name + LUN number.
    #[serde(default)]
    pub serial: Option<String>,
    /// NAA identifier (VPD 0x83), hex, 16 or 32 digits, optional "0x"/"naa." prefix.
    /// Default: a locally assigned NAA derived from target name + LUN number.
    #[serde(default, alias = "naa")]
    pub wwn: Option<String>,
    #[serde(default = "default_vendor")]
    pub vendor: String,
    #[serde(default = "default_product")]
    pub product: String,
    #[serde(default = "default_revision")]
    pub revision: String,
    /// Report removable medium (RMB): enables START STOP UNIT eject/load and
    /// PREVENT ALLOW MEDIUM REMOVAL semantics.
    #[serde(default)]
    pub removable: bool,
    /// Offer SANITIZE (OVERWRITE; BLOCK ERASE and CRYPTO ERASE when thin provisioned).
    /// Off by default: a sanitize wipes the whole LUN and blocks it while it runs.
    #[serde(default)]
    pub sanitize: bool,
    /// How a file or block backend issues reads, writes and flushes: "uring" (the default;
    /// the blocking pool where the kernel has no io_uring) or "threads" (the blocking pool).
    #[serde(default)]
    pub io: IoConfig,
    /// File LUNs: requests aligned to 4 KiB (offset and length) bypass the page cache
    /// (O_DIRECT), unaligned ones stay buffered; a file system that refuses O_DIRECT gets
    /// buffered I/O and a log line. Block LUNs always do this. Off by default.
    #[serde(default)]
    pub direct: bool,
    /// A file holding the LUN's persistent reservations (a `FileBlob`), on storage every
    /// gateway exporting the LUN reaches: registrations and reservations made through one
    /// gateway hold through the others and survive restarts (docs/reservations.md). Without
    /// it they are kept where the backend offers (an RBD image's), else in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservations: Option<PathBuf>,
    /// With `[gateway]`: a lock file every gateway reaches that decides which one writes
    /// this LUN ([`storage::owner_file::FileOwner`]), for a shared file or block device whose
    /// backend has no lock of its own.
    #[serde(default)]
    pub owner_lock: Option<PathBuf>,
}

/// The `io` key of a LUN (see [`LunConfig::io`]).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IoConfig {
    #[default]
    Uring,
    Threads,
}

impl From<IoConfig> for storage::IoMode {
    fn from(io: IoConfig) -> Self {
        match io {
            IoConfig::Uring => storage::IoMode::Uring,
            IoConfig::Threads => storage::IoMode::Threads,
        }
    }
}

fn default_block_size() -> u32 {
    512
}
fn default_true() -> bool {
    true
}
fn default_vendor() -> String {
    "IRONSAN".into()
}
fn default_product() -> String {
    "VIRTUAL-DISK".into()
}
fn default_revision() -> String {
    "0001".into()
}

impl LunConfig {
    /// A RAM LUN of `size` bytes with defaults for everything else.
    pub fn memory(size: u64) -> Self {
        LunConfig {
            size: Some(ByteSize(size)),
            block_size: 512,
            backend: BackendConfig::Memory,
            read_only: false,
            thin_provisioning: true,
            serial: None,
            wwn: None,
            vendor: default_vendor(),
            product: default_product(),
            revision: default_revision(),
            removable: false,
            sanitize: false,
            io: IoConfig::Uring,
            direct: false,
            reservations: None,
            owner_lock: None,
        }
    }

    /// Checks the fields that do not need the backend (sizes are checked at open).
    pub fn validate(&self) -> Result<(), String> {
        if self.block_size != 512 && self.block_size != 4096 {
            return Err(format!(
                "block_size must be 512 or 4096, not {}",
                self.block_size
            ));
        }
        if let Some(ByteSize(s)) = self.size {
            if s == 0 || s % self.block_size as u64 != 0 {
                return Err(format!(
                    "size {s} must be a non-zero multiple of block_size {}",
                    self.block_size
                ));
            }
        }
        if matches!(self.backend, BackendConfig::Memory) && self.size.is_none() {
            return Err("a memory backend needs a size (e.g. size = \"1GiB\")".into());
        }
        if let BackendConfig::Rbd(rbd) = &self.backend {
            if rbd.pool.is_empty() || rbd.image.is_empty() {
                return Err("an rbd backend needs a pool and an image name".into());
            }
            if rbd.create && self.size.is_none() {
                return Err(
                    "an rbd backend with create = true needs a size (e.g. size = \"10GiB\")".into(),
                );
            }
        }
        for (name, v, max) in [
            ("vendor", &self.vendor, 8),
            ("product", &self.product, 16),
            ("revision", &self.revision, 4),
        ] {
            if v.len() > max || !v.bytes().all(|b| (0x20..0x7F).contains(&b)) {
                return Err(format!(
                    "{name} {v:?} must be at most {max} printable ASCII characters"
                ));
            }
        }
        if let Some(s) = &self.serial {
            if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| (0x21..0x7F).contains(&b)) {
                return Err(format!(
                    "serial {s:?} must be 1..64 printable ASCII characters without spaces"
                ));
            }
        }
        if let Some(w) = &self.wwn {
            parse_naa(w)?;
        }
        Ok(())
    }
}

/// `[gateway]`: this process is one of several gateways exporting the same LUNs as one
/// logical target (asymmetric logical unit access, module `alua`). Each gateway is one target
/// port group with one target port; the LUN's owner (see `owner_lock`) is active/optimized,
/// the others active/non-optimized.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateways' common name (logs, admin).
    pub group: String,
    /// This gateway's name: its id in ownership locks, which peers' `name`s are matched to.
    pub name: String,
    /// This gateway's target port group id.
    pub port_group: u16,
    /// This gateway's relative target port id (1..65535).
    pub relative_port: u16,
    /// Set the PREF bit on this gateway's port group (hosts add to its priority).
    #[serde(default)]
    pub preferred: bool,
    /// Milliseconds a gateway that lost a LUN's ownership refuses to take it back (its
    /// commands answer NOT READY, transitioning), so a host that briefly sends on both paths
    /// converges on one gateway.
    #[serde(default = "default_hold_down_ms")]
    pub hold_down_ms: u64,
    /// Milliseconds between checks of each shared LUN's ownership.
    #[serde(default = "default_check_interval_ms")]
    pub check_interval_ms: u64,
    /// Reads on a non-owner take the LUN over as writes do (for storage whose clients cache
    /// reads); off: a non-owner serves reads straight from the shared storage.
    #[serde(default)]
    pub reads_take_over: bool,
    /// Milliseconds a `preferred` gateway that is healthy (its ownership calls succeed) and
    /// not a LUN's owner waits before it takes the LUN back (failback); 0: never.
    #[serde(default = "default_failback_delay_ms")]
    pub failback_delay_ms: u64,
    /// The other gateways: `[[gateway.peer]]`.
    #[serde(default, rename = "peer")]
    pub peers: Vec<PeerConfig>,
}

/// Another gateway of the group (`[[gateway.peer]]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// Its name (its id in ownership locks).
    pub name: String,
    pub port_group: u16,
    pub relative_port: u16,
    #[serde(default)]
    pub preferred: bool,
    /// Its portals, `ADDR:PORT`: SendTargets lists them beside this gateway's own.
    #[serde(default)]
    pub portals: Vec<String>,
}

fn default_hold_down_ms() -> u64 {
    5000
}
fn default_check_interval_ms() -> u64 {
    1000
}
fn default_failback_delay_ms() -> u64 {
    30_000
}

/// What is wrong with a `[gateway]` section: the message, and the `key = value` it is about
/// (its `occurrence`-th appearance in the section, counted from 1), for a line number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfigError {
    pub message: String,
    pub key: &'static str,
    pub value: String,
    pub occurrence: usize,
}

impl GatewayConfig {
    /// Checks names, ids and timings; ids repeated among this gateway and its peers are
    /// refused, naming the second appearance.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        let err = |message: String, key: &'static str, value: String, occurrence: usize| {
            Err(GatewayConfigError {
                message,
                key,
                value,
                occurrence,
            })
        };
        let names = std::iter::once(&self.name).chain(self.peers.iter().map(|p| &p.name));
        for (i, name) in names.enumerate() {
            let ok = !name.is_empty()
                && name.len() <= 128
                && name.bytes().all(|b| b.is_ascii_graphic() && b != b'"');
            if !ok {
                return err(
                    format!(
                        "gateway name {name:?} must be 1..128 printable characters without spaces"
                    ),
                    "name",
                    format!("\"{name}\""),
                    1,
                );
            }
            let before = std::iter::once(&self.name)
                .chain(self.peers.iter().map(|p| &p.name))
                .take(i)
                .filter(|n| *n == name)
                .count();
            if before > 0 {
                return err(
                    format!("gateway name {name:?} is used twice"),
                    "name",
                    format!("\"{name}\""),
                    before + 1,
                );
            }
        }
        let ids = |f: fn(u16, u16) -> u16| {
            std::iter::once(f(self.port_group, self.relative_port))
                .chain(
                    self.peers
                        .iter()
                        .map(move |p| f(p.port_group, p.relative_port)),
                )
                .collect::<Vec<u16>>()
        };
        for (key, what, list) in [
            ("port_group", "target port group id", ids(|g, _| g)),
            ("relative_port", "relative target port id", ids(|_, r| r)),
        ] {
            for (i, id) in list.iter().enumerate() {
                if key == "relative_port" && *id == 0 {
                    return err(
                        "relative_port must be 1..65535 (0 is reserved)".into(),
                        key,
                        "0".into(),
                        1,
                    );
                }
                let before = list[..i].iter().filter(|x| *x == id).count();
                if before > 0 {
                    return err(
                        format!("{what} {id} is used twice among this gateway and its peers"),
                        key,
                        id.to_string(),
                        before + 1,
                    );
                }
            }
        }
        if !(10..=60_000).contains(&self.check_interval_ms) {
            return err(
                "check_interval_ms must be 10..60000".into(),
                "check_interval_ms",
                self.check_interval_ms.to_string(),
                1,
            );
        }
        if self.hold_down_ms > 120_000 {
            return err(
                "hold_down_ms must be at most 120000 (hosts wait about that long for a transition)"
                    .into(),
                "hold_down_ms",
                self.hold_down_ms.to_string(),
                1,
            );
        }
        if self.failback_delay_ms > 86_400_000 {
            return err(
                "failback_delay_ms must be at most 86400000 (a day); 0 turns failback off".into(),
                "failback_delay_ms",
                self.failback_delay_ms.to_string(),
                1,
            );
        }
        for p in &self.peers {
            for portal in &p.portals {
                if portal.parse::<std::net::SocketAddr>().is_err() {
                    return err(
                        format!("peer {:?}: portal {portal:?} is not ADDR:PORT", p.name),
                        "portals",
                        String::new(),
                        1,
                    );
                }
            }
        }
        Ok(())
    }
}

/// Parses an NAA designator given as hex ("0x5...", "naa.5...", 16 or 32 digits).
pub fn parse_naa(text: &str) -> Result<Vec<u8>, String> {
    let t = text.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("naa."))
        .unwrap_or(t);
    if !(hex.len() == 16 || hex.len() == 32) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "wwn {text:?} must be 16 or 32 hex digits (an NAA identifier)"
        ));
    }
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0))
        .collect();
    let naa = bytes[0] >> 4;
    let ok = match bytes.len() {
        8 => matches!(naa, 2 | 3 | 5),
        _ => naa == 6,
    };
    if !ok {
        return Err(format!("wwn {text:?}: NAA type {naa} is not valid for {} bytes (use 2, 3, 5 for 8 bytes, 6 for 16)", bytes.len()));
    }
    Ok(bytes)
}

/// 64-bit FNV-1a: a stable (across runs and builds) hash for derived identifiers.
pub(crate) fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xFF;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Default NAA: type 3 (locally assigned), 60 bits from the stable hash.
pub(crate) fn derived_naa(target: &str, lun: u64) -> Vec<u8> {
    let h = stable_hash(&[b"ironsan-naa", target.as_bytes(), &lun.to_be_bytes()]);
    let v = (3u64 << 60) | (h & 0x0FFF_FFFF_FFFF_FFFF);
    v.to_be_bytes().to_vec()
}

/// Default serial: 16 hex digits from the stable hash.
pub(crate) fn derived_serial(target: &str, lun: u64) -> String {
    format!(
        "{:016x}",
        stable_hash(&[b"ironsan-serial", target.as_bytes(), &lun.to_be_bytes()])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(ByteSize::parse("1GiB").unwrap().0, 1 << 30);
        assert_eq!(ByteSize::parse("512MiB").unwrap().0, 512 << 20);
        assert_eq!(ByteSize::parse("64k").unwrap().0, 65536);
        assert_eq!(ByteSize::parse("1.5GiB").unwrap().0, 3 << 29);
        assert_eq!(ByteSize::parse("10MB").unwrap().0, 10_000_000);
        assert!(ByteSize::parse("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(ByteSize::parse("GiB").is_err());
    }

    #[test]
    fn toml_forms() {
        let c: LunConfig = toml::from_str("size = \"64MiB\"\nbackend = \"memory\"").unwrap();
        assert_eq!(c.size, Some(ByteSize(64 << 20)));
        assert!(c.thin_provisioning);
        assert_eq!(c.vendor, "IRONSAN");
        let c: LunConfig =
            toml::from_str("size = 1048576\nblock_size = 4096\nbackend = { type = \"file\", path = \"/tmp/x\", create = true }").unwrap();
        assert_eq!(
            c.backend,
            BackendConfig::File {
                path: "/tmp/x".into(),
                create: true
            }
        );
        assert_eq!(c.block_size, 4096);
        assert_eq!(c.io, IoConfig::Uring);
        assert!(!c.direct);
        let c: LunConfig =
            toml::from_str("backend = { type = \"file\", path = \"/tmp/x\" }\ndirect = true")
                .unwrap();
        assert!(c.direct);
        let c: LunConfig =
            toml::from_str("backend = { type = \"block\", path = \"/dev/x\" }\nio = \"threads\"")
                .unwrap();
        assert_eq!(storage::IoMode::from(c.io), storage::IoMode::Threads);
        assert!(toml::from_str::<LunConfig>("backend = \"memory\"\nio = \"aio\"").is_err());
        let c: LunConfig =
            toml::from_str("backend = { type = \"block\", path = \"/dev/loop0\" }").unwrap();
        assert_eq!(
            c.backend,
            BackendConfig::Block {
                path: "/dev/loop0".into()
            }
        );
        let c: LunConfig = toml::from_str(
            "size = \"1GiB\"\nbackend = { type = \"osd\", path = \"/srv/objects\" }",
        )
        .unwrap();
        assert_eq!(
            c.backend,
            BackendConfig::Osd {
                path: "/srv/objects".into()
            }
        );
    }

    #[test]
    fn rbd_tables_parse() {
        let c: LunConfig = toml::from_str(
            "backend = { type = \"rbd\", pool = \"p\", image = \"i\", conf = \"/c\", user = \"u\", namespace = \"n\" }",
        )
        .unwrap();
        assert_eq!(
            c.backend,
            BackendConfig::Rbd(storage_rbd::RbdSpec {
                pool: "p".into(),
                image: "i".into(),
                conf: Some("/c".into()),
                user: Some("u".into()),
                namespace: Some("n".into()),
                create: false,
                completions: storage_rbd::Completions::Eventfd,
            })
        );
        c.validate().unwrap();
        let e = toml::from_str::<LunConfig>(
            "backend = { type = \"rbd\", pool = \"p\", image = \"i\", size = 5 }",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("size"), "{e}");
        let c: LunConfig =
            toml::from_str("backend = { type = \"rbd\", pool = \"p\", image = \"\" }").unwrap();
        assert!(c.validate().unwrap_err().contains("image"));
    }

    #[test]
    fn toml_errors_are_helpful() {
        let e = toml::from_str::<LunConfig>("size = \"1 furlong\"\nbackend = \"memory\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown unit"), "{e}");
        let e = toml::from_str::<LunConfig>("backend = \"file\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a path"), "{e}");
        let e = toml::from_str::<LunConfig>("backend = \"osd\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a path"), "{e}");
        let e = toml::from_str::<LunConfig>("backend = \"tape\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown backend"), "{e}");
        let e = toml::from_str::<LunConfig>("backend = \"memory\"\nsise = 5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sise"), "{e}");
        let c: LunConfig =
            toml::from_str("backend = \"memory\"\nblock_size = 1000\nsize = 1000").unwrap();
        assert!(c.validate().unwrap_err().contains("512 or 4096"));
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derived_naa("iqn.a", 1), derived_naa("iqn.a", 1));
        assert_ne!(derived_naa("iqn.a", 1), derived_naa("iqn.a", 2));
        assert_eq!(derived_naa("iqn.a", 1)[0] >> 4, 3);
        assert_eq!(derived_serial("iqn.a", 0), derived_serial("iqn.a", 0));
        assert_eq!(
            parse_naa("0x6001405abcdef0123456789abcdef012")
                .unwrap()
                .len(),
            16
        );
        assert!(parse_naa("0x1234").is_err());
    }
}
