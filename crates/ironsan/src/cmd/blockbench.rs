//! `ironsan bench URL`: the access generator. Keeps `--qd` commands of exactly `--size`
//! bytes outstanding per session and reports throughput, IOPS and latency percentiles.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use analyze::tcpinfo::{self, TcpSample};
use anyhow::{bail, Context};
use bench::workload::{self, Pattern, Progress, Rw, Step, Summary, Workload};
use indicatif::ProgressBar;
use iscsi_initiator::{IscsiUrl, Session};
use lab::tcpinfo::TcpInfoSampler;
use report::{Cell, LinePlot, Series, Table, TickLabels};

use super::initiator::LoginOpts;

/// Access generator options (`ironsan bench iscsi://HOST[:PORT]/TARGET-IQN/LUN ...`).
#[derive(clap::Args)]
#[command(after_help = SCRIPT_HELP)]
pub struct BlockBenchArgs {
    /// iscsi://[user%password@]HOST[:PORT][,HOST2[:PORT]...]/TARGET-IQN/LUN (several hosts: multipath),
    /// or nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID (--connections: I/O queues)
    pub url: Option<String>,
    /// read, write or mixed; a comma list runs each (e.g. read,write).
    #[arg(long, default_value = "read")]
    pub rw: String,
    /// Percentage of reads with --rw mixed.
    #[arg(long, default_value_t = 70)]
    pub mix: u8,
    /// seq or rand; a comma list runs each.
    #[arg(long, default_value = "seq")]
    pub pattern: String,
    /// Bytes per command: one size (128k), a doubling sweep (4k..16m), or a comma list of both.
    #[arg(long, default_value = "128k")]
    pub size: String,
    /// Commands outstanding per session.
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Sessions (each with --connections connections).
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
    /// Seconds per point (default 5 unless --count is given).
    #[arg(long, alias = "seconds")]
    pub duration: Option<f64>,
    /// Commands per point instead of a duration.
    #[arg(long)]
    pub count: Option<u64>,
    /// Write a pattern then read it back and compare (reads are checked against a pattern
    /// written first; writes are read back after the run).
    #[arg(long)]
    pub verify: bool,
    /// Bytes of the LUN to use from LBA 0 (default: all; 256 MiB with --verify).
    #[arg(long, value_parser = size)]
    pub span: Option<u64>,
    /// Write the results as JSON (to stdout without a file name).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Write the results as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Plot throughput versus transfer size (one line per configuration) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Run the steps of a script file instead (see below).
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Sample TCP_INFO (cwnd, ssthresh, rtt, retransmits, delivery rate, unacked...) of
    /// every connection while the run goes on and write the samples here as CSV.
    #[arg(long, value_name = "FILE.csv")]
    pub tcp_info: Option<PathBuf>,
    /// Milliseconds between TCP_INFO samples.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub tcp_info_interval_ms: u64,
    /// Plot cwnd and throughput over time from the TCP_INFO samples (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub tcp_info_plot: Option<PathBuf>,
    /// Seed of the random offsets and the verify pattern.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub login: LoginOpts,
}

