//! `ironsan bench transports`: iSCSI over TCP against iSER on the same machine, the same
//! target and the same workload, in one run.
//!
//! Starts `ironsan target` (a RAM LUN, iSCSI/TCP and iSER on one port of 127.0.0.1) as a child
//! process, logs in over `iscsi://` and over `iser://` (the software iWARP RNIC), and measures
//! each transfer size and direction on both transports in turn, the order alternating round
//! by round so drift in machine load hits both. For every point: throughput and the CPU
//! seconds per GB moved of the initiator (this process, RNIC threads included) and of the
//! target process, from /proc. With `--protect` both transports guard the data: iSCSI/TCP
//! with CRC32C header and data digests, iSER with MPA CRC (the target insists on it).

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
const TRANSPORTS: [&str; 2] = ["iscsi", "iser"];

/// One point: a size, a direction and a transport, summed over the rounds.
#[derive(Default, Clone)]
struct Point {
    bytes: u64,
    seconds: f64,
    initiator_cpu: f64,
    target_cpu: f64,
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
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let target = start_target(port, lun_bytes, a.protect, !a.iser_lun_copy, a.rdma_poll_us)?;
    let target_pid = target.0.id();
    eprintln!(
        "bench transports: ironsan target (pid {target_pid}, RAM LUN {}) on 127.0.0.1:{port}, iscsi:// and iser://{}, {} qd {}, {} s per point x {} rounds",
        report::format_size(lun_bytes),
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
    let points = rt.block_on(async {
        let mut sessions = Vec::new();
        for t in TRANSPORTS {
            let url = IscsiUrl::parse_lun(&format!("{t}://127.0.0.1:{port}/{IQN}/0"))?;
            let mut cfg = SessionConfig::from_url(&url);
            cfg.iser_poll = Duration::from_micros(a.rdma_poll_us);
            if a.protect && t == "iscsi" {
                cfg.header_digest = iscsi_initiator::DigestPreference::Crc32c;
                cfg.data_digest = iscsi_initiator::DigestPreference::Crc32c;
            }
            let s = transports::connect_session(&url, cfg)
                .await
                .with_context(|| format!("logging in to {url}"))?;
            sessions.push(Arc::new(s));
        }
        let cap = sessions[0].capacity(0).await?;
        fill_lun(&sessions[0], cap, lun_bytes).await?;
        let mut points =
            vec![
                vec![vec![[Point::default(), Point::default()]; sizes.len()]; rws.len()];
                depths.len()
            ];
        for round in 0..a.rounds {
            for ((q, &qd), (r, &rw)) in depths
                .iter()
                .enumerate()
                .flat_map(|d| rws.iter().enumerate().map(move |r| (d, r)))
            {
                for (z, &size) in sizes.iter().enumerate() {
                    for k in 0..2 {
                        let t = (k + round as usize) % 2;
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
                        let (i0, t0) = (cpu_seconds(std::process::id())?, cpu_seconds(target_pid)?);
                        let started = Instant::now();
                        let s = workload::run(
                            std::slice::from_ref(&sessions[t]),
                            0,
                            cap,
                            &w,
                            Arc::new(Progress::default()),
                        )
                        .await
                        .with_context(|| {
                            format!("{} {} qd {qd} over {}", rw.label(), size, TRANSPORTS[t])
                        })?;
                        let p = &mut points[q][r][z][t];
                        p.bytes += s.bytes;
                        p.seconds += started.elapsed().as_secs_f64().max(s.seconds);
                        p.initiator_cpu += cpu_seconds(std::process::id())? - i0;
                        p.target_cpu += cpu_seconds(target_pid)? - t0;
                    }
                }
            }
        }
        for s in sessions {
            if let Ok(s) = Arc::try_unwrap(s) {
                let _ = s.logout().await;
            }
        }
        anyhow::Ok(points)
    })?;
    drop(rt);
    drop(target);
    report(&a, &sizes, &rws, &depths, &points)
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

type Points = [Vec<Vec<[Point; 2]>>];

fn report(
    a: &TransportsArgs,
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
            let ratio = mbps(&here[1]) / mbps(&here[0]).max(1e-9);
            for (t, name) in TRANSPORTS.iter().enumerate() {
                let p = &here[t];
                let gb = (p.bytes as f64 / 1e9).max(1e-12);
                table.push_row([
                    Cell::Text(report::format_size(u64::from(size))),
                    Cell::Text(rw.label()),
                    Cell::Int(qd as i64),
                    Cell::Text((*name).into()),
                    Cell::float(mbps(p), 1),
                    Cell::float(p.initiator_cpu / gb, 2),
                    Cell::float(p.target_cpu / gb, 2),
                    if t == 1 {
                        Cell::float(ratio, 2)
                    } else {
                        Cell::Text(String::new())
                    },
                ]);
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

fn start_target(
    port: u16,
    lun_bytes: u64,
    mpa_crc: bool,
    register_lun: bool,
    poll_us: u64,
) -> Result<Reaped> {
    let dir = std::env::temp_dir().join(format!("ironsan-bench-transports.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"tcp://127.0.0.1:{port}\", \"iser://127.0.0.1:{port}\"]\n\
             iser_mpa_crc = {mpa_crc}\n\
             iser_register_ram_luns = {register_lun}\n\
             iser_poll_us = {poll_us}\n\n\
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
}
