//! The initiator commands: `ironsan discover`, `ls`, `inq`, `read` and `write`. URLs are
//! libiscsi's: `iscsi://[user[%password]@]host[:port]/target-iqn/lun` (`read` and `write`
//! also take `nvme+tcp://` URLs, which main.rs hands to `nvme_host`); a LUN URL may list
//! several portals of one LU (`host1,host2:3261`) for a multipath session (docs/multipath.md).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use bytes::Bytes;
use iscsi_initiator::{scsi, CommandRequest, IscsiUrl, SessionConfig, TraceFile};

/// Options shared by the commands that log in.
#[derive(clap::Args, Clone)]
pub struct LoginOpts {
    /// Initiator name (IQN) to log in with.
    #[arg(long, value_name = "IQN", default_value = iscsi_initiator::DEFAULT_INITIATOR_NAME)]
    pub initiator_name: String,
    /// Connections per session (capped by the target's MaxConnections).
    #[arg(long, default_value_t = 1)]
    pub connections: u16,
    /// Header digest: none, crc32c, crc32c-none, none-crc32c (overrides the URL).
    #[arg(long, value_name = "DIGEST")]
    pub header_digest: Option<String>,
    /// Data digest: none, crc32c, crc32c-none, none-crc32c (overrides the URL).
    #[arg(long, value_name = "DIGEST")]
    pub data_digest: Option<String>,
    /// Highest ErrorRecoveryLevel to offer over iSCSI/TCP (overrides the URL): 0 (a digest
    /// error ends the connection), 1 (it is mended in place: SNACK, recovery R2T, retry) or
    /// 2 (also a lost connection is logged in again and its commands reassigned to it).
    #[arg(long, value_name = "0|1|2")]
    pub error_recovery_level: Option<u8>,
    /// When a connection is lost, log in again (session reinstatement) and send the
    /// commands in flight again instead of failing them.
    #[arg(long)]
    pub reconnect: bool,
    /// Record every byte sent and received on every connection in this pcapng file
    /// (read it with `ironsan analyze FILE` or tshark; no capture privileges needed).
    #[arg(long, value_name = "FILE.pcapng")]
    pub trace: Option<PathBuf>,
    /// Keep only the first BYTES of each SCSI Command's, Data-Out's and Data-In's data in the
    /// trace (0: headers only), so that long runs give small traces; `ironsan analyze` still
    /// counts every byte.
    #[arg(long, value_name = "BYTES", requires = "trace")]
    pub trace_snap: Option<usize>,
    /// What iser:// URLs run on: software (ironsan's iWARP RNIC in this process) or
    /// rdma-core (the first libibverbs device: Linux siw or a hardware RNIC; needs a build
    /// with the rdma-core feature).
    #[arg(long, value_name = "PROVIDER", default_value = "software")]
    pub rdma_provider: iscsi_initiator::IserProvider,
    /// iser:// on the software RNIC: microseconds its engine polls on after its last work
    /// before it sleeps (0: at once; polling costs less than a sleep and a wake-up while
    /// commands keep coming, and stops when they do). Writes of 64 KiB or more do not poll
    /// while more than two are in flight.
    #[arg(long, value_name = "US", default_value_t = datamover_iser::rnic_task::DEFAULT_POLL.as_micros() as u64)]
    pub rdma_poll_us: u64,
    /// iscsi:// : microseconds each connection's reader polls its socket after a PDU before
    /// it sleeps (0: at once; default 50, or the URL's `tcp_poll_us`). Polling costs less
    /// than a sleep and a wake-up while commands keep coming, and stops when they do.
    #[arg(long, value_name = "US")]
    pub tcp_poll_us: Option<u64>,
    /// Offer ImmediateData (yes or no; the target's answer decides). Any of these three
    /// options also makes iser:// send unsolicited data as negotiated; by default it sends a
    /// write unsolicited only when the whole write fits in the command's Send.
    #[arg(long, value_name = "yes|no", value_parser = yes_no)]
    pub immediate_data: Option<bool>,
    /// Offer InitialR2T (yes: every write waits for the target's R2T or RDMA Read; no:
    /// unsolicited data up to FirstBurstLength).
    #[arg(long, value_name = "yes|no", value_parser = yes_no)]
    pub initial_r2t: Option<bool>,
    /// Offer FirstBurstLength (unsolicited bytes per write), e.g. 64k.
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub first_burst_length: Option<u64>,
    /// iSER: ask the target for plain Sends instead of Send with Invalidate (the iSER CM
    /// word's 0x40 bit); the initiator then invalidates its own STags.
    #[arg(long)]
    pub no_remote_invalidation: bool,
    /// Multipath (a URL listing several portals): seconds commands wait for a usable path
    /// when none is, before they fail.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub no_path_retry: u64,
    /// Multipath: seconds a path may take to answer a command before it counts as failed
    /// and the command moves to another path.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub path_timeout: u64,
    /// Multipath: seconds between checks of each path's state (ALUA).
    #[arg(long, value_name = "SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub path_check_interval: u64,
    /// The open trace, created on first use so that every session of a run shares it.
    #[arg(skip)]
    trace_file: std::sync::OnceLock<TraceFile>,
}

