//! `ironsan delay-proxy` (a loopback TCP relay adding one-way delay, a rate limit,
//! optionally one lost segment, and faults at chosen PDUs: cut, stall, drop, corrupt) and `ironsan delay-experiment` (the long-delay sweep of
//! sequential one-outstanding commands against the model B / (k·d + B/R)).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use lab::experiment::{self, ExperimentConfig, Op};
use lab::fault::Fault;
use lab::proxy::{DelayProxy, Direction, DropSegment, ProxyConfig};

#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3261")]
    pub listen: SocketAddr,
    /// Address to relay to.
    #[arg(long, default_value = "127.0.0.1:3260")]
    pub upstream: SocketAddr,
    /// One-way delay added in each direction, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Link rate per direction in Mbit/s (default: unlimited).
    #[arg(long)]
    pub rate_mbit: Option<f64>,
    /// Bytes in flight per direction before the proxy stops reading.
    #[arg(long, default_value_t = 64 << 20)]
    pub buffer: usize,
    /// Drop the Nth data segment of the first connection (needs root and iptables-legacy;
    /// run it in a private network namespace).
    #[arg(long)]
    pub drop_nth: Option<u32>,
    /// Direction of the dropped segment: "down" (target to initiator) or "up".
    #[arg(long, default_value = "down")]
    pub drop_dir: String,
    /// Inject a fault (repeatable): DIR:POINT:ACTION[:conn=N], e.g.
    /// down:data-in#3:corrupt=data+100 (flip byte 100 of the 3rd Data-In's data),
    /// up:data-out#2:reset (cut the connection there), down:nop-in#1:stall=30,
    /// up:byte=1000000:reset, down:scsi-resp#1:drop:conn=1 (the second connection).
    #[arg(long = "fault", value_parser = parse_fault)]
    pub faults: Vec<Fault>,
    /// Exit after this many seconds (default: run until killed).
    #[arg(long)]
    pub duration_s: Option<f64>,
}

fn parse_fault(s: &str) -> Result<Fault, String> {
    s.parse()
}

pub fn run_proxy(args: ProxyArgs) -> anyhow::Result<()> {
    let mut cfg = ProxyConfig::new(
        args.listen,
        args.upstream,
        Duration::from_secs_f64(args.delay_ms / 1e3),
    );
    cfg.rate = args.rate_mbit.map(|m| m * 1e6 / 8.0);
    cfg.buffer = args.buffer;
    cfg.faults = args.faults.clone();
    if let Some(nth) = args.drop_nth {
        let direction = match args.drop_dir.as_str() {
            "down" => Direction::Down,
            "up" => Direction::Up,
            other => bail!("--drop-dir must be up or down, not {other}"),
        };
        cfg.drop_segment = Some(DropSegment { direction, nth });
    }
    let proxy = DelayProxy::start(cfg).context("starting the delay proxy")?;
    eprintln!(
        "delay-proxy: {} -> {} delay {} ms{}",
        proxy.local_addr(),
        args.upstream,
        args.delay_ms,
        if args.faults.is_empty() {
            String::new()
        } else {
            format!(", {} fault(s)", args.faults.len())
        }
    );
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if args
            .duration_s
            .is_some_and(|d| start.elapsed().as_secs_f64() >= d)
        {
            return Ok(());
        }
    }
}

#[derive(Args, Debug)]
pub struct ExperimentArgs {
    /// The iSCSI target: HOST:PORT (with --target-name), an iscsi://HOST[:PORT]/IQN/LUN URL,
    /// or `ironsan` to start an ironsan target (a 256 MiB RAM LUN) for the run. The
    /// experiment puts its own proxy in front of it.
    #[arg(long, default_value = "127.0.0.1:3260")]
    pub target: String,
    /// Target IQN (with --target HOST:PORT).
    #[arg(long)]
    pub target_name: Option<String>,
    /// LUN (default: the URL's; 1 with HOST:PORT, tgtd's first LUN; 0 with ironsan).
    #[arg(long)]
    pub lun: Option<u16>,
    /// One-way delays, ms.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.0, 1.0, 2.0, 4.0, 8.0, 16.0])]
    pub delays_ms: Vec<f64>,
    /// Block sizes.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["32k".to_string(), "128k".into(), "512k".into(), "1m".into(), "4m".into()])]
    pub sizes: Vec<String>,
    /// Operations: read, write.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["read".to_string(), "write".into()])]
    pub ops: Vec<String>,
    /// Link rate per direction, Mbit/s (0: unlimited).
    #[arg(long, default_value_t = 100.0)]
    pub rate_mbit: f64,
    /// Measuring time per point, ms.
    #[arg(long, default_value_t = 1000)]
    pub duration_ms: u64,
    #[arg(long, default_value_t = 3)]
    pub min_commands: u32,
    /// Write the throughput-vs-delay plot (SVG) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the table as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print JSON instead of the text table.
    #[arg(long)]
    pub json: bool,
}

