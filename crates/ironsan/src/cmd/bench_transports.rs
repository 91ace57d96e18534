//! `ironsan bench transports`: iSCSI over TCP against iSER on the same machine, the same
//! target and the same workload, in one run.
//!
//! Starts `ironsan target` (a RAM LUN, iSCSI/TCP and iSER on one port of 127.0.0.1) as a child
//! process, logs in over `iscsi://` and over `iser://` (the software iWARP RNIC), and measures
//! each transfer size and direction on both transports in turn, the order alternating round
//! by round so drift in machine load hits both. For every point: throughput, the median
//! command latency and the CPU seconds per GB moved of the initiator (this process, RNIC
//! threads included) and of the target process, from /proc. With `--protect` both transports
//! guard the data: iSCSI/TCP with CRC32C header and data digests, iSER with MPA CRC (the
//! target insists on it). `--tcp-poll-us 0,50` measures iSCSI/TCP with each polling window
//! (one target process per window, both ends polling alike), and `--tcp-rr` adds a raw TCP
//! request/response of the same sizes (`ironsan bench tcp-rr`) to every QD 1 read point: the
//! floor an iSCSI/TCP command's latency is compared with.

use anyhow::{bail, Context, Result};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::bench_procs::{cpu_seconds, wait_port, Reaped};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::workload::{self, Pattern, Progress, Rw, Workload};
use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use report::{Cell, LinePlot, Series, Table, TickLabels};

#[derive(clap::Args)]
pub struct TransportsArgs {
    /// Transfer sizes: one (128k), a doubling sweep (4k..16m), or a comma list of both.
    #[arg(long, default_value = "4k..16m")]
    pub size: String,
    /// Directions: read, write or both (read,write).
    #[arg(long, default_value = "read,write")]
    pub rw: String,
    /// Commands outstanding: one depth or a comma list (1,8,32).
    #[arg(long, default_value = "16")]
    pub qd: String,
    /// Offsets: rand or seq.
    #[arg(long, default_value = "rand")]
    pub pattern: String,
    /// Protect the data on both transports: CRC32C header and data digests on iSCSI/TCP,
    /// MPA CRC on iSER.
    #[arg(long)]
    pub protect: bool,
    /// Keep the target's RAM LUN off the RNIC (iser_register_ram_luns = false): iSER reads
    /// copy it into a registered buffer first. Run with and without to see what registering
    /// the LUN once saves.
    #[arg(long)]
    pub iser_lun_copy: bool,
    /// Microseconds the software RNIC's engines (target and initiator) poll on after their
    /// last work before they sleep (0: at once).
    #[arg(long, value_name = "US", default_value_t = datamover_iser::rnic_task::DEFAULT_POLL.as_micros() as u64)]
    pub rdma_poll_us: u64,
    /// iSCSI/TCP polling windows to measure, in microseconds (a comma list: 0,50 measures
    /// polling off and on): each runs against a target of its own with `tcp_poll_us` set to
    /// it, the initiator polling alike.
    #[arg(long, value_name = "US,...", default_value_t = datamover_tcp::poll::DEFAULT_POLL.as_micros().to_string())]
    pub tcp_poll_us: String,
    /// Transports to measure: iscsi, iser or both.
    #[arg(long, default_value = "iscsi,iser")]
    pub transports: String,
    /// At every QD 1 read point also time a raw TCP request/response (48 bytes out, the
    /// read's size plus 48 back; both ends in this process, blocking reads).
    #[arg(long)]
    pub tcp_rr: bool,
    /// Seconds per point and transport in each round.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Rounds (each measures both transports, alternating which goes first).
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Size of the target's RAM LUN (also the span the workload uses).
    #[arg(long, default_value = "256MiB")]
    pub lun_size: String,
    /// Write the table as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the table as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Plot throughput against transfer size, a line per transport and direction (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<PathBuf>,
}

const IQN: &str = "iqn.2026-11.org.ironsan.bench:transports";

/// What one column of the comparison measures: a transport against one of the targets.
#[derive(Clone, Debug, PartialEq)]
enum Variant {
    /// iSCSI/TCP with this polling window (µs) at both ends, against target `target`.
    Tcp { poll_us: u64, target: usize },
    /// iSER, against the first target.
    Iser,
    /// The raw TCP request/response (QD 1 reads only).
    TcpRr,
}

