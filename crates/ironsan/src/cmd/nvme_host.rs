//! `ironsan read`, `write` and `bench` on `nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID` URLs:
//! the same commands over the NVMe/TCP host (`nvme-initiator`) instead of an iSCSI session.
//! The login options that mean something here: `--header-digest`/`--data-digest crc32c`
//! (NVMe/TCP header and data digests), `--connections` (I/O queues) and `--initiator-name`
//! when it is an NQN (the host NQN).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bench::device::NvmeNamespace;
use bench::workload::{Summary, Workload};
use bytes::Bytes;
use iscsi_initiator::scsi::Capacity;
use nvme_initiator::{ConnectOptions, Controller, Namespace};

use super::blockbench::BlockBenchArgs;
use super::initiator::{LoginOpts, ReadArgs, WriteArgs};

/// The URL scheme.
pub const SCHEME: &str = "nvme+tcp://";

/// True when `url` names an NVMe/TCP namespace (whatever else is wrong with it).
pub fn is_nvme(url: &str) -> bool {
    url.get(..SCHEME.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(SCHEME))
}

/// A parsed `nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeUrl {
    /// HOST:PORT (port 4420 when none is given).
    pub addr: String,
    /// The subsystem NQN.
    pub subnqn: String,
    /// The namespace ID (1 or more).
    pub nsid: u32,
}

const SHAPE: &str = "nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID";

impl NvmeUrl {
    /// Parses `url`; a mistake is one line saying what to fix.
    pub fn parse(url: &str) -> anyhow::Result<NvmeUrl> {
        let bad = |why: &str| anyhow::anyhow!("{url}: {why} (expected {SHAPE})");
        if !is_nvme(url) {
            return Err(bad("not an nvme+tcp:// URL"));
        }
        let rest = &url[SCHEME.len()..];
        let mut parts = rest.splitn(3, '/');
        let host = parts.next().unwrap_or("");
        let nqn = parts.next().unwrap_or("");
        let nsid = parts.next();
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if nqn.is_empty() {
            return Err(bad("no subsystem NQN after the host"));
        }
        if !nqn.starts_with("nqn.") || nqn.len() > 223 {
            return Err(bad(
                "the subsystem NQN must start with 'nqn.' (at most 223 bytes)",
            ));
        }
        let Some(nsid) = nsid.filter(|s| !s.is_empty()) else {
            return Err(bad("no namespace ID after the NQN"));
        };
        let nsid: u32 = nsid
            .parse()
            .ok()
            .filter(|&n| n >= 1 && n != u32::MAX)
            .ok_or_else(|| bad("the namespace ID must be a number from 1"))?;
        let has_port = match host.rfind(']') {
            Some(end) => host[end..].contains(':'),
            None => host.contains(':'),
        };
        let addr = if has_port {
            let port = host.rsplit(':').next().unwrap_or("");
            if port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad("the port must be a number from 1 to 65535"));
            }
            host.to_string()
        } else {
            format!("{host}:{}", nvme_tcp::NVME_TCP_PORT)
        };
        Ok(NvmeUrl {
            addr,
            subnqn: nqn.to_string(),
            nsid,
        })
    }
}

fn crc(opt: &Option<String>) -> bool {
    opt.as_deref()
        .is_some_and(|s| s.to_ascii_lowercase().starts_with("crc32c"))
}

/// The connection options from the command's login options.
pub fn options(url: &NvmeUrl, login: &LoginOpts, queue_depth: u16) -> ConnectOptions {
    let mut o = ConnectOptions::new(url.subnqn.clone());
    if login.initiator_name.starts_with("nqn.") {
        o.hostnqn = login.initiator_name.clone();
    }
    o.queues = login.connections.max(1);
    o.queue_depth = queue_depth.max(2);
    o.hdgst = crc(&login.header_digest);
    o.ddgst = crc(&login.data_digest);
    o
}

async fn connect(url: &NvmeUrl, o: &ConnectOptions) -> anyhow::Result<(Controller, Namespace)> {
    let c = Controller::connect(&url.addr, o)
        .await
        .with_context(|| format!("NVMe/TCP controller at {} ({})", url.addr, url.subnqn))?;
    let ns = c.namespace(url.nsid).await?;
    Ok((c, ns))
}

fn check_aligned(what: &str, v: u64, bs: u32) -> anyhow::Result<()> {
    if !v.is_multiple_of(u64::from(bs)) {
        bail!("{what} {v} is not a multiple of the {bs}-byte block size");
    }
    Ok(())
}

/// Bytes per command for `read`/`write` and commands kept in flight.
const CHUNK: u64 = 1 << 20;
const IN_FLIGHT: usize = 8;