impl LoginOpts {
    pub fn config(&self, url: &IscsiUrl) -> anyhow::Result<SessionConfig> {
        let mut c = SessionConfig::from_url(url);
        c.initiator_name = self.initiator_name.clone();
        c.connections = self.connections.max(1);
        c.iser_provider = self.rdma_provider;
        c.iser_poll = std::time::Duration::from_micros(self.rdma_poll_us);
        if let Some(us) = self.tcp_poll_us {
            c.tcp_poll = std::time::Duration::from_micros(us);
        }
        c.iser_remote_invalidation = !self.no_remote_invalidation;
        // Asking for unsolicited data explicitly means sending it as negotiated, over iSER too
        // (whose default sends only writes that fit whole in the command's Send).
        if self.immediate_data.is_some()
            || self.initial_r2t.is_some()
            || self.first_burst_length.is_some()
        {
            c.iser_unsolicited_only_whole = false;
        }
        if let Some(v) = self.immediate_data {
            c.immediate_data = v;
        }
        if let Some(v) = self.initial_r2t {
            c.initial_r2t = v;
        }
        if let Some(v) = self.first_burst_length {
            c.first_burst_length = u32::try_from(v)
                .ok()
                .filter(|&n| (512..=16_776_192).contains(&n))
                .with_context(|| {
                    format!("--first-burst-length {v}: say 512 B to 16776192 B (RFC 7143)")
                })?;
        }
        // The URL parser knows the digest spellings: reuse it.
        let digest = |v: &str| -> anyhow::Result<iscsi_initiator::DigestPreference> {
            let u: IscsiUrl = format!("iscsi://h/?header_digest={v}").parse()?;
            Ok(u.header_digest.expect("set"))
        };
        if let Some(d) = &self.header_digest {
            c.header_digest = digest(d)?;
        }
        if let Some(d) = &self.data_digest {
            c.data_digest = digest(d)?;
        }
        if let Some(l) = self.error_recovery_level {
            let u: IscsiUrl = format!("iscsi://h/?error_recovery_level={l}")
                .parse()
                .map_err(|e: iscsi_initiator::UrlError| {
                    anyhow::anyhow!("--error-recovery-level: {e}")
                })?;
            c.error_recovery_level = u.error_recovery_level.expect("set");
        }
        c.reconnect |= self.reconnect;
        c.multipath.no_path_retry = std::time::Duration::from_secs(self.no_path_retry);
        c.multipath.command_timeout = std::time::Duration::from_secs(self.path_timeout);
        c.multipath.check_interval = std::time::Duration::from_secs(self.path_check_interval);
        if let Some(p) = &self.trace {
            if self.trace_file.get().is_none() {
                let mut t = TraceFile::create(p)
                    .with_context(|| format!("creating the trace {}", p.display()))?;
                if let Some(n) = self.trace_snap {
                    t.0 = t.0.with_snap(n);
                }
                let _ = self.trace_file.set(t);
            }
            c.trace = self.trace_file.get().cloned();
        }
        Ok(c)
    }

    /// Writes the rest of the trace to its file. Call after the runtime is gone, so that
    /// every connection's closing segments are in it.
    pub fn finish_trace(&self) -> anyhow::Result<()> {
        if let (Some(t), Some(p)) = (self.trace_file.get(), &self.trace) {
            t.flush()
                .with_context(|| format!("writing the trace {}", p.display()))?;
        }
        Ok(())
    }
}