const SCRIPT_HELP: &str = "\
Script files (--script FILE): one step per line, '#' starts a comment.
  login [URL]                           log in (to the command line's URL when none is given)
  repeat N read|write SIZE [seq|rand]   N commands of SIZE bytes, --qd outstanding
  logout                                log out
Each repeat step is one row of the result table.

Examples:
  ironsan bench iscsi://127.0.0.1/iqn.2026-11.org.ironsan:default/0 --rw read --size 128k --qd 32
  ironsan bench URL --rw read,write --size 4k..16m --duration 2 --plot tput.svg --json r.json
  ironsan bench URL --rw write --verify --count 1000";

fn size(s: &str) -> Result<u64, String> {
    report::parse_size(s).map_err(|e| e.to_string())
}

/// Transfer sizes from `--size`: a comma list of sizes (4k) and doubling sweeps (4k..1m),
/// in the order given.
pub(crate) fn sizes(s: &str) -> anyhow::Result<Vec<u32>> {
    let parse = |v: &str| -> anyhow::Result<u32> {
        let n = report::parse_size(v).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
        if n == 0 || n > 16 << 20 {
            bail!("--size {v}: transfer sizes go from 512 B to 16 MiB");
        }
        Ok(n as u32)
    };
    let mut v = Vec::new();
    for item in s.split(',').map(str::trim) {
        match item.split_once("..") {
            None => v.push(parse(item)?),
            Some((a, b)) => {
                let (mut lo, hi) = (parse(a)?, parse(b)?);
                if lo > hi {
                    bail!("--size {item}: the sweep must go up");
                }
                while lo <= hi && v.len() < 64 {
                    v.push(lo);
                    lo = lo.saturating_mul(2);
                }
            }
        }
        if v.len() >= 64 {
            bail!("--size {s}: at most 64 sizes");
        }
    }
    Ok(v)
}

pub(super) fn rws(a: &BlockBenchArgs) -> anyhow::Result<Vec<Rw>> {
    if a.mix > 100 {
        bail!("--mix is a percentage 0..100");
    }
    a.rw.split(',')
        .map(|r| match r.trim() {
            "read" => Ok(Rw::Read),
            "write" => Ok(Rw::Write),
            "mixed" => Ok(Rw::Mixed { read_pct: a.mix }),
            o => bail!("--rw {o:?}: expected read, write or mixed"),
        })
        .collect()
}

pub(super) fn patterns(a: &BlockBenchArgs) -> anyhow::Result<Vec<Pattern>> {
    a.pattern
        .split(',')
        .map(|p| match p.trim() {
            "seq" => Ok(Pattern::Seq),
            "rand" => Ok(Pattern::Rand),
            o => bail!("--pattern {o:?}: expected seq or rand"),
        })
        .collect()
}

fn table(rows: &[Summary]) -> Table {
    let mut t = Table::new([
        "size", "rw", "pattern", "qd", "sessions", "conns", "ops", "seconds", "MB/s", "IOPS",
        "p50 us", "p99 us", "max us",
    ]);
    for r in rows {
        t.push_row([
            Cell::from(report::format_size(r.size as u64)),
            Cell::from(r.rw.clone()),
            Cell::from(r.pattern.clone()),
            Cell::from(r.qd),
            Cell::from(r.sessions),
            Cell::from(r.connections),
            Cell::from(r.ops),
            Cell::float(r.seconds, 2),
            Cell::float(r.mb_per_s, 1),
            Cell::float(r.iops, 0),
            Cell::float(r.lat_p50_us, 1),
            Cell::float(r.lat_p99_us, 1),
            Cell::float(r.lat_max_us, 1),
        ]);
    }
    t
}

fn point_json(r: &Summary) -> serde_json::Value {
    serde_json::json!({
        "size": r.size, "rw": r.rw, "pattern": r.pattern, "qd": r.qd,
        "sessions": r.sessions, "connections": r.connections, "ops": r.ops,
        "reads": r.reads, "writes": r.writes, "bytes": r.bytes, "seconds": r.seconds,
        "mb_per_s": r.mb_per_s, "iops": r.iops,
        "latency_us": { "p50": r.lat_p50_us, "p99": r.lat_p99_us, "max": r.lat_max_us },
        "lat_p50_us": r.lat_p50_us, "lat_p99_us": r.lat_p99_us, "lat_max_us": r.lat_max_us,
        "verified_bytes": r.verified_bytes,
        "recovery": {
            "data_snacks": r.recovery.data_snacks,
            "r2t_snacks": r.recovery.r2t_snacks,
            "status_snacks": r.recovery.status_snacks,
            "header_digest_discards": r.recovery.header_digest_discards,
            "data_acks": r.recovery.data_acks,
            "r_data_snacks": r.recovery.r_data_snacks,
            "data_out_rejects": r.recovery.data_out_rejects,
            "command_retries": r.recovery.command_retries,
            "lost_commands": r.recovery.lost_commands,
            "reinstatements": r.recovery.reinstatements,
            "connection_recoveries": r.recovery.connection_recoveries,
            "task_reassigns": r.recovery.task_reassigns,
            "reissued_commands": r.recovery.reissued_commands,
        },
        "write_registrations": {
            "hits": r.write_registrations.hits,
            "misses": r.write_registrations.misses,
        },
    })
}

/// One object: the first point's fields at the top level (so a single run reads as
/// `.mb_per_s`), and every point under `points`.
fn results_json(rows: &[Summary]) -> String {
    let mut top = rows
        .first()
        .map(point_json)
        .unwrap_or_else(|| serde_json::json!({}));
    top["points"] = serde_json::Value::Array(rows.iter().map(point_json).collect());
    serde_json::to_string_pretty(&top).expect("json") + "\n"
}

fn series_name(r: &Summary) -> String {
    format!(
        "{} {} qd{} {}x{}c",
        r.rw, r.pattern, r.qd, r.sessions, r.connections
    )
}

fn plot(rows: &[Summary]) -> String {
    let mut series: Vec<Series> = Vec::new();
    for r in rows {
        let name = series_name(r);
        let p = (r.size as f64, r.mb_per_s);
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(p),
            None => series.push(Series::new(name, vec![p])),
        }
    }
    LinePlot {
        title: "ironsan bench: throughput vs transfer size".into(),
        x_label: "transfer size".into(),
        y_label: "MB/s".into(),
        x_log2: true,
        y_log: false,
        x_ticks: TickLabels::Bytes,
        y_ticks: TickLabels::Number,
        series,
    }
    .to_svg()
}

