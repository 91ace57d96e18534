//! `ironsan soak URL`: many sessions of mixed, verified I/O for a long time against any
//! target, sampling the target process's memory and descriptors; reports errors, verify
//! mismatches, throughput over time and memory growth.
//!
//! Every session runs `--qd` workers, and each worker owns a slot of the LUN no other worker
//! touches, so what it reads back is exactly what it wrote last: each 4 KiB unit holds the
//! bench's verify pattern for its place and the generation of its last write
//! (`bench::workload::{fill_pattern, generation_seed}`), and the worker keeps the
//! generation of each unit it wrote. Units not yet written in this run are read but not checked.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bench::workload::{fill_pattern, generation_seed, Rng};
use bytes::Bytes;
use iscsi_initiator::{IscsiUrl, Session};
use report::{Cell, LinePlot, Series, Table, TickLabels};

use super::initiator::LoginOpts;

/// The unit of verification (and alignment of every command).
const UNIT: usize = 4096;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// iscsi://HOST[:PORT]/TARGET-IQN/LUN or iser://...
    pub url: String,
    /// Sessions at once.
    #[arg(long, default_value_t = 64)]
    pub sessions: usize,
    /// Commands outstanding per session (a worker each, with a slot of the LUN of its own).
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 600.0)]
    pub duration: f64,
    /// Percentage of commands that are reads (the rest are writes).
    #[arg(long, default_value_t = 50)]
    pub mix: u8,
    /// Largest command; sizes are 4 KiB multiples from 4 KiB up to this.
    #[arg(long, default_value = "64k")]
    pub max_size: String,
    /// Bytes of the LUN to use from LBA 0 (default: all of it, at most 1 GiB).
    #[arg(long)]
    pub span: Option<String>,
    /// The target's process id: its resident memory and open descriptors are sampled.
    #[arg(long)]
    pub target_pid: Option<u32>,
    /// Seconds between samples.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Seed of sizes, offsets and data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the samples and the summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the samples as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Plot throughput and the target's memory over time (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<PathBuf>,
    #[command(flatten)]
    pub login: LoginOpts,
}

/// What every worker adds to.
#[derive(Default)]
struct Counters {
    commands: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
    verified_units: AtomicU64,
}

/// One sample of the run.
#[derive(Debug, Clone)]
struct Sample {
    secs: f64,
    mb_per_s: f64,
    iops: f64,
    errors: u64,
    mismatches: u64,
    target_rss_mib: Option<f64>,
    target_fds: Option<u64>,
}

/// A worker's slot: `units` 4 KiB units from `first_lba`, and the generation of each.
struct Slot {
    worker: u64,
    first_byte: u64,
    generations: Vec<u32>,
}