impl Variant {
    fn name(&self, polls: usize) -> String {
        match self {
            Variant::Tcp { .. } if polls == 1 => "iscsi".into(),
            Variant::Tcp { poll_us, .. } => format!("iscsi poll {poll_us}"),
            Variant::Iser => "iser".into(),
            Variant::TcpRr => "tcp-rr".into(),
        }
    }
}

/// One point: a size, a direction and a variant, summed over the rounds (latency: each
/// round's median).
#[derive(Default, Clone)]
struct Point {
    bytes: u64,
    seconds: f64,
    initiator_cpu: f64,
    target_cpu: f64,
    p50_us: Vec<f64>,
}

impl Point {
    fn p50_us(&self) -> f64 {
        let mut v = self.p50_us.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

/// The variants `a` asks for, and the polling window of each target to start.
fn variants(a: &TransportsArgs) -> Result<(Vec<Variant>, Vec<u64>)> {
    let polls = a
        .tcp_poll_us
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| anyhow::anyhow!("--tcp-poll-us {v:?}: microseconds, or a comma list"))
        })
        .collect::<Result<Vec<u64>>>()?;
    let mut out = Vec::new();
    for t in a.transports.split(',') {
        match t.trim() {
            "iscsi" => out.extend(
                polls
                    .iter()
                    .enumerate()
                    .map(|(target, &poll_us)| Variant::Tcp { poll_us, target }),
            ),
            "iser" => out.push(Variant::Iser),
            other => bail!("--transports {other:?}: say iscsi, iser or iscsi,iser"),
        }
    }
    if a.tcp_rr {
        out.push(Variant::TcpRr);
    }
    Ok((out, polls))
}