type Pending<T> = VecDeque<tokio::task::JoinHandle<Result<T, nvme_initiator::Error>>>;

/// `ironsan read nvme+tcp://...`.
pub fn read(args: ReadArgs) -> anyhow::Result<()> {
    let url = NvmeUrl::parse(&args.url)?;
    let opts = options(&url, &args.login, 32);
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    super::initiator::run_interruptible(&args.login, async {
        let (c, ns) = connect(&url, &opts).await?;
        let (bs, size) = (ns.block_size, ns.bytes());
        check_aligned("offset", args.offset, bs)?;
        let len = args.length.unwrap_or(size.saturating_sub(args.offset));
        check_aligned("length", len, bs)?;
        if args.offset.checked_add(len).is_none_or(|e| e > size) {
            bail!("offset + length is past the end of the {size}-byte namespace");
        }
        let c = Arc::new(c);
        let mut pending: Pending<Bytes> = VecDeque::new();
        let (mut at, end) = (args.offset, args.offset + len);
        let bar = super::progress::bytes(Some(len), "read");
        // Bounded: each round submits or completes one chunk.
        while at < end || !pending.is_empty() {
            if at < end && pending.len() < IN_FLIGHT {
                let n = (end - at).min(CHUNK);
                let (c, nsid, lba) = (c.clone(), url.nsid, at / u64::from(bs));
                let blocks = n / u64::from(bs);
                pending.push_back(tokio::spawn(async move { c.read(nsid, lba, blocks).await }));
                at += n;
                continue;
            }
            let p = pending.pop_front().context("no read pending")?;
            let data = p.await.context("a read task failed")??;
            out.write_all(&data).context("writing the output")?;
            bar.inc(data.len() as u64);
        }
        bar.finish_and_clear();
        out.flush().context("writing the output")?;
        shutdown(c).await;
        Ok(())
    })
}

/// `ironsan write nvme+tcp://...`.
pub fn write(args: WriteArgs) -> anyhow::Result<()> {
    let url = NvmeUrl::parse(&args.url)?;
    let opts = options(&url, &args.login, 32);
    let (mut input, known_len): (Box<dyn std::io::Read>, Option<u64>) = match &args.input {
        Some(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
            let len = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
            (Box::new(f), len)
        }
        None => (Box::new(std::io::stdin().lock()), None),
    };
    super::initiator::run_interruptible(&args.login, async {
        let (c, ns) = connect(&url, &opts).await?;
        let (bs, size) = (ns.block_size, ns.bytes());
        check_aligned("offset", args.offset, bs)?;
        if let Some(n) = known_len {
            check_aligned("input length", n, bs)?;
            if args.offset + n > size {
                bail!("offset + input length is past the end of the {size}-byte namespace");
            }
        }
        let c = Arc::new(c);
        let mut pending: Pending<u64> = VecDeque::new();
        let mut at = args.offset;
        let mut eof = false;
        let bar = super::progress::bytes(known_len, "write");
        // Bounded by the input: each round reads a chunk or completes one.
        while !eof || !pending.is_empty() {
            if !eof && pending.len() < IN_FLIGHT {
                let mut buf = vec![0u8; CHUNK as usize];
                let n = super::initiator::read_full(&mut input, &mut buf)
                    .context("reading the input")?;
                eof = n < buf.len();
                if n == 0 {
                    continue;
                }
                buf.truncate(n);
                check_aligned("input length", at - args.offset + n as u64, bs)?;
                if at + n as u64 > size {
                    bail!("the input runs past the end of the {size}-byte namespace");
                }
                let (c, nsid, lba) = (c.clone(), url.nsid, at / u64::from(bs));
                let data = Bytes::from(buf);
                let n = n as u64;
                pending.push_back(tokio::spawn(async move {
                    c.write(nsid, lba, data).await.map(|()| n)
                }));
                at += n;
                continue;
            }
            let p = pending.pop_front().context("no write pending")?;
            bar.inc(p.await.context("a write task failed")??);
        }
        bar.finish_and_clear();
        c.flush(url.nsid).await?;
        shutdown(c).await;
        Ok(())
    })
}

/// A normal shutdown when this is the last user of the controller (best effort).
async fn shutdown(c: Arc<Controller>) {
    if let Ok(c) = Arc::try_unwrap(c) {
        if let Err(e) = c.shutdown().await {
            tracing::debug!("NVMe/TCP shutdown: {e}");
        }
    }
}

