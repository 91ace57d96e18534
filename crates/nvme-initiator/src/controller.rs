//! A controller brought up over NVMe/TCP: the admin queue's Connect, CAP read, CC.EN set and
//! CSTS.RDY awaited, Identify Controller, Set Features Number of Queues, one Connect per I/O
//! queue, Keep Alive every KATO/2; then reads, writes, flush, write zeroes and deallocate on
//! the I/O queues in turn, many commands outstanding per queue.

use crate::conn::Conn;
use crate::error::Error;
use crate::host::{Completion, HostConfig};
use bytes::Bytes;
use nvme_tcp::identify_host::{
    Cap, IdentifyController, IdentifyNamespace, CC_ENABLE, CC_SHUTDOWN_NORMAL, CSTS_CFS, CSTS_RDY,
    CSTS_SHST_COMPLETE, CSTS_SHST_MASK, IDENTIFY_LEN,
};
use nvme_tcp::sqe::fabrics::{self, reg, Connect, ConnectData, Property};
use nvme_tcp::sqe::{admin, nvm, Sqe};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// The host NQN used when none is given.
pub const DEFAULT_HOSTNQN: &str = "nqn.2026-01.org.ironsan:host";
/// Entries of the admin queue.
const ADMIN_DEPTH: u16 = 32;
/// The most bytes of one command this host sends (larger reads and writes are split).
pub const MAX_COMMAND_BYTES: u32 = 1 << 20;

/// How to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The NVM subsystem's NQN.
    pub subnqn: String,
    /// This host's NQN.
    pub hostnqn: String,
    /// I/O queues asked for (the controller may grant fewer).
    pub queues: u16,
    /// Commands outstanding per I/O queue (capped by CAP.MQES).
    pub queue_depth: u16,
    /// Ask for header digests.
    pub hdgst: bool,
    /// Ask for data digests.
    pub ddgst: bool,
    /// Keep Alive Timeout in milliseconds (0: none).
    pub kato_ms: u32,
}

impl ConnectOptions {
    /// One I/O queue of 128 entries, no digests, a 10 s Keep Alive Timeout.
    pub fn new(subnqn: impl Into<String>) -> ConnectOptions {
        ConnectOptions {
            subnqn: subnqn.into(),
            hostnqn: DEFAULT_HOSTNQN.into(),
            queues: 1,
            queue_depth: 128,
            hdgst: false,
            ddgst: false,
            kato_ms: 10_000,
        }
    }
}

/// A namespace's geometry.
pub type Namespace = IdentifyNamespace;

/// A connected, enabled controller with its I/O queues.
pub struct Controller {
    admin: Arc<Conn>,
    io: Vec<Conn>,
    next: AtomicUsize,
    cntlid: u16,
    identify: IdentifyController,
    max_command: u32,
    namespaces: Mutex<HashMap<u32, Namespace>>,
    keep_alive: Option<JoinHandle<()>>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(k) = &self.keep_alive {
            k.abort();
        }
    }
}

fn check(command: &'static str, c: Completion) -> Result<Completion, Error> {
    if !c.cqe.status.is_success() {
        return Err(Error::Status {
            command,
            status: c.cqe.status,
        });
    }
    if c.digest_error {
        return Err(Error::DataDigest(command));
    }
    Ok(c)
}

/// The 16-byte host identifier: the same for every queue of one host NQN.
fn host_id(hostnqn: &str) -> [u8; 16] {
    let mut id = [0; 16];
    for (i, part) in id.chunks_mut(4).enumerate() {
        let crc = digest::crc32c(format!("{i}{hostnqn}").as_bytes());
        part.copy_from_slice(&crc.to_le_bytes());
    }
    id
}

async fn resolve(addr: &str) -> Result<SocketAddr, Error> {
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| Error::io(format!("resolving {addr}"), e))?
        .next()
        .ok_or_else(|| Error::Invalid(format!("{addr} resolves to no address")))
}

/// Sends a Fabrics Connect for queue `qid` on `conn`; returns the controller ID.
async fn fabrics_connect(
    conn: &Conn,
    opts: &ConnectOptions,
    qid: u16,
    cntlid: u16,
) -> Result<u16, Error> {
    let c = Connect {
        recfmt: 0,
        qid,
        sqsize: conn.depth() - 1,
        cattr: fabrics::CATTR_SQ_FLOW_CONTROL_DISABLE,
        kato: if qid == 0 { opts.kato_ms } else { 0 },
    };
    let data = ConnectData {
        hostid: host_id(&opts.hostnqn),
        cntlid,
        subnqn: opts.subnqn.clone(),
        hostnqn: opts.hostnqn.clone(),
    };
    let r = conn
        .command(c.to_sqe(0), Bytes::from(data.to_bytes()), 0)
        .await?;
    Ok(check("Connect", r)?.cqe.dw0 as u16)
}

