//! `ironsan target`: serve iSCSI targets from a TOML config, or the embedded default
//! (one 1 GiB RAM LUN on 127.0.0.1:3260), and the config's NVMe/TCP subsystems over the
//! same LUNs (`target_nvme`). Started with --config, SIGHUP reads the file
//! again and applies what changed to the iSCSI targets while the target runs (the NVMe/TCP
//! subsystems are read at start).

use anyhow::Context;
use iscsi_target::Config;
use std::time::Duration;

#[derive(clap::Args)]
pub struct TargetArgs {
    /// Portal to listen on (repeatable): ADDR:PORT or tcp://ADDR:PORT for iSCSI/TCP,
    /// iser://ADDR:PORT for iSER (list both schemes on one address to serve both there).
    /// Default 127.0.0.1:3260, or the config's portals.
    #[arg(long = "portal", value_name = "ADDR:PORT")]
    pub portals: Vec<String>,
    /// TOML configuration file (portals, targets, LUNs, ACLs, CHAP).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Record every connection's bytes (login included) into this pcapng file, for
    /// `ironsan analyze` or tshark. No capture privileges needed.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// Keep only the first BYTES of each SCSI Command's, Data-Out's and Data-In's data in the
    /// trace (0: headers only): long runs give small traces that still decode and count.
    #[arg(long, value_name = "BYTES", requires = "trace")]
    pub trace_snap: Option<usize>,
    /// Sample each connection's TCP_INFO (cwnd, ssthresh, rtt, retransmits, delivery rate,
    /// unacked) and write, when the connection ends, DIR/conn-N-PEER.csv and a cwnd and
    /// throughput plot DIR/conn-N-PEER.svg.
    #[arg(long, value_name = "DIR")]
    pub tcp_info: Option<std::path::PathBuf>,
    /// TCP_INFO sampling interval.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub tcp_info_interval_ms: u64,
    /// Highest ErrorRecoveryLevel every target agrees to over iSCSI/TCP (overrides the
    /// config's error_recovery_level): 0 drops a connection on a digest error, 1 mends it in
    /// place (Reject and recovery R2T, SNACK answered), 2 also keeps a failed connection's
    /// tasks for TASK REASSIGN on another connection.
    #[arg(long, value_name = "LEVEL")]
    pub error_recovery_level: Option<u8>,
    /// Serve the control socket `ironsan admin` talks to (docs/admin.md) at PATH, created
    /// mode 0600; bare `--control`: $XDG_RUNTIME_DIR/ironsan/control.sock (root:
    /// /run/ironsan/control.sock). Overrides the config's control_socket. Default: none.
    #[arg(long, value_name = "PATH")]
    pub control: Option<Option<std::path::PathBuf>>,
    /// Serve Prometheus metrics on http://ADDR/metrics (overrides the config's `metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// Where the control socket goes: `--control PATH`, else the default path for a bare
/// `--control`, else the config's `control_socket`.
fn control_path(
    arg: Option<Option<&std::path::Path>>,
    config: &Config,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    match arg {
        Some(None) => control::default_socket_path()
            .map(Some)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--control: XDG_RUNTIME_DIR is not set; give a path (--control /path/to/control.sock) in a directory only you can write"
                )
            }),
        Some(Some(p)) => Ok(Some(p.to_path_buf())),
        None => Ok(config.control_socket.clone()),
    }
}