/// Runs `f` on a fresh runtime, drops the runtime (ending every connection task), then
/// flushes the trace of `login`. For commands that handle SIGINT and SIGTERM themselves
/// (`mount`, `nbd`: a clean unmount or shutdown).
pub fn run_with<T>(
    login: &LoginOpts,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let rt = runtime()?;
    let r = rt.block_on(f);
    drop(rt);
    login.finish_trace()?;
    r
}

/// [`run_with`] for a command that runs to its end: SIGINT or SIGTERM stops it as an error
/// ([`block_on_interruptible`]), the trace still flushed.
pub fn run_interruptible<T>(
    login: &LoginOpts,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let rt = runtime()?;
    let r = block_on_interruptible(&rt, f);
    drop(rt);
    login.finish_trace()?;
    r
}

/// Runs `f` on `rt` until it ends or the process gets SIGINT (Ctrl-C) or SIGTERM. An
/// interrupted run is an error; the caller still drops the runtime and flushes the trace,
/// so a run stopped because it hangs leaves the PDUs that show why.
pub fn block_on_interruptible<T>(
    rt: &tokio::runtime::Runtime,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    use tokio::signal::unix::{signal, SignalKind};
    rt.block_on(async {
        let (mut int, mut term) = (
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        );
        tokio::select! {
            r = f => r,
            _ = int.recv() => anyhow::bail!("interrupted (SIGINT) before the run ended"),
            _ = term.recv() => anyhow::bail!("terminated (SIGTERM) before the run ended"),
        }
    })
}

/// One thread: the initiator's work per command is small, and keeping the reader, the
/// writer and the submitters on one thread saves the cross-thread wake-ups that cost more
/// than the work on a busy machine.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("'{s}': say yes or no")),
    }
}