async fn property_get(conn: &Conn, offset: u32, eight_bytes: bool) -> Result<u64, Error> {
    let p = Property {
        offset,
        eight_bytes,
        value: 0,
    };
    let r = conn
        .command(p.to_sqe(fabrics::PROPERTY_GET, 0), Bytes::new(), 0)
        .await?;
    let c = check("Property Get", r)?.cqe;
    Ok(u64::from(c.dw0) | (u64::from(c.dw1) << 32))
}

async fn property_set(conn: &Conn, offset: u32, value: u32) -> Result<(), Error> {
    let p = Property {
        offset,
        eight_bytes: false,
        value: u64::from(value),
    };
    let r = conn
        .command(p.to_sqe(fabrics::PROPERTY_SET, 0), Bytes::new(), 0)
        .await?;
    check("Property Set", r).map(drop)
}

/// Polls CSTS until `(csts & mask) == want`, for at most `ms` milliseconds.
async fn wait_csts(conn: &Conn, mask: u32, want: u32, ms: u64) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms.max(500));
    // Bounded by the deadline.
    loop {
        let csts = property_get(conn, reg::CSTS, false).await? as u32;
        if csts & CSTS_CFS != 0 {
            return Err(Error::Invalid(
                "the controller reports fatal status (CSTS.CFS)".into(),
            ));
        }
        if csts & mask == want {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout("CSTS to follow CC"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn identify(conn: &Conn, cns: u8, nsid: u32) -> Result<Bytes, Error> {
    let mut s = Sqe::new(admin::IDENTIFY, 0);
    s.set_nsid(nsid);
    s.set_cdw(10, u32::from(cns));
    let r = conn.command(s, Bytes::new(), IDENTIFY_LEN as u32).await?;
    Ok(check("Identify", r)?.data)
}

impl Controller {
    /// Connects to the controller at `addr` (HOST:PORT) and brings it up with `opts`.
    pub async fn connect(addr: &str, opts: &ConnectOptions) -> Result<Controller, Error> {
        if opts.queues == 0 || opts.queue_depth < 2 {
            return Err(Error::Invalid(
                "at least one I/O queue of 2 entries is needed".into(),
            ));
        }
        let sa = resolve(addr).await?;
        let hc = HostConfig {
            hdgst: opts.hdgst,
            ddgst: opts.ddgst,
            depth: ADMIN_DEPTH,
            max_transfer: MAX_COMMAND_BYTES,
            in_capsule: 8192,
        };
        let admin = Conn::open(sa, hc).await?;
        let cntlid = fabrics_connect(&admin, opts, 0, fabrics::CNTLID_DYNAMIC).await?;
        let cap = Cap(property_get(&admin, reg::CAP, true).await?);
        property_set(&admin, reg::CC, CC_ENABLE).await?;
        wait_csts(&admin, CSTS_RDY, CSTS_RDY, cap.timeout_ms()).await?;
        let id = identify(&admin, admin::CNS_CONTROLLER, 0).await?;
        let identify = IdentifyController::parse(&id).map_err(|e| Error::Invalid(e.to_string()))?;
        let granted = set_queues(&admin, opts.queues).await?;
        let depth = opts
            .queue_depth
            .min(u16::try_from(cap.max_queue_entries()).unwrap_or(u16::MAX))
            .max(2);
        let max_command = identify
            .max_transfer(cap.min_page_size())
            .map_or(MAX_COMMAND_BYTES, |m| {
                m.min(u64::from(MAX_COMMAND_BYTES)) as u32
            });
        let mut io = Vec::new();
        for qid in 1..=opts.queues.min(granted) {
            let q = Conn::open(sa, HostConfig { depth, ..hc }).await?;
            q.set_in_capsule_limit(identify.in_capsule_data());
            fabrics_connect(&q, opts, qid, cntlid).await?;
            io.push(q);
        }
        let admin = Arc::new(admin);
        let keep_alive = (opts.kato_ms > 0).then(|| {
            let period = Duration::from_millis(u64::from(opts.kato_ms / 2).max(100));
            tokio::spawn(keep_alive(admin.clone(), period))
        });
        Ok(Controller {
            admin,
            io,
            next: AtomicUsize::new(0),
            cntlid,
            identify,
            max_command,
            namespaces: Mutex::new(HashMap::new()),
            keep_alive,
        })
    }

    /// The controller ID the admin Connect returned.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// The Identify Controller data.
    pub fn identify(&self) -> &IdentifyController {
        &self.identify
    }

    /// I/O queues in use.
    pub fn queues(&self) -> usize {
        self.io.len()
    }

    /// Commands outstanding at most on each I/O queue.
    pub fn queue_depth(&self) -> u16 {
        self.io.first().map_or(0, Conn::depth)
    }

    /// The digests the controller enabled (header, data).
    pub fn digests(&self) -> (bool, bool) {
        self.admin.digests()
    }

    /// The most bytes one command moves (reads and writes are split into commands this big).
    pub fn max_command_bytes(&self) -> u32 {
        self.max_command
    }

    /// Namespace `nsid`'s geometry (Identify Namespace, read once).
    pub async fn namespace(&self, nsid: u32) -> Result<Namespace, Error> {
        if let Some(n) = self.ns_cached(nsid) {
            return Ok(n);
        }
        let d = identify(&self.admin, admin::CNS_NAMESPACE, nsid).await?;
        let n = IdentifyNamespace::parse(&d)
            .map_err(|e| Error::Invalid(format!("namespace {nsid}: {e}")))?;
        if n.nsze == 0 {
            return Err(Error::Invalid(format!("namespace {nsid} is not active")));
        }
        self.namespaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(nsid, n);
        Ok(n)
    }

    fn ns_cached(&self, nsid: u32) -> Option<Namespace> {
        let m = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&nsid).copied()
    }

    fn queue(&self) -> &Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.io[i % self.io.len()]
    }

    /// Most blocks of one command for `ns`.
    fn blocks_per_command(&self, ns: &Namespace) -> u64 {
        (u64::from(self.max_command) / u64::from(ns.block_size)).clamp(1, 65536)
    }

    fn check_range(ns: &Namespace, nsid: u32, lba: u64, blocks: u64) -> Result<(), Error> {
        if blocks == 0 || lba.checked_add(blocks).is_none_or(|e| e > ns.nsze) {
            return Err(Error::Invalid(format!(
                "blocks [{lba}, +{blocks}) are not within namespace {nsid}'s {} blocks",
                ns.nsze
            )));
        }
        Ok(())
    }

    /// Reads `blocks` blocks from `lba` of namespace `nsid`.
    pub async fn read(&self, nsid: u32, lba: u64, blocks: u64) -> Result<Bytes, Error> {
        let ns = self.namespace(nsid).await?;
        Self::check_range(&ns, nsid, lba, blocks)?;
        let per = self.blocks_per_command(&ns);
        if blocks <= per {
            return self.read_one(nsid, &ns, lba, blocks as u32).await;
        }
        let mut out = Vec::with_capacity((blocks * u64::from(ns.block_size)) as usize);
        let mut at = lba;
        // Bounded: each round reads at least one block.
        while at < lba + blocks {
            let n = (lba + blocks - at).min(per);
            out.extend_from_slice(&self.read_one(nsid, &ns, at, n as u32).await?);
            at += n;
        }
        Ok(out.into())
    }

    async fn read_one(&self, nsid: u32, ns: &Namespace, lba: u64, n: u32) -> Result<Bytes, Error> {
        let s = Sqe::rw(nvm::READ, 0, nsid, lba, n);
        let r = self
            .queue()
            .command(s, Bytes::new(), n * ns.block_size)
            .await?;
        Ok(check("Read", r)?.data)
    }

    /// Writes `data` (whole blocks) at `lba` of namespace `nsid`.
    pub async fn write(&self, nsid: u32, lba: u64, data: Bytes) -> Result<(), Error> {
        let ns = self.namespace(nsid).await?;
        let bs = u64::from(ns.block_size);
        if !(data.len() as u64).is_multiple_of(bs) {
            return Err(Error::Invalid(format!(
                "{} bytes are not whole {bs}-byte blocks",
                data.len()
            )));
        }
        let blocks = data.len() as u64 / bs;
        Self::check_range(&ns, nsid, lba, blocks)?;
        let per = self.blocks_per_command(&ns);
        let mut done = 0;
        // Bounded: each round writes at least one block.
        while done < blocks {
            let n = (blocks - done).min(per);
            let chunk = data.slice((done * bs) as usize..((done + n) * bs) as usize);
            let s = Sqe::rw(nvm::WRITE, 0, nsid, lba + done, n as u32);
            check("Write", self.queue().command(s, chunk, 0).await?)?;
            done += n;
        }
        Ok(())
    }

    /// Flushes namespace `nsid`'s volatile write cache.
    pub async fn flush(&self, nsid: u32) -> Result<(), Error> {
        let mut s = Sqe::new(nvm::FLUSH, 0);
        s.set_nsid(nsid);
        check("Flush", self.queue().command(s, Bytes::new(), 0).await?).map(drop)
    }

    /// Writes zeros to `blocks` blocks from `lba`.
    pub async fn write_zeroes(&self, nsid: u32, lba: u64, blocks: u64) -> Result<(), Error> {
        let ns = self.namespace(nsid).await?;
        Self::check_range(&ns, nsid, lba, blocks)?;
        let mut done = 0;
        // Bounded: each round covers at least one block.
        while done < blocks {
            let n = (blocks - done).min(65536);
            let s = Sqe::rw(nvm::WRITE_ZEROES, 0, nsid, lba + done, n as u32);
            check(
                "Write Zeroes",
                self.queue().command(s, Bytes::new(), 0).await?,
            )?;
            done += n;
        }
        Ok(())
    }

    /// Deallocates (trims) `blocks` blocks from `lba` with one Dataset Management command.
    pub async fn deallocate(&self, nsid: u32, lba: u64, blocks: u64) -> Result<(), Error> {
        let ns = self.namespace(nsid).await?;
        Self::check_range(&ns, nsid, lba, blocks)?;
        let mut ranges = Vec::new();
        let mut at = lba;
        // Bounded: each round covers up to 2^32-1 blocks; at most 256 ranges.
        while at < lba + blocks {
            if ranges.len() == 256 * nvm::DSM_RANGE_LEN {
                return Err(Error::Invalid(
                    "deallocate range too long for one command".into(),
                ));
            }
            let n = (lba + blocks - at).min(u64::from(u32::MAX));
            ranges.extend_from_slice(&0u32.to_le_bytes());
            ranges.extend_from_slice(&(n as u32).to_le_bytes());
            ranges.extend_from_slice(&at.to_le_bytes());
            at += n;
        }
        let mut s = Sqe::new(nvm::DATASET_MANAGEMENT, 0);
        s.set_nsid(nsid);
        s.set_cdw(10, (ranges.len() / nvm::DSM_RANGE_LEN - 1) as u32);
        s.set_cdw(11, nvm::DSM_DEALLOCATE);
        let r = self.queue().command(s, Bytes::from(ranges), 0).await?;
        check("Dataset Management", r).map(drop)
    }

    /// Tells the controller the host is going away (CC.SHN normal, CSTS.SHST awaited for at
    /// most 2 s), then closes every queue.
    pub async fn shutdown(self) -> Result<(), Error> {
        property_set(&self.admin, reg::CC, CC_SHUTDOWN_NORMAL).await?;
        wait_csts(&self.admin, CSTS_SHST_MASK, CSTS_SHST_COMPLETE, 2000).await
    }
}

/// Set Features Number of Queues; the I/O queues granted.
async fn set_queues(admin: &Conn, queues: u16) -> Result<u16, Error> {
    let mut s = Sqe::new(nvme_tcp::sqe::admin::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(nvme_tcp::sqe::admin::FEAT_NUMBER_OF_QUEUES));
    let n = u32::from(queues - 1);
    s.set_cdw(11, n | (n << 16));
    let r = check(
        "Set Features (Number of Queues)",
        admin.command(s, Bytes::new(), 0).await?,
    )?;
    let (sq, cq) = (r.cqe.dw0 & 0xFFFF, r.cqe.dw0 >> 16);
    Ok((sq.min(cq) as u16).saturating_add(1))
}

/// Sends Keep Alive every `period` until the connection ends or the task is aborted.
async fn keep_alive(admin: Arc<Conn>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    // Bounded by the connection: ends when a Keep Alive fails.
    loop {
        tick.tick().await;
        let s = Sqe::new(admin::KEEP_ALIVE, 0);
        match admin.command(s, Bytes::new(), 0).await {
            Ok(c) if c.cqe.status.is_success() => {}
            Ok(c) => {
                tracing::warn!("Keep Alive failed: {}", c.cqe.status.code);
                return;
            }
            Err(e) => {
                tracing::debug!("Keep Alive: {e}");
                return;
            }
        }
    }
}