pub fn run_experiment(args: ExperimentArgs) -> anyhow::Result<()> {
    let block_sizes = args
        .sizes
        .iter()
        .map(|s| report::parse_size(s).map(|v| v as u32))
        .collect::<Result<Vec<_>, _>>()
        .context("--sizes")?;
    let ops = args
        .ops
        .iter()
        .map(|o| match o.as_str() {
            "read" => Ok(Op::Read),
            "write" => Ok(Op::Write),
            other => bail!("unknown op {other}"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (target, target_name, lun, _child) = resolve_target(&args)?;
    let cfg = ExperimentConfig {
        target,
        target_name,
        lun,
        delays_ms: args.delays_ms.clone(),
        block_sizes,
        ops,
        rate: (args.rate_mbit > 0.0).then_some(args.rate_mbit * 1e6 / 8.0),
        duration: Duration::from_millis(args.duration_ms),
        min_commands: args.min_commands,
    };
    let points = experiment::run(&cfg, |p| {
        eprintln!(
            "{:?} delay {} ms block {}: {:.3} MB/s (model {:.3})",
            p.op, p.delay_ms, p.block, p.measured_mbps, p.model_mbps
        )
    })?;
    let table = experiment::table(&points);
    if let Some(path) = &args.csv {
        std::fs::write(path, table.to_csv())?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, experiment::plot(&points).to_svg())?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&points)?);
    } else {
        println!("{table}");
    }
    Ok(())
}

/// An ironsan target run as a child process for the experiment; killed on drop.
struct ChildTarget {
    child: std::process::Child,
    dir: PathBuf,
}

impl Drop for ChildTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const CHILD_IQN: &str = "iqn.2026-11.org.ironsan:delay-experiment";

/// Starts `ironsan target` (this binary) on a free loopback port and waits until it listens.
fn start_ironsan_target() -> anyhow::Result<(SocketAddr, ChildTarget)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let dir = std::env::temp_dir().join(format!("ironsan-delay-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"{addr}\"]\n[[target]]\nname = \"{CHILD_IQN}\"\n\
             [target.lun.0]\nsize = \"256MiB\"\nbackend = \"memory\"\n"
        ),
    )?;
    let child = std::process::Command::new(std::env::current_exe()?)
        .arg("target")
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting ironsan target")?;
    let mut guard = ChildTarget { child, dir };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok((addr, guard));
        }
        if let Some(status) = guard.child.try_wait()? {
            bail!("ironsan target exited ({status}) before listening on {addr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("ironsan target did not listen on {addr} within 20 s")
}

/// The portal, IQN and LUN to measure, and the child target to keep alive meanwhile.
fn resolve_target(
    args: &ExperimentArgs,
) -> anyhow::Result<(SocketAddr, String, u16, Option<ChildTarget>)> {
    if args.target == "ironsan" {
        let (addr, child) = start_ironsan_target()?;
        return Ok((
            addr,
            CHILD_IQN.to_string(),
            args.lun.unwrap_or(0),
            Some(child),
        ));
    }
    if args.target.starts_with("iscsi://") {
        let url = iscsi_initiator::IscsiUrl::parse_lun(&args.target)?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&url.host_port())?
            .next()
            .with_context(|| format!("{} resolves to no address", url.host_port()))?;
        let name = url.target.clone().context("the URL names no target")?;
        return Ok((addr, name, args.lun.or(url.lun).unwrap_or(0), None));
    }
    let addr: SocketAddr = args.target.parse().with_context(|| {
        format!(
            "--target {}: expected HOST:PORT, a URL or ironsan",
            args.target
        )
    })?;
    let name = args
        .target_name
        .clone()
        .context("--target HOST:PORT needs --target-name IQN")?;
    Ok((addr, name, args.lun.unwrap_or(1), None))
}