pub fn run(a: TransportsArgs) -> Result<()> {
    let sizes = super::blockbench::sizes(&a.size)?;
    let rws = directions(&a.rw)?;
    let depths = depths(&a.qd)?;
    if a.rounds == 0 || a.duration <= 0.0 {
        bail!("--rounds and --duration must be positive");
    }
    let lun_bytes = report::parse_size(&a.lun_size)
        .map_err(|e| anyhow::anyhow!("--lun-size {:?}: {e:?}", a.lun_size))?;
    let pattern = match a.pattern.as_str() {
        "rand" => Pattern::Rand,
        "seq" => Pattern::Seq,
        p => bail!("--pattern {p}: say rand or seq"),
    };
    let (variants, polls) = variants(&a)?;
    let mut targets = Vec::new();
    for (i, &poll_us) in polls.iter().enumerate() {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let t = TargetSetup {
            port,
            lun_bytes,
            mpa_crc: a.protect,
            register_lun: !a.iser_lun_copy,
            iser_poll_us: a.rdma_poll_us,
            tcp_poll_us: poll_us,
            iser: i == 0,
        };
        targets.push((port, start_target(&t)?));
    }
    let pids: Vec<u32> = targets.iter().map(|(_, t)| t.0.id()).collect();
    let port = targets[0].0;
    eprintln!(
        "bench transports: ironsan targets (pids {pids:?}, RAM LUN {}) from 127.0.0.1:{port}: {}{}, {} qd {}, {} s per point x {} rounds",
        report::format_size(lun_bytes),
        variants
            .iter()
            .map(|v| v.name(polls.len()))
            .collect::<Vec<_>>()
            .join(", "),
        if a.protect {
            " (CRC32C digests / MPA CRC)"
        } else {
            ""
        },
        a.pattern,
        a.qd,
        a.duration,
        a.rounds
    );
    let rt = super::initiator::runtime()?;
    // points[qd][rw][size][transport]
    let nv = variants.len();
    let points = rt.block_on(async {
        // One session per variant (none for tcp-rr), and one per further target to fill it.
        let mut sessions: Vec<Option<Arc<Session>>> = Vec::new();
        for v in &variants {
            let (scheme, target, poll_us) = match v {
                Variant::Tcp { poll_us, target } => ("iscsi", *target, *poll_us),
                Variant::Iser => ("iser", 0, 0),
                Variant::TcpRr => {
                    sessions.push(None);
                    continue;
                }
            };
            let port = targets[target].0;
            let url = IscsiUrl::parse_lun(&format!("{scheme}://127.0.0.1:{port}/{IQN}/0"))?;
            let mut cfg = SessionConfig::from_url(&url);
            cfg.iser_poll = Duration::from_micros(a.rdma_poll_us);
            cfg.tcp_poll = Duration::from_micros(poll_us);
            if a.protect && scheme == "iscsi" {
                cfg.header_digest = iscsi_initiator::DigestPreference::Crc32c;
                cfg.data_digest = iscsi_initiator::DigestPreference::Crc32c;
            }
            let s = transports::connect_session(&url, cfg)
                .await
                .with_context(|| format!("logging in to {url}"))?;
            let s = Arc::new(s);
            // Each target's LUN is written once, by the first session that reaches it.
            let first_here = !variants.iter().zip(&sessions).any(|(w, s)| {
                s.is_some()
                    && match (w, v) {
                        (Variant::Tcp { target: x, .. }, Variant::Tcp { target: y, .. }) => x == y,
                        (Variant::Iser, Variant::Tcp { target, .. })
                        | (Variant::Tcp { target, .. }, Variant::Iser) => *target == 0,
                        _ => false,
                    }
            });
            if first_here {
                let cap = s.capacity(0).await?;
                fill_lun(&s, cap, lun_bytes).await?;
            }
            sessions.push(Some(s));
        }
        let Some(first) = sessions.iter().flatten().next() else {
            bail!("nothing to measure: --transports names no session");
        };
        let cap = first.capacity(0).await?;
        let mut points =
            vec![vec![vec![vec![Point::default(); nv]; sizes.len()]; rws.len()]; depths.len()];
        for round in 0..a.rounds {
            for ((q, &qd), (r, &rw)) in depths
                .iter()
                .enumerate()
                .flat_map(|d| rws.iter().enumerate().map(move |r| (d, r)))
            {
                for (z, &size) in sizes.iter().enumerate() {
                    for k in 0..nv {
                        let t = (k + round as usize) % nv;
                        let p = &mut points[q][r][z][t];
                        let Some(session) = &sessions[t] else {
                            if qd == 1 && rw == Rw::Read {
                                tcp_rr_point(p, size)?;
                            }
                            continue;
                        };
                        let w = Workload {
                            rw,
                            pattern,
                            size,
                            qd,
                            duration: Some(Duration::from_secs_f64(a.duration)),
                            count: None,
                            span: Some(lun_bytes),
                            verify: false,
                            seed: 1,
                        };
                        let target_pid = match &variants[t] {
                            Variant::Tcp { target, .. } => pids[*target],
                            _ => pids[0],
                        };
                        let (i0, t0) = (cpu_seconds(std::process::id())?, cpu_seconds(target_pid)?);
                        let started = Instant::now();
                        let s = workload::run(
                            std::slice::from_ref(session),
                            0,
                            cap,
                            &w,
                            Arc::new(Progress::default()),
                        )
                        .await
                        .with_context(|| {
                            format!(
                                "{} {} qd {qd} over {}",
                                rw.label(),
                                size,
                                variants[t].name(polls.len())
                            )
                        })?;
                        p.bytes += s.bytes;
                        p.p50_us.push(s.lat_p50_us);
                        p.seconds += started.elapsed().as_secs_f64().max(s.seconds);
                        p.initiator_cpu += cpu_seconds(std::process::id())? - i0;
                        p.target_cpu += cpu_seconds(target_pid)? - t0;
                    }
                }
            }
        }
        for s in sessions.into_iter().flatten() {
            if let Ok(s) = Arc::try_unwrap(s) {
                let _ = s.logout().await;
            }
        }
        anyhow::Ok(points)
    })?;
    drop(rt);
    drop(targets);
    report(&a, &variants, polls.len(), &sizes, &rws, &depths, &points)
}