pub fn run(a: SoakArgs) -> anyhow::Result<()> {
    let url: IscsiUrl = IscsiUrl::parse_lun(&a.url).context("the URL")?;
    if a.sessions == 0 || a.qd == 0 || a.duration <= 0.0 || a.interval <= 0.0 || a.mix > 100 {
        bail!("--sessions, --qd, --duration and --interval must be positive, --mix 0 to 100");
    }
    let max_size = report::parse_size(&a.max_size)
        .map_err(|e| anyhow::anyhow!("--max-size {:?}: {e:?}", a.max_size))?;
    if max_size < UNIT as u64 || !max_size.is_multiple_of(UNIT as u64) {
        bail!("--max-size {}: say a multiple of 4 KiB", a.max_size);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let outcome = rt.block_on(soak(&a, &url, max_size as usize));
    drop(rt);
    a.login.finish_trace()?;
    let (samples, counters) = outcome?;
    report_run(&a, &samples, &counters)
}

async fn soak(
    a: &SoakArgs,
    url: &IscsiUrl,
    max_size: usize,
) -> anyhow::Result<(Vec<Sample>, Arc<Counters>)> {
    let cfg = a.login.config(url)?;
    let mut sessions = Vec::with_capacity(a.sessions);
    for i in 0..a.sessions {
        let s = transports::connect_session(url, cfg.clone())
            .await
            .with_context(|| format!("logging in session {} of {}", i + 1, a.sessions))?;
        sessions.push(Arc::new(s));
    }
    let lun = sessions[0].default_lun();
    let cap = sessions[0].capacity(lun).await?;
    let block_size = cap.block_size;
    if block_size as usize > UNIT || !UNIT.is_multiple_of(block_size as usize) {
        bail!("block size {block_size}: soak needs blocks that divide 4 KiB");
    }
    let span = match &a.span {
        Some(s) => report::parse_size(s).map_err(|e| anyhow::anyhow!("--span {s:?}: {e:?}"))?,
        None => cap.bytes().min(1 << 30),
    }
    .min(cap.bytes());
    let workers = (a.sessions * a.qd) as u64;
    let slot_units = span / workers / UNIT as u64;
    if slot_units * (UNIT as u64) < max_size as u64 {
        bail!(
            "a span of {} shared by {workers} workers leaves each {} (less than --max-size {}): use a larger LUN or --span, or fewer sessions or --qd",
            report::format_size(span),
            report::format_size(slot_units * UNIT as u64),
            report::format_size(max_size as u64)
        );
    }
    eprintln!(
        "soak: {} sessions x QD {} on {}, {} s, {}% reads, 4 KiB..{}, {} per worker",
        a.sessions,
        a.qd,
        a.url,
        a.duration,
        a.mix,
        report::format_size(max_size as u64),
        report::format_size(slot_units * UNIT as u64)
    );
    let counters = Arc::new(Counters::default());
    let deadline = Instant::now() + Duration::from_secs_f64(a.duration);
    let mut tasks = Vec::new();
    for (si, s) in sessions.iter().enumerate() {
        for q in 0..a.qd {
            let worker = (si * a.qd + q) as u64;
            let slot = Slot {
                worker,
                first_byte: worker * slot_units * UNIT as u64,
                generations: vec![0; slot_units as usize],
            };
            let w = Worker {
                session: s.clone(),
                lun,
                block_size,
                max_units: max_size / UNIT,
                mix: a.mix,
                seed: a.seed,
                counters: counters.clone(),
                deadline,
            };
            tasks.push(tokio::spawn(w.run(slot)));
        }
    }
    let samples = sample_until(a, &counters, deadline).await;
    for t in tasks {
        let _ = t.await;
    }
    for s in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            let _ = s.logout().await;
        }
    }
    Ok((samples, counters))
}

struct Worker {
    session: Arc<Session>,
    lun: u16,
    block_size: u32,
    max_units: usize,
    mix: u8,
    seed: u64,
    counters: Arc<Counters>,
    deadline: Instant,
}