/// `ironsan bench nvme+tcp://...`: one controller per `--sessions`, `--connections` I/O
/// queues each, the workloads run through [`NvmeNamespace`].
pub async fn bench_rows(
    url: &NvmeUrl,
    login: &LoginOpts,
    sessions: usize,
    qd: usize,
    workloads: &[Workload],
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Summary>> {
    let depth = u16::try_from(qd.div_ceil(usize::from(login.connections.max(1))) + 1)
        .unwrap_or(u16::MAX)
        .max(32);
    let opts = options(url, login, depth);
    let mut devs = Vec::new();
    let mut ns = None;
    for _ in 0..sessions.max(1) {
        let (c, n) = connect(url, &opts).await?;
        ns = Some(n);
        devs.push(Arc::new(NvmeNamespace {
            controller: Arc::new(c),
            nsid: url.nsid,
        }));
    }
    let ns = ns.context("no controller")?;
    let cap = Capacity {
        blocks: ns.nsze,
        block_size: ns.block_size,
        thin: false,
    };
    let mut rows = Vec::new();
    for w in workloads {
        rows.push(super::blockbench::measure_on(&devs, 0, cap, w, bar).await?);
    }
    for d in devs {
        if let Ok(d) = Arc::try_unwrap(d) {
            tokio::time::timeout(Duration::from_secs(5), shutdown(d.controller))
                .await
                .ok();
        }
    }
    Ok(rows)
}

/// `ironsan bench nvme+tcp://...`: the access generator's points on an NVMe/TCP namespace,
/// reported as for iSCSI.
pub fn bench(a: BlockBenchArgs) -> anyhow::Result<()> {
    if a.script.is_some() {
        bail!("--script runs iSCSI URLs; give the nvme+tcp:// URL without it");
    }
    let rt = super::initiator::runtime()?;
    let rows = super::initiator::block_on_interruptible(&rt, nvme_rows(&a));
    drop(rt);
    a.login.finish_trace()?;
    super::blockbench::report_rows(&a, rows?)
}

/// The points of `ironsan bench nvme+tcp://...`.
async fn nvme_rows(a: &BlockBenchArgs) -> anyhow::Result<Vec<Summary>> {
    if a.tcp_info.is_some() || a.tcp_info_plot.is_some() {
        bail!("--tcp-info samples iSCSI connections; it does not apply to nvme+tcp:// URLs");
    }
    let url = NvmeUrl::parse(a.url.as_deref().unwrap_or_default())?;
    let duration = match (a.duration, a.count) {
        (Some(d), _) if d > 0.0 => Some(Duration::from_secs_f64(d)),
        (Some(_), _) => bail!("--duration must be positive"),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(5)),
    };
    let mut ws = Vec::new();
    for rw in super::blockbench::rws(a)? {
        for pattern in super::blockbench::patterns(a)? {
            for size in super::blockbench::sizes(&a.size)? {
                ws.push(Workload {
                    rw,
                    pattern,
                    size,
                    qd: a.qd.max(1),
                    duration,
                    count: a.count,
                    span: a.span.or(a.verify.then_some(256 << 20)),
                    verify: a.verify,
                    seed: a.seed,
                });
            }
        }
    }
    let bar = super::progress::steps(ws.len() as u64, "bench");
    let rows = bench_rows(&url, &a.login, a.sessions, a.qd.max(1), &ws, &bar).await;
    bar.finish_and_clear();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_the_default_port() {
        let u = NvmeUrl::parse("nvme+tcp://127.0.0.1/nqn.2026-01.org.x:a/1").unwrap();
        assert_eq!(u.addr, "127.0.0.1:4420");
        assert_eq!((u.subnqn.as_str(), u.nsid), ("nqn.2026-01.org.x:a", 1));
        let u = NvmeUrl::parse("NVME+TCP://[::1]:4421/nqn.x/7").unwrap();
        assert_eq!((u.addr.as_str(), u.nsid), ("[::1]:4421", 7));
        let u = NvmeUrl::parse("nvme+tcp://[::1]/nqn.x/2").unwrap();
        assert_eq!(u.addr, "[::1]:4420");
    }

    #[test]
    fn wrong_urls_say_what_to_fix_in_one_line() {
        for (url, want) in [
            ("nvme+tcp://h/nqn.x", "no namespace ID"),
            ("nvme+tcp://h/nqn.x/0", "a number from 1"),
            ("nvme+tcp://h/nqn.x/a", "a number from 1"),
            ("nvme+tcp://h/iqn.x/1", "must start with 'nqn.'"),
            ("nvme+tcp://h", "no subsystem NQN"),
            ("nvme+tcp:///nqn.x/1", "no host"),
            ("nvme+tcp://h:99999/nqn.x/1", "port"),
            ("iscsi://h/iqn.x/0", "not an nvme+tcp"),
        ] {
            let e = NvmeUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
            assert!(e.contains(SHAPE) && !e.contains('\n'), "{e}");
        }
    }
}