/// Writes a report file, naming it in the error.
pub(crate) fn write_file(p: &PathBuf, text: &str) -> anyhow::Result<()> {
    std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))
}

/// Shows the running point's rates as `bar`'s message, every second, while it runs (nothing
/// when the bar is hidden: stderr is not a terminal).
fn progress_ticker(
    progress: Arc<Progress>,
    label: String,
    bar: &ProgressBar,
) -> Option<tokio::task::JoinHandle<()>> {
    if bar.is_hidden() {
        return None;
    }
    bar.set_message(label.clone());
    let bar = bar.clone();
    Some(tokio::spawn(async move {
        let start = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let secs = start.elapsed().as_secs_f64();
            let ops = progress.ops.load(Ordering::Relaxed);
            let bytes = progress.bytes.load(Ordering::Relaxed);
            bar.set_message(format!(
                "{label}: {:>9.1} MB/s {:>9.0} IOPS  {:>5.0} s",
                bytes as f64 / secs / 1e6,
                ops as f64 / secs,
                secs
            ));
        }
    }))
}

async fn connect_all(
    url: &IscsiUrl,
    login: &LoginOpts,
    n: usize,
) -> anyhow::Result<Vec<Arc<Session>>> {
    let cfg = login.config(url)?;
    let mut v = Vec::new();
    for _ in 0..n.max(1) {
        v.push(Arc::new(
            transports::connect_session(url, cfg.clone()).await?,
        ));
    }
    Ok(v)
}

async fn logout_all(sessions: Vec<Arc<Session>>) {
    for s in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            let _ = s.logout().await;
        }
    }
}

/// Runs one point; `bar` (the sweep's) shows its rates meanwhile and counts it when done.
async fn measure(
    sessions: &[Arc<Session>],
    w: &Workload,
    bar: &ProgressBar,
) -> anyhow::Result<Summary> {
    let s = &sessions[0];
    let lun = s.default_lun();
    s.test_unit_ready(lun).await?;
    let cap = s.capacity(lun).await?;
    measure_on(sessions, lun, cap, w, bar).await
}