/// One tcp-rr run for a QD 1 read point of `size` bytes: the answer carries the read's data
/// and a 48-byte header, as its Data-In does. Both ends run in this process: their CPU is
/// counted as the initiator's.
fn tcp_rr_point(p: &mut Point, size: u32) -> Result<()> {
    let cfg = bench::tcp_rr::RrConfig {
        response_bytes: size as usize + 48,
        ..bench::tcp_rr::RrConfig::default()
    };
    let s = bench::tcp_rr::run(&cfg).context("tcp-rr over loopback")?;
    p.bytes += s.round_trips * u64::from(size);
    p.seconds += s.seconds;
    p.initiator_cpu += s.cpu_seconds;
    p.p50_us.push(s.p50_us);
    Ok(())
}

fn directions(s: &str) -> Result<Vec<Rw>> {
    s.split(',')
        .map(|d| match d.trim() {
            "read" => Ok(Rw::Read),
            "write" => Ok(Rw::Write),
            other => bail!("--rw {other:?}: use read, write or read,write"),
        })
        .collect()
}

/// Queue depths from `--qd`: one or a comma list.
fn depths(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|d| match d.trim().parse::<usize>() {
            Ok(n) if (1..=4096).contains(&n) => Ok(n),
            _ => bail!("--qd {d:?}: a queue depth from 1 to 4096, or a comma list of them"),
        })
        .collect()
}

type Points = [Vec<Vec<Vec<Point>>>];