pub fn run(args: TargetArgs) -> anyhow::Result<()> {
    init_logging();
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    for p in &args.portals {
        iscsi_target::PortalSpec::parse(p).map_err(|why| anyhow::anyhow!("--portal: {why}"))?;
    }
    if let Some(level) = args.error_recovery_level {
        if level > iscsi_target::MAX_ERROR_RECOVERY_LEVEL {
            anyhow::bail!(
                "--error-recovery-level: {}",
                iscsi_target::error_recovery_level_help(level)
            );
        }
    }
    let overrides = Overrides {
        portals: args.portals.clone(),
        error_recovery_level: args.error_recovery_level,
    };
    overrides.apply(&mut config);
    let control_path = control_path(args.control.as_ref().map(|c| c.as_deref()), &config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let targets: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
        let first_lun_is_osd = config.targets.first().is_some_and(|t| {
            t.lun
                .get("0")
                .is_some_and(|l| matches!(l.backend, scsi::BackendConfig::Osd { .. }))
        });
        let metrics_addr = args.metrics.or(config.metrics);
        let subsystems = config.subsystems.clone();
        let bound = transports::bind_target(config)
            .await
            .map_err(anyhow::Error::msg)?;
        let trace = match &args.trace {
            Some(path) => {
                let mut t = pcap_trace::PduTrace::create(path).with_context(|| {
                    format!("--trace {}: cannot create the file", path.display())
                })?;
                if let Some(n) = args.trace_snap {
                    t = t.with_snap(n);
                }
                bound.trace_to(t.clone());
                Some(t)
            }
            None => None,
        };
        if let Some(dir) = &args.tcp_info {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("--tcp-info {}: cannot create the directory", dir.display())
            })?;
            bound.observe_connections(tcp_info_recorder(
                dir.clone(),
                Duration::from_millis(args.tcp_info_interval_ms.max(1)),
            ));
        }
        let addrs = bound.local_addrs();
        let target = bound.target();
        for (a, what) in target.portals() {
            println!("ironsan: serving iSCSI on {a} ({what})");
        }
        if let (Some(a), Some(t)) = (addrs.first(), targets.first()) {
            let host = if a.is_ipv6() {
                format!("[{}]", a.ip())
            } else {
                a.ip().to_string()
            };
            let hp = if a.port() == 3260 {
                host.clone()
            } else {
                format!("{host}:{}", a.port())
            };
            println!("ironsan: targets: {}", targets.join(", "));
            println!("ironsan: try:");
            println!("    iscsi-ls -s iscsi://{hp}/");
            println!("    iscsi-inq iscsi://{hp}/{t}/0");
            if first_lun_is_osd {
                println!("    ironsan osd iscsi://{hp}/{t}/0 list   # an OSD-2 object store");
            } else {
                println!("    iscsi-readcapacity16 iscsi://{hp}/{t}/0");
            }
            println!("    iscsiadm -m discovery -t sendtargets -p {hp}   # Linux open-iscsi");
        }
        if let Some(addr) = metrics_addr {
            let at = super::target_service::start_metrics(addr, target.clone()).await?;
            println!("ironsan: metrics on http://{at}/metrics");
        }
        let serving = tokio::spawn(bound.serve());
        let nvme = super::target_nvme::start(&subsystems, target.clone()).await?;
        let control = match &control_path {
            Some(path) => {
                let (server, methods) =
                    super::admin_server::bind(path, target.clone(), args.config.clone())
                        .with_context(|| format!("control socket {}", path.display()))?;
                println!(
                    "ironsan: control socket {0} (ironsan admin --socket {0} targets)",
                    path.display()
                );
                Some(tokio::spawn(server.serve(methods)))
            }
            None => None,
        };
        if let Some(path) = args.config.clone() {
            let hup = hangup_signal();
            tokio::spawn(reload_on_hangup(hup, target.clone(), path, overrides));
        }
        // The handlers are in place before systemd hears the target is ready.
        let stop = shutdown_signal();
        super::target_service::notify_ready();
        stop.await;
        super::target_service::notify_stopping();
        if let Some(control) = control {
            // Dropping the server removes the socket file.
            control.abort();
            let _ = control.await;
        }
        if let Some(nvme) = nvme {
            nvme.abort();
        }
        println!("ironsan: shutting down (asking initiators to log out)");
        target.shutdown(Duration::from_secs(2)).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), serving).await;
        if let Some(t) = trace {
            t.flush().context("writing the trace")?;
        }
        Ok(())
    })
}

/// What the command line changes in the configuration file's settings: applied to the file
/// at start and each time it is read again.
struct Overrides {
    portals: Vec<String>,
    error_recovery_level: Option<u8>,
}

impl Overrides {
    fn apply(&self, config: &mut Config) {
        if !self.portals.is_empty() {
            config.portals = self.portals.clone();
        }
        if let Some(level) = self.error_recovery_level {
            for t in &mut config.targets {
                t.error_recovery_level = level;
            }
        }
    }
}

/// On each SIGHUP, reads the configuration file again and applies the difference from the
/// running configuration ([`iscsi_target::Target::reconfigure`]), one log line per change.
/// A file that does not parse, or a configuration refused, changes nothing: one log line
/// says why (`file:line` for a parse error).
async fn reload_on_hangup(
    hup: Option<tokio::signal::unix::Signal>,
    target: std::sync::Arc<iscsi_target::Target>,
    path: std::path::PathBuf,
    overrides: Overrides,
) {
    let Some(mut hup) = hup else {
        tracing::warn!("no SIGHUP handler: the configuration cannot be reloaded");
        return;
    };
    while hup.recv().await.is_some() {
        let mut config = match Config::load(&path) {
            Ok(c) => c,
            Err(e) => {
                let why = e.0.replace('\n', " ");
                tracing::error!("reload refused, nothing changed: {why}");
                continue;
            }
        };
        overrides.apply(&mut config);
        let bound = match bind_new_portals(&target, &config).await {
            Ok(bound) => bound,
            Err(why) => {
                tracing::error!(
                    "reload of {} refused, nothing changed: {why}",
                    path.display()
                );
                continue;
            }
        };
        match target.reconfigure(config).await {
            Ok(changes) if changes.is_empty() && bound.is_empty() => {
                tracing::info!("reload of {}: no changes", path.display())
            }
            Ok(changes) => {
                for address in &bound {
                    tracing::info!("reload: portal tcp://{address}: added");
                }
                for change in changes {
                    tracing::info!("reload: {change}");
                }
            }
            Err(e) => {
                for address in &bound {
                    target.remove_portal(*address);
                }
                tracing::error!(
                    "reload of {} refused: {}",
                    path.display(),
                    e.replace('\n', " ")
                )
            }
        }
    }
}