/// [`measure`] on any [`workload::BlockDevice`] of known capacity.
pub(crate) async fn measure_on<D: workload::BlockDevice>(
    sessions: &[Arc<D>],
    lun: u16,
    cap: iscsi_initiator::scsi::Capacity,
    w: &Workload,
    bar: &ProgressBar,
) -> anyhow::Result<Summary> {
    let progress = Arc::new(Progress::default());
    let label = format!(
        "{} {} {}",
        w.rw.label(),
        w.pattern.label(),
        report::format_size(w.size as u64)
    );
    let ticker = progress_ticker(progress.clone(), label, bar);
    let r = workload::run(sessions, lun, cap, w, progress).await;
    if let Some(t) = ticker {
        t.abort();
    }
    bar.inc(1);
    Ok(r?)
}

/// One TCP_INFO sampler per connection of every session, named `s<session>c<connection>`.
fn start_tcp_info(
    a: &BlockBenchArgs,
    sessions: &[Arc<Session>],
) -> anyhow::Result<Vec<(String, TcpInfoSampler)>> {
    if a.tcp_info.is_none() && a.tcp_info_plot.is_none() {
        return Ok(Vec::new());
    }
    let every = Duration::from_millis(a.tcp_info_interval_ms.max(1));
    let mut v = Vec::new();
    for (si, s) in sessions.iter().enumerate() {
        for (ci, fd) in s.connection_sockets().iter().enumerate() {
            let sampler = TcpInfoSampler::new(fd.as_fd(), every).context("sampling TCP_INFO")?;
            v.push((format!("s{si}c{ci}"), sampler));
        }
    }
    Ok(v)
}

fn finish_tcp_info(
    a: &BlockBenchArgs,
    samplers: Vec<(String, TcpInfoSampler)>,
) -> anyhow::Result<()> {
    if samplers.is_empty() {
        return Ok(());
    }
    let named: Vec<(String, Vec<TcpSample>)> =
        samplers.into_iter().map(|(n, s)| (n, s.stop())).collect();
    if let Some(p) = &a.tcp_info {
        write_file(p, &tcpinfo::table_named(&named).to_csv())?;
    }
    if let Some(p) = &a.tcp_info_plot {
        write_file(p, &tcpinfo::cwnd_throughput_svg(&named))?;
    }
    Ok(())
}

pub fn run(a: BlockBenchArgs) -> anyhow::Result<()> {
    if a.script.is_some() && (a.tcp_info.is_some() || a.tcp_info_plot.is_some()) {
        bail!("--tcp-info samples the connections of a URL run, not of a --script");
    }
    let rt = super::initiator::runtime()?;
    let rows = match &a.script {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let steps = workload::parse_script(&text).map_err(anyhow::Error::msg)?;
            super::initiator::block_on_interruptible(&rt, run_script(&a, steps))
        }
        None => {
            let Some(u) = &a.url else {
                bail!("give an iscsi:// URL (or --script FILE); see ironsan bench --help");
            };
            let url = IscsiUrl::parse_lun(u)?;
            let sizes = sizes(&a.size)?;
            let rws = rws(&a)?;
            let pats = patterns(&a)?;
            let duration = match (a.duration, a.count) {
                (Some(d), _) if d > 0.0 => Some(Duration::from_secs_f64(d)),
                (Some(_), _) => bail!("--duration must be positive"),
                (None, Some(_)) => None,
                (None, None) => Some(Duration::from_secs(5)),
            };
            super::initiator::block_on_interruptible(&rt, async {
                let sessions = connect_all(&url, &a.login, a.sessions).await?;
                let samplers = start_tcp_info(&a, &sessions)?;
                let mut rows = Vec::new();
                let points = rws.len() * pats.len() * sizes.len();
                let bar = super::progress::steps(points as u64, "bench");
                for &rw in &rws {
                    for &pattern in &pats {
                        for &size in &sizes {
                            let w = Workload {
                                rw,
                                pattern,
                                size,
                                qd: a.qd.max(1),
                                duration,
                                count: a.count,
                                span: a.span.or(a.verify.then_some(256 << 20)),
                                verify: a.verify,
                                seed: a.seed,
                            };
                            rows.push(measure(&sessions, &w, &bar).await?);
                        }
                    }
                }
                bar.finish_and_clear();
                finish_tcp_info(&a, samplers)?;
                logout_all(sessions).await;
                anyhow::Ok(rows)
            })
        }
    };
    drop(rt);
    a.login.finish_trace()?;
    report_rows(&a, rows?)
}