impl Worker {
    async fn run(self, mut slot: Slot) {
        let mut rng = Rng((self.seed ^ slot.worker.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
        while Instant::now() < self.deadline {
            let units = 1 + (rng.next_u64() as usize) % self.max_units;
            let first = (rng.next_u64() as usize) % (slot.generations.len() - units + 1);
            let lba = (slot.first_byte + (first * UNIT) as u64) / self.block_size as u64;
            let read = (rng.next_u64() % 100) < self.mix as u64;
            let ok = if read {
                self.read_and_check(&slot, lba, first, units).await
            } else {
                self.write(&mut slot, lba, first, units).await
            };
            if !ok {
                // A failed command is counted once; the session is likely gone, so stop
                // rather than count the same failure thousands of times.
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
            self.counters.commands.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes
                .fetch_add((units * UNIT) as u64, Ordering::Relaxed);
        }
    }

    /// Unit `u` of `slot` as its `generation`-th write leaves it: the bench's verify pattern
    /// for that place on the LUN (its first 8 bytes name the unit), seeded by the generation.
    fn fill_unit(&self, unit: &mut [u8], slot: &Slot, u: usize, generation: u32) {
        let place = slot.first_byte / UNIT as u64 + u as u64;
        let seed = generation_seed(self.seed, u64::from(generation));
        fill_pattern(unit, place, UNIT as u32, seed);
    }

    async fn write(&self, slot: &mut Slot, lba: u64, first: usize, units: usize) -> bool {
        let mut data = vec![0u8; units * UNIT];
        for (k, unit) in data.chunks_mut(UNIT).enumerate() {
            let u = first + k;
            self.fill_unit(unit, slot, u, slot.generations[u] + 1);
        }
        match self
            .session
            .write(self.lun, lba, self.block_size, Bytes::from(data))
            .await
        {
            Ok(()) => {
                for g in &mut slot.generations[first..first + units] {
                    *g += 1;
                }
                true
            }
            Err(e) => {
                tracing::warn!(worker = slot.worker, lba, "write failed: {e}");
                false
            }
        }
    }

    async fn read_and_check(&self, slot: &Slot, lba: u64, first: usize, units: usize) -> bool {
        let blocks = (units * UNIT / self.block_size as usize) as u32;
        let data = match self
            .session
            .read(self.lun, lba, blocks, self.block_size)
            .await
        {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(worker = slot.worker, lba, "read failed: {e}");
                return false;
            }
        };
        let mut want = [0u8; UNIT];
        for (k, got) in data.chunks(UNIT).enumerate() {
            let u = first + k;
            let generation = slot.generations[u];
            if generation == 0 {
                continue; // not written in this run: anything goes
            }
            self.counters.verified_units.fetch_add(1, Ordering::Relaxed);
            self.fill_unit(&mut want, slot, u, generation);
            if got != want {
                let n = self.counters.mismatches.fetch_add(1, Ordering::Relaxed);
                if n < 10 {
                    tracing::error!(
                        worker = slot.worker,
                        byte = slot.first_byte + (u * UNIT) as u64,
                        generation,
                        "read back differs from what was last written"
                    );
                }
            }
        }
        true
    }
}

/// Samples the counters (and the target process) every `--interval` until `deadline`.
async fn sample_until(a: &SoakArgs, c: &Counters, deadline: Instant) -> Vec<Sample> {
    let start = Instant::now();
    let every = Duration::from_secs_f64(a.interval);
    let mut samples = Vec::new();
    let (mut last_bytes, mut last_cmds, mut last_at) = (0u64, 0u64, start);
    let mut next_line = start + Duration::from_secs(10);
    let bar = super::progress::steps(a.duration.ceil() as u64, "soak s");
    while Instant::now() < deadline {
        tokio::time::sleep(every.min(deadline.saturating_duration_since(Instant::now()))).await;
        let now = Instant::now();
        let (bytes, cmds) = (
            c.bytes.load(Ordering::Relaxed),
            c.commands.load(Ordering::Relaxed),
        );
        let dt = now.duration_since(last_at).as_secs_f64().max(1e-9);
        let (rss, fds) = a.target_pid.map(process_usage).unwrap_or((None, None));
        let s = Sample {
            secs: now.duration_since(start).as_secs_f64(),
            mb_per_s: (bytes - last_bytes) as f64 / 1e6 / dt,
            iops: (cmds - last_cmds) as f64 / dt,
            errors: c.errors.load(Ordering::Relaxed),
            mismatches: c.mismatches.load(Ordering::Relaxed),
            target_rss_mib: rss,
            target_fds: fds,
        };
        bar.set_position(s.secs as u64);
        bar.set_message(format!("{:.1} MB/s, errors {}", s.mb_per_s, s.errors));
        if now >= next_line {
            bar.suspend(|| {
                eprintln!(
                    "soak: {:>6.0} s  {:>8.1} MB/s  {:>8.0} IOPS  errors {}  mismatches {}{}",
                    s.secs,
                    s.mb_per_s,
                    s.iops,
                    s.errors,
                    s.mismatches,
                    s.target_rss_mib
                        .map(|r| format!("  target RSS {r:.1} MiB"))
                        .unwrap_or_default()
                )
            });
            next_line = now + Duration::from_secs(10);
        }
        samples.push(s);
        (last_bytes, last_cmds, last_at) = (bytes, cmds, now);
    }
    bar.finish_and_clear();
    samples
}

/// Resident memory (MiB) and open descriptors of process `pid`, from /proc.
fn process_usage(pid: u32) -> (Option<f64>, Option<u64>) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count() as u64);
    (rss, fds)
}