/// Binds the tcp:// portals `config` lists and the target does not serve yet (a fixed port:
/// a file's port 0 is bound at start only), once `config` is known valid. All or none: a
/// portal that cannot be bound unbinds the others and says why.
async fn bind_new_portals(
    target: &std::sync::Arc<iscsi_target::Target>,
    config: &Config,
) -> Result<Vec<std::net::SocketAddr>, String> {
    use iscsi_target::PortalSpec;
    config.check("the file").map_err(|e| e.0)?;
    let running: Vec<PortalSpec> = target
        .running_config()
        .portals
        .iter()
        .filter_map(|p| PortalSpec::parse(p).ok())
        .collect();
    let new = config
        .portals
        .iter()
        .filter_map(|p| PortalSpec::parse(p).ok())
        .filter(|s| s.kind == datamover::TransportKind::Tcp && s.address.port() != 0)
        .filter(|s| !running.contains(s));
    let mut bound = Vec::new();
    for spec in new {
        match super::admin_server::bind_tcp_portal(target, spec).await {
            Ok(address) => bound.push(address),
            Err(why) => {
                for address in &bound {
                    target.remove_portal(*address);
                }
                return Err(why);
            }
        }
    }
    Ok(bound)
}

/// The SIGHUP handler, installed at the call (before systemd is told the target is ready,
/// so an early `systemctl reload` never kills it).
fn hangup_signal() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    signal(SignalKind::hangup()).ok()
}

/// SIGINT or SIGTERM, whichever comes first; the handlers are installed at the call.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}

/// A connection observer that samples each accepted socket's TCP_INFO and, when the
/// connection ends, writes the samples (CSV) and a cwnd + throughput plot (SVG).
fn tcp_info_recorder(
    dir: std::path::PathBuf,
    interval: Duration,
) -> iscsi_target::ConnectionObserver {
    use std::os::fd::BorrowedFd;
    use std::sync::atomic::{AtomicU64, Ordering};
    struct Recording {
        sampler: Option<lab::tcpinfo::TcpInfoSampler>,
        base: std::path::PathBuf,
    }
    impl Drop for Recording {
        fn drop(&mut self) {
            let Some(sampler) = self.sampler.take() else {
                return;
            };
            let samples = sampler.stop();
            let csv = analyze::tcpinfo::table(&samples).to_csv();
            let mut plot = analyze::tcpinfo::cwnd_plot(&samples);
            plot.series.push(report::Series::new(
                "throughput MB/s",
                analyze::tcpinfo::throughput(&samples),
            ));
            plot.title = format!("TCP_INFO of {}", self.base.display());
            for (ext, body) in [("csv", csv), ("svg", plot.to_svg())] {
                // Appended, not with_extension: the peer's address has dots in it.
                let mut path = self.base.clone().into_os_string();
                path.push(format!(".{ext}"));
                let path = std::path::PathBuf::from(path);
                if let Err(e) = std::fs::write(&path, body) {
                    tracing::warn!("cannot write {}: {e}", path.display());
                }
            }
        }
    }
    let next = AtomicU64::new(1);
    std::sync::Arc::new(move |socket: BorrowedFd<'_>, peer: std::net::SocketAddr| {
        let peer = peer.to_string().replace([':', '[', ']'], "_");
        let n = next.fetch_add(1, Ordering::Relaxed);
        match lab::tcpinfo::TcpInfoSampler::new(socket, interval) {
            Ok(sampler) => Some(Box::new(Recording {
                sampler: Some(sampler),
                base: dir.join(format!("conn-{n}-{peer}")),
            }) as Box<dyn Send>),
            Err(e) => {
                tracing::warn!("TCP_INFO sampling unavailable: {e}");
                None
            }
        }
    })
}

pub(crate) fn init_logging() {
    init_logging_or("info");
}

/// Logging to stderr at `IRONSAN_LOG`'s level, or `default_filter` without it.
pub(crate) fn init_logging_or(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("IRONSAN_LOG")
        .unwrap_or_else(|_| default_filter.into());
    // Colour only on a terminal: a log file, a pipe or the journal gets plain text, no
    // escape codes; the journal stamps each line, so ours are left out there.
    let (ansi, timestamps) = super::target_service::log_style();
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = if timestamps {
        fmt.try_init()
    } else {
        fmt.without_time().try_init()
    };
}