/// Prints the table of `rows` (stdout, or stderr when the JSON goes to stdout) and writes
/// the JSON, CSV and plot files `a` names.
pub(super) fn report_rows(a: &BlockBenchArgs, rows: Vec<Summary>) -> anyhow::Result<()> {
    // With the JSON on stdout, stdout carries nothing else (a script parses it): the table
    // and the verify line go to stderr.
    let json_to_stdout = a.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let mut text = table(&rows).to_string();
    if a.verify {
        let v: u64 = rows.iter().map(|r| r.verified_bytes).sum();
        text.push_str(&format!(
            "verified: {} read back and compared, no difference\n",
            report::format_size(v)
        ));
    }
    if json_to_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(p) = &a.json {
        let j = results_json(&rows);
        if p.as_os_str() == "-" {
            print!("{j}");
        } else {
            write_file(p, &j)?;
        }
    }
    if let Some(p) = &a.csv {
        write_file(p, &table(&rows).to_csv())?;
    }
    if let Some(p) = &a.plot {
        write_file(p, &plot(&rows))?;
    }
    Ok(())
}

async fn run_script(a: &BlockBenchArgs, steps: Vec<Step>) -> anyhow::Result<Vec<Summary>> {
    let mut sessions: Option<Vec<Arc<Session>>> = None;
    let mut rows = Vec::new();
    let bar = super::progress::steps(steps.len() as u64, "script");
    for step in steps {
        match step {
            Step::Login(u) => {
                let u = u
                    .or_else(|| a.url.clone())
                    .context("script: login needs a URL")?;
                let url = IscsiUrl::parse_lun(&u)?;
                if let Some(old) = sessions.take() {
                    logout_all(old).await;
                }
                sessions = Some(connect_all(&url, &a.login, a.sessions).await?);
            }
            Step::Repeat {
                count,
                write,
                size,
                pattern,
            } => {
                let s = sessions.as_ref().context("script: repeat before login")?;
                if size == 0 || size > 16 << 20 {
                    bail!("script: size {size} is outside 512 B..16 MiB");
                }
                let w = Workload {
                    rw: if write { Rw::Write } else { Rw::Read },
                    pattern,
                    size: size as u32,
                    qd: a.qd.max(1),
                    duration: None,
                    count: Some(count),
                    span: a.span,
                    verify: false,
                    seed: a.seed,
                };
                rows.push(measure(s, &w, &bar).await?);
            }
            Step::Logout => {
                if let Some(old) = sessions.take() {
                    logout_all(old).await;
                }
            }
        }
    }
    bar.finish_and_clear();
    if let Some(old) = sessions.take() {
        logout_all(old).await;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::sizes;

    #[test]
    fn sizes_are_single_sweeps_or_comma_lists() {
        assert_eq!(sizes("128k").unwrap(), vec![128 << 10]);
        assert_eq!(sizes("4k..16k").unwrap(), vec![4096, 8192, 16384]);
        assert_eq!(
            sizes("4k,128k, 1m").unwrap(),
            vec![4096, 128 << 10, 1 << 20]
        );
        assert_eq!(sizes("512,4k..8k").unwrap(), vec![512, 4096, 8192]);
        assert!(sizes("16k..4k").is_err());
        assert!(sizes("32m").is_err());
        assert!(sizes("4k,,8k").is_err());
    }
}