/// The summary: totals, and the target's memory after warm-up (a fifth of the run) and at
/// the end.
fn summary(a: &SoakArgs, samples: &[Sample], c: &Counters) -> Table {
    let secs = samples.last().map_or(0.0, |s| s.secs).max(1e-9);
    let bytes = c.bytes.load(Ordering::Relaxed);
    let warm = samples.iter().find(|s| s.secs >= secs / 5.0);
    let end = samples.last();
    let rss = |s: Option<&Sample>| s.and_then(|s| s.target_rss_mib);
    let fds = |s: Option<&Sample>| s.and_then(|s| s.target_fds);
    let mut t = Table::new(["measure", "value"]);
    let mut row = |k: &str, v: Cell| t.push_row([Cell::Text(k.into()), v]);
    row(
        "sessions x QD",
        Cell::Text(format!("{} x {}", a.sessions, a.qd)),
    );
    row("seconds", Cell::float(secs, 1));
    row(
        "commands",
        Cell::Int(c.commands.load(Ordering::Relaxed) as i64),
    );
    row("MB/s", Cell::float(bytes as f64 / 1e6 / secs, 1));
    row(
        "units verified",
        Cell::Int(c.verified_units.load(Ordering::Relaxed) as i64),
    );
    row("errors", Cell::Int(c.errors.load(Ordering::Relaxed) as i64));
    row(
        "verify mismatches",
        Cell::Int(c.mismatches.load(Ordering::Relaxed) as i64),
    );
    if let (Some(w), Some(e)) = (rss(warm), rss(end)) {
        row("target RSS after warm-up, MiB", Cell::float(w, 1));
        row("target RSS at end, MiB", Cell::float(e, 1));
        row(
            "target RSS growth after warm-up, %",
            Cell::float((e - w) / w * 100.0, 1),
        );
    }
    if let (Some(w), Some(e)) = (fds(warm), fds(end)) {
        row("target descriptors after warm-up", Cell::Int(w as i64));
        row("target descriptors at end", Cell::Int(e as i64));
    }
    t
}

fn report_run(a: &SoakArgs, samples: &[Sample], c: &Counters) -> anyhow::Result<()> {
    let table = summary(a, samples, c);
    println!("{table}");
    let write = |p: &PathBuf, text: String| {
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))
    };
    if let Some(p) = &a.json {
        let samples: Vec<_> = samples
            .iter()
            .map(|s| {
                serde_json::json!({
                    "secs": s.secs, "MB/s": s.mb_per_s, "IOPS": s.iops, "errors": s.errors,
                    "mismatches": s.mismatches, "target RSS MiB": s.target_rss_mib,
                    "target fds": s.target_fds,
                })
            })
            .collect();
        let json = serde_json::json!({ "summary": table.to_json(), "samples": samples });
        write(p, serde_json::to_string_pretty(&json)?)?;
    }
    if let Some(p) = &a.csv {
        let mut t = Table::new([
            "secs",
            "MB/s",
            "IOPS",
            "errors",
            "mismatches",
            "target RSS MiB",
            "target fds",
        ]);
        for s in samples {
            t.push_row([
                Cell::float(s.secs, 2),
                Cell::float(s.mb_per_s, 1),
                Cell::float(s.iops, 0),
                Cell::Int(s.errors as i64),
                Cell::Int(s.mismatches as i64),
                s.target_rss_mib
                    .map_or(Cell::Text(String::new()), |r| Cell::float(r, 1)),
                s.target_fds
                    .map_or(Cell::Text(String::new()), |f| Cell::Int(f as i64)),
            ]);
        }
        write(p, t.to_csv())?;
    }
    if let Some(p) = &a.svg {
        let mut series = vec![Series::new(
            "throughput, MB/s",
            samples.iter().map(|s| (s.secs, s.mb_per_s)).collect(),
        )];
        if samples.iter().any(|s| s.target_rss_mib.is_some()) {
            series.push(Series::new(
                "target RSS, MiB",
                samples
                    .iter()
                    .filter_map(|s| Some((s.secs, s.target_rss_mib?)))
                    .collect(),
            ));
        }
        let plot = LinePlot {
            title: format!("soak: {} sessions x QD {}, {}", a.sessions, a.qd, a.url),
            x_label: "seconds".into(),
            y_label: "MB/s; MiB".into(),
            x_log2: false,
            y_log: false,
            x_ticks: TickLabels::Number,
            y_ticks: TickLabels::Number,
            series,
        };
        write(p, plot.to_svg())?;
    }
    let errors = c.errors.load(Ordering::Relaxed);
    let mismatches = c.mismatches.load(Ordering::Relaxed);
    if errors > 0 || mismatches > 0 {
        bail!("soak failed: {errors} command errors, {mismatches} verify mismatches");
    }
    Ok(())
}