fn size(s: &str) -> Result<u64, String> {
    report::parse_size(s).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
pub struct DiscoverArgs {
    /// HOST[:PORT] or iscsi://[user%password@]HOST[:PORT]
    pub portal: String,
    #[command(flatten)]
    pub login: LoginOpts,
}

pub fn discover(args: DiscoverArgs) -> anyhow::Result<()> {
    let url = IscsiUrl::from_portal_or_url(&args.portal)?;
    let cfg = args.login.config(&url)?;
    let targets = run_interruptible(&args.login, async {
        Ok(transports::discover(&url, &cfg).await?)
    })?;
    for t in targets {
        if t.addresses.is_empty() {
            println!("{}", t.name);
        }
        for a in &t.addresses {
            let host = if a.host.contains(':') {
                format!("[{}]", a.host)
            } else {
                a.host.clone()
            };
            match a.tpgt {
                Some(g) => println!("{} {host}:{},{g}", t.name, a.port),
                None => println!("{} {host}:{}", t.name, a.port),
            }
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct LsArgs {
    /// iscsi://[user%password@]HOST[:PORT] (or HOST[:PORT])
    pub url: String,
    #[command(flatten)]
    pub login: LoginOpts,
}

/// Discovery, then a login to each target at the same portal: LUNs with their sizes.
pub fn ls(args: LsArgs) -> anyhow::Result<()> {
    let url = IscsiUrl::from_portal_or_url(&args.url)?;
    let cfg = args.login.config(&url)?;
    run_interruptible(&args.login, async {
        let targets = transports::discover(&url, &cfg).await?;
        let mut failed = 0;
        for t in &targets {
            let addrs: Vec<String> = t
                .addresses
                .iter()
                .map(|a| format!("{}:{}", a.host, a.port))
                .collect();
            println!("Target: {}  Portal: {}", t.name, addrs.join(" "));
            let turl = url.with_target(&t.name, 0);
            let s = match transports::connect_session(&turl, cfg.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ironsan: {}: {e}", t.name);
                    failed += 1;
                    continue;
                }
            };
            let luns = match s.report_luns().await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("ironsan: {}: {e}", t.name);
                    failed += 1;
                    continue;
                }
            };
            for lun in luns {
                if s.inquiry(lun)
                    .await
                    .is_ok_and(|i| i.device_type == ::scsi::OSD_DEVICE_TYPE)
                {
                    println!("  Lun: {lun}  object-based storage device (OSD): see `ironsan osd`");
                    continue;
                }
                match s.capacity(lun).await {
                    Ok(c) => println!(
                        "  Lun: {lun}  Size: {} ({} bytes, {} blocks of {} bytes){}",
                        report::format_size(c.bytes()),
                        c.bytes(),
                        c.blocks,
                        c.block_size,
                        if c.thin { ", thin" } else { "" }
                    ),
                    Err(e) => println!("  Lun: {lun}  ({e})"),
                }
            }
            let _ = s.logout().await;
        }
        if failed > 0 {
            bail!("{failed} of {} targets could not be listed", targets.len());
        }
        Ok(())
    })
}

#[derive(clap::Args)]
pub struct InqArgs {
    /// iscsi://[user%password@]HOST[:PORT][,HOST2[:PORT]...]/TARGET-IQN/LUN (several hosts: multipath)
    pub url: String,
    #[command(flatten)]
    pub login: LoginOpts,
}

pub fn inq(args: InqArgs) -> anyhow::Result<()> {
    let url = IscsiUrl::parse_lun(&args.url)?;
    let cfg = args.login.config(&url)?;
    run_interruptible(&args.login, async {
        let s = transports::connect_session(&url, cfg).await?;
        let lun = s.default_lun();
        let i = s.inquiry(lun).await?;
        println!("Vendor: {}", i.vendor);
        println!("Product: {}", i.product);
        println!("Revision: {}", i.revision);
        println!(
            "Device type: 0x{:02x} ({}), qualifier {}, version 0x{:02x}{}",
            i.device_type,
            i.device_type_name(),
            i.peripheral_qualifier,
            i.version,
            if i.removable { ", removable" } else { "" }
        );
        if let Ok(p) = s.inquiry_vpd(lun, 0).await {
            let pages = scsi::parse_vpd_page_list(&p);
            let list: Vec<String> = pages.iter().map(|p| format!("0x{p:02x}")).collect();
            println!("VPD pages: {}", list.join(" "));
            if pages.contains(&0x80) {
                if let Some(sn) = s
                    .inquiry_vpd(lun, 0x80)
                    .await
                    .ok()
                    .and_then(|b| scsi::parse_unit_serial(&b))
                {
                    println!("Unit serial number: {sn}");
                }
            }
        }
        if i.device_type == ::scsi::OSD_DEVICE_TYPE {
            println!("Objects: see `ironsan osd {} list`", args.url);
            let _ = s.logout().await;
            return Ok(());
        }
        let c = s.capacity(lun).await?;
        println!(
            "Capacity: {} ({} blocks of {} bytes)",
            report::format_size(c.bytes()),
            c.blocks,
            c.block_size
        );
        let _ = s.logout().await;
        Ok(())
    })
}

/// Bytes per command for `read`/`write` and commands kept in flight.
const CHUNK: u64 = 1 << 20;
const IN_FLIGHT: usize = 8;

#[derive(clap::Args)]
pub struct ReadArgs {
    /// iscsi://[user%password@]HOST[:PORT][,HOST2[:PORT]...]/TARGET-IQN/LUN (several hosts: multipath),
    /// or nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID
    pub url: String,
    /// Byte offset (a multiple of the block size; 4k, 1MiB... accepted).
    #[arg(long, default_value = "0", value_parser = size)]
    pub offset: u64,
    /// Bytes to read (a multiple of the block size; default: to the end of the LUN).
    #[arg(long, value_parser = size)]
    pub length: Option<u64>,
    /// Write the data here instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub login: LoginOpts,
}

fn check_aligned(what: &str, v: u64, bs: u32) -> anyhow::Result<()> {
    if !v.is_multiple_of(bs as u64) {
        bail!("{what} {v} is not a multiple of the {bs}-byte block size");
    }
    Ok(())
}

pub fn read(args: ReadArgs) -> anyhow::Result<()> {
    let url = IscsiUrl::parse_lun(&args.url)?;
    let cfg = args.login.config(&url)?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    run_interruptible(&args.login, async {
        let s = transports::connect_session(&url, cfg).await?;
        let lun = s.default_lun();
        s.test_unit_ready(lun).await?;
        let cap = s.capacity(lun).await?;
        let bs = cap.block_size;
        check_aligned("offset", args.offset, bs)?;
        if args.offset > cap.bytes() {
            bail!(
                "offset {} is past the end of the {}-byte LUN",
                args.offset,
                cap.bytes()
            );
        }
        let len = args.length.unwrap_or(cap.bytes() - args.offset);
        check_aligned("length", len, bs)?;
        if args.offset + len > cap.bytes() {
            bail!(
                "offset + length {} is past the end of the {}-byte LUN",
                args.offset + len,
                cap.bytes()
            );
        }
        let mut pending = VecDeque::new();
        let mut at = args.offset;
        let end = args.offset + len;
        let bar = super::progress::bytes(Some(len), "read");
        // Bounded: each round submits or completes one chunk.
        while at < end || !pending.is_empty() {
            if at < end && pending.len() < IN_FLIGHT {
                let n = (end - at).min(CHUNK);
                let blocks = (n / bs as u64) as u32;
                let cdb = scsi::read_write(false, at / bs as u64, blocks, false);
                pending.push_back(s.submit(CommandRequest::read(lun, cdb, n as u32)));
                at += n;
                continue;
            }
            let p = pending.pop_front().expect("non-empty");
            let r = p.wait().await?.good("READ")?;
            out.write_all(&r.data).context("writing the output")?;
            bar.inc(r.data.len() as u64);
        }
        bar.finish_and_clear();
        out.flush().context("writing the output")?;
        let _ = s.logout().await;
        Ok(())
    })
}

#[derive(clap::Args)]
pub struct WriteArgs {
    /// iscsi://[user%password@]HOST[:PORT][,HOST2[:PORT]...]/TARGET-IQN/LUN (several hosts: multipath),
    /// or nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID
    pub url: String,
    /// Byte offset (a multiple of the block size; 4k, 1MiB... accepted).
    #[arg(long, default_value = "0", value_parser = size)]
    pub offset: u64,
    /// Read the data from here instead of stdin (its length must be a multiple of the
    /// block size).
    #[arg(long, short)]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub login: LoginOpts,
}

/// Fills `buf` from `r` as far as possible; the count read (short only at EOF).
pub(crate) fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

pub fn write(args: WriteArgs) -> anyhow::Result<()> {
    let url = IscsiUrl::parse_lun(&args.url)?;
    let cfg = args.login.config(&url)?;
    let (mut input, known_len): (Box<dyn Read>, Option<u64>) = match &args.input {
        Some(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
            let len = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
            (Box::new(f), len)
        }
        None => (Box::new(std::io::stdin().lock()), None),
    };
    run_interruptible(&args.login, async {
        let s = transports::connect_session(&url, cfg).await?;
        let lun = s.default_lun();
        s.test_unit_ready(lun).await?;
        let cap = s.capacity(lun).await?;
        let bs = cap.block_size;
        check_aligned("offset", args.offset, bs)?;
        if let Some(n) = known_len {
            check_aligned("input length", n, bs)?;
            if args.offset + n > cap.bytes() {
                bail!(
                    "offset + input length {} is past the end of the {}-byte LUN",
                    args.offset + n,
                    cap.bytes()
                );
            }
        }
        let mut pending = VecDeque::new();
        let mut at = args.offset;
        let mut eof = false;
        let bar = super::progress::bytes(known_len, "write");
        while !eof || !pending.is_empty() {
            if !eof && pending.len() < IN_FLIGHT {
                let mut buf = vec![0u8; CHUNK as usize];
                let n = read_full(&mut input, &mut buf).context("reading the input")?;
                if n < buf.len() {
                    eof = true;
                }
                if n == 0 {
                    continue;
                }
                buf.truncate(n);
                check_aligned("input length", at - args.offset + n as u64, bs)?;
                if at + n as u64 > cap.bytes() {
                    bail!(
                        "the input runs past the end of the {}-byte LUN",
                        cap.bytes()
                    );
                }
                let blocks = (n / bs as usize) as u32;
                let cdb = scsi::read_write(true, at / bs as u64, blocks, false);
                pending.push_back((
                    n as u64,
                    s.submit(CommandRequest::write(lun, cdb, Bytes::from(buf))),
                ));
                at += n as u64;
                continue;
            }
            let (n, p) = pending.pop_front().expect("non-empty");
            p.wait().await?.good("WRITE")?;
            bar.inc(n);
        }
        bar.finish_and_clear();
        s.synchronize_cache(lun).await?;
        let _ = s.logout().await;
        Ok(())
    })
}