fn report(
    a: &TransportsArgs,
    variants: &[Variant],
    polls: usize,
    sizes: &[u32],
    rws: &[Rw],
    depths: &[usize],
    points: &Points,
) -> Result<()> {
    let mut table = Table::new([
        "size",
        "rw",
        "qd",
        "transport",
        "MB/s",
        "p50 us",
        "initiator CPU s/GB",
        "target CPU s/GB",
        "iser/iscsi MB/s",
    ]);
    let mut series: Vec<Series> = Vec::new();
    for ((q, &qd), (r, rw)) in depths
        .iter()
        .enumerate()
        .flat_map(|d| rws.iter().enumerate().map(move |r| (d, r)))
    {
        for (z, &size) in sizes.iter().enumerate() {
            let mbps = |p: &Point| p.bytes as f64 / p.seconds.max(1e-9) / 1e6;
            let here = &points[q][r][z];
            let first_tcp = variants
                .iter()
                .position(|v| matches!(v, Variant::Tcp { .. }));
            for (t, v) in variants.iter().enumerate() {
                let p = &here[t];
                if p.bytes == 0 {
                    continue;
                }
                let name = v.name(polls);
                let gb = (p.bytes as f64 / 1e9).max(1e-12);
                let blank = || Cell::Text(String::new());
                table.push_row([
                    Cell::Text(report::format_size(u64::from(size))),
                    Cell::Text(rw.label()),
                    Cell::Int(qd as i64),
                    Cell::Text(name.clone()),
                    Cell::float(mbps(p), 1),
                    Cell::float(p.p50_us(), 1),
                    Cell::float(p.initiator_cpu / gb, 2),
                    if *v == Variant::TcpRr {
                        blank()
                    } else {
                        Cell::float(p.target_cpu / gb, 2)
                    },
                    match first_tcp {
                        Some(f) if *v == Variant::Iser => {
                            Cell::float(mbps(p) / mbps(&here[f]).max(1e-9), 2)
                        }
                        _ => blank(),
                    },
                ]);
                if *v == Variant::TcpRr {
                    continue;
                }
                let label = if depths.len() > 1 {
                    format!("{name} {} qd {qd}", rw.label())
                } else {
                    format!("{name} {}", rw.label())
                };
                let point = (f64::from(size), mbps(p));
                match series.iter_mut().find(|s| s.name == label) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series::new(label, vec![point])),
                }
            }
        }
    }
    print!("{table}");
    if let Some(p) = &a.json {
        std::fs::write(p, table.to_json_string())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, table.to_csv()).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.svg {
        let plot = LinePlot {
            title: "iSCSI/TCP vs iSER (software iWARP RNIC), same target, loopback".into(),
            x_label: "transfer size".into(),
            y_label: "MB/s".into(),
            x_log2: true,
            y_log: false,
            x_ticks: TickLabels::Bytes,
            y_ticks: TickLabels::Number,
            series,
        };
        std::fs::write(p, plot.to_svg()).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Writes the whole span once before measuring: a RAM LUN allocates its memory on first write,
/// and the kernel's zeroing of fresh pages would otherwise be charged to whichever transport
/// writes first (on this kind of machine it took most of a first 2-second write point).
async fn fill_lun(
    session: &Arc<Session>,
    cap: iscsi_initiator::scsi::Capacity,
    lun_bytes: u64,
) -> Result<()> {
    const FILL: u32 = 1 << 20;
    let w = Workload {
        rw: Rw::Write,
        pattern: Pattern::Seq,
        size: FILL,
        qd: 8,
        duration: None,
        count: Some(lun_bytes.div_ceil(u64::from(FILL))),
        span: Some(lun_bytes),
        verify: false,
        seed: 1,
    };
    workload::run(
        std::slice::from_ref(session),
        0,
        cap,
        &w,
        Arc::new(Progress::default()),
    )
    .await
    .context("writing the LUN once before measuring")?;
    Ok(())
}

/// One target process to start.
struct TargetSetup {
    port: u16,
    lun_bytes: u64,
    mpa_crc: bool,
    register_lun: bool,
    iser_poll_us: u64,
    tcp_poll_us: u64,
    /// Serve iSER on the port too.
    iser: bool,
}

fn start_target(t: &TargetSetup) -> Result<Reaped> {
    let TargetSetup {
        port,
        lun_bytes,
        mpa_crc,
        register_lun,
        iser_poll_us,
        tcp_poll_us,
        iser,
    } = *t;
    let dir = std::env::temp_dir().join(format!(
        "ironsan-bench-transports.{}.{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("target.toml");
    let iser_portal = if iser {
        format!(", \"iser://127.0.0.1:{port}\"")
    } else {
        String::new()
    };
    std::fs::write(
        &config,
        format!(
            "portals = [\"tcp://127.0.0.1:{port}\"{iser_portal}]\n\
             iser_mpa_crc = {mpa_crc}\n\
             iser_register_ram_luns = {register_lun}\n\
             iser_poll_us = {iser_poll_us}\n\
             tcp_poll_us = {tcp_poll_us}\n\n\
             [[target]]\nname = \"{IQN}\"\n\n[target.lun.0]\nsize = \"{lun_bytes}\"\nbackend = \"memory\"\n"
        ),
    )?;
    let child = Command::new(std::env::current_exe()?)
        .arg("target")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting ironsan target")?;
    let guard = Reaped(child);
    wait_port(port, "ironsan target")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_parse() {
        assert!(directions("read,write").unwrap().len() == 2);
        assert!(directions("sideways").is_err());
        assert_eq!(depths("1,8, 32").unwrap(), vec![1, 8, 32]);
        assert!(depths("0").is_err());
        assert!(depths("8,x").is_err());
    }

    /// A polling window per iSCSI/TCP variant, each against a target of its own; iSER on the
    /// first; tcp-rr when asked.
    #[test]
    fn variants_from_the_options() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: TransportsArgs,
        }
        let cli = Cli::parse_from(["x", "--tcp-poll-us", "0,50", "--tcp-rr"]);
        let (v, polls) = variants(&cli.a).unwrap();
        assert_eq!(polls, vec![0, 50]);
        assert_eq!(
            v,
            vec![
                Variant::Tcp {
                    poll_us: 0,
                    target: 0
                },
                Variant::Tcp {
                    poll_us: 50,
                    target: 1
                },
                Variant::Iser,
                Variant::TcpRr
            ]
        );
        assert_eq!(v[1].name(2), "iscsi poll 50");
        assert_eq!(v[0].name(1), "iscsi");
        let cli = Cli::parse_from(["x", "--transports", "iscsi"]);
        let (v, _) = variants(&cli.a).unwrap();
        assert_eq!(v.len(), 1);
        let cli = Cli::parse_from(["x", "--tcp-poll-us", "x"]);
        assert!(variants(&cli.a).is_err());
    }
}
