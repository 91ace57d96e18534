//! `ironsan bench vs-tgt`: ironsan's target against Debian's `tgtd`, same client, same run.
//!
//! Starts `tgtd` and `ironsan target` on loopback with equal LUNs (RAM: ironsan's memory backend
//! and tgtd's rdwr store on a tmpfs file; or both file-backed on tmpfs), drives both with
//! libiscsi's `iscsi-perf` (sequential 128 KiB reads at QD 32, random 4 KiB reads at QD 32),
//! alternating the two targets run by run so drift in machine load hits both, and prints one
//! table with both and their ratio.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::bench_procs::{self, free_port, wait_port, which, Reaped, Scratch};

#[derive(clap::Args)]
pub struct VsTgtArgs {
    /// ironsan's LUN backend: `memory` (RAM) or `file` (a file on tmpfs, as tgtd's).
    #[arg(long, default_value = "memory")]
    pub backend: String,
    /// LUN size for both targets.
    #[arg(long, default_value = "1GiB")]
    pub lun_size: String,
    /// Seconds per iscsi-perf run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// Runs per target and workload (alternating tgtd, ironsan); the table shows the mean.
    #[arg(long, default_value_t = 2)]
    pub repeat: u32,
    /// Directory for the backing files (tmpfs keeps both targets RAM-backed).
    #[arg(long, default_value = "/dev/shm")]
    pub dir: PathBuf,
    /// Write the table as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the table as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write a bar chart (MB/s per workload and target) as SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Exit non-zero if ironsan/tgtd on sequential reads is below this ratio.
    #[arg(long)]
    pub min_seq_ratio: Option<f64>,
    /// Exit non-zero if ironsan/tgtd on random 4 KiB IOPS is below this ratio.
    #[arg(long)]
    pub min_iops_ratio: Option<f64>,
}

/// One iscsi-perf workload.
struct Workload {
    name: &'static str,
    /// Transfer length in 512-byte blocks.
    blocks: u32,
    random: bool,
}

const WORKLOADS: [Workload; 2] = [
    Workload {
        name: "seq read 128 KiB QD32",
        blocks: 256,
        random: false,
    },
    Workload {
        name: "rand read 4 KiB QD32",
        blocks: 8,
        random: true,
    },
];
const QUEUE_DEPTH: u32 = 32;
const TGT_IQN: &str = "iqn.2026-11.org.ironsan.bench:tgtd";
const IRONSAN_IQN: &str = "iqn.2026-11.org.ironsan.bench:ironsan";

pub fn run(a: VsTgtArgs) -> Result<()> {
    for tool in ["tgtd", "tgtadm", "iscsi-perf"] {
        if which(tool).is_none() {
            bail!("{tool} not found: install it with `apt-get install -y tgt libiscsi-bin`");
        }
    }
    if a.backend != "memory" && a.backend != "file" {
        bail!("--backend {:?}: use memory or file", a.backend);
    }
    let lun_bytes = report::parse_size(&a.lun_size)
        .map_err(|e| anyhow!("--lun-size {:?}: {e:?}", a.lun_size))?;
    if a.repeat == 0 || a.seconds == 0 {
        bail!("--repeat and --seconds must be at least 1");
    }
    let scratch = Scratch(a.dir.join(format!("ironsan-vs-tgt.{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)
        .with_context(|| format!("creating {}", scratch.0.display()))?;

    let (tgt_port, ironsan_port) = (free_port()?, free_port()?);
    let _tgtd = start_tgtd(&scratch.0, tgt_port, lun_bytes)?;
    let _ironsan = start_ironsan(&scratch.0, ironsan_port, &a.backend, lun_bytes)?;
    let urls = [
        ("tgtd", format!("iscsi://127.0.0.1:{tgt_port}/{TGT_IQN}/1")),
        (
            "ironsan",
            format!("iscsi://127.0.0.1:{ironsan_port}/{IRONSAN_IQN}/1"),
        ),
    ];
    let tgt_version = Command::new("tgtd")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!(
        "bench vs-tgt: tgtd {tgt_version} (rdwr on {}) vs ironsan ({}), iscsi-perf {} s x {} per point",
        a.dir.display(),
        a.backend,
        a.seconds,
        a.repeat
    );

    // iops[workload][target] summed over the repeats.
    let mut iops = [[0.0f64; 2]; WORKLOADS.len()];
    for (w, load) in WORKLOADS.iter().enumerate() {
        for round in 0..a.repeat {
            for (t, (name, url)) in urls.iter().enumerate() {
                let measured = iscsi_perf(url, load, QUEUE_DEPTH, a.seconds)
                    .with_context(|| format!("iscsi-perf against {name}"))?;
                eprintln!(
                    "  {:<24} {:<8} run {}: {:>9.0} IOPS",
                    load.name,
                    name,
                    round + 1,
                    measured
                );
                iops[w][t] += measured;
            }
        }
    }

    let mut table = report::Table::new([
        "workload",
        "tgtd MB/s",
        "tgtd IOPS",
        "ironsan MB/s",
        "ironsan IOPS",
        "ironsan/tgtd",
    ]);
    let mut ratios = Vec::new();
    let mut chart = report::BarChart {
        title: "ironsan vs tgtd (iscsi-perf, loopback)".into(),
        x_label: "workload".into(),
        y_label: "MB/s".into(),
        categories: WORKLOADS.iter().map(|w| w.name.to_string()).collect(),
        series: vec![
            report::BarSeries {
                name: "tgtd".into(),
                values: vec![],
            },
            report::BarSeries {
                name: "ironsan".into(),
                values: vec![],
            },
        ],
    };
    for (w, load) in WORKLOADS.iter().enumerate() {
        let bytes = f64::from(load.blocks) * 512.0;
        let mean = |t: usize| iops[w][t] / f64::from(a.repeat);
        let (tgt, ours) = (mean(0), mean(1));
        let ratio = if tgt > 0.0 { ours / tgt } else { f64::NAN };
        ratios.push(ratio);
        chart.series[0].values.push(tgt * bytes / 1e6);
        chart.series[1].values.push(ours * bytes / 1e6);
        table.push_row([
            report::Cell::Text(load.name.into()),
            report::Cell::float(tgt * bytes / 1e6, 1),
            report::Cell::float(tgt, 0),
            report::Cell::float(ours * bytes / 1e6, 1),
            report::Cell::float(ours, 0),
            report::Cell::float(ratio, 2),
        ]);
    }
    println!("{table}");
    if let Some(p) = &a.json {
        std::fs::write(p, table.to_json_string())?;
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, table.to_csv())?;
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, chart.to_svg())?;
    }
    let mut short = Vec::new();
    if let Some(min) = a.min_seq_ratio {
        if ratios[0].is_nan() || ratios[0] < min {
            short.push(format!("sequential reads {:.2}x < {min}x", ratios[0]));
        }
    }
    if let Some(min) = a.min_iops_ratio {
        if ratios[1].is_nan() || ratios[1] < min {
            short.push(format!("4 KiB IOPS {:.2}x < {min}x", ratios[1]));
        }
    }
    if !short.is_empty() {
        bail!("ironsan below the bar: {}", short.join(", "));
    }
    Ok(())
}

fn start_tgtd(dir: &Path, port: u16, lun_bytes: u64) -> Result<Reaped> {
    let img = dir.join("tgtd.img");
    std::fs::File::create(&img)?.set_len(lun_bytes)?;
    let img = img.to_string_lossy().into_owned();
    bench_procs::start_tgtd(dir, port, TGT_IQN, &["-b", &img], &[])
}

fn start_ironsan(dir: &Path, port: u16, backend: &str, lun_bytes: u64) -> Result<Reaped> {
    let backend_toml = match backend {
        "memory" => "\"memory\"".to_string(),
        _ => format!(
            "{{ type = \"file\", path = \"{}\", create = true }}",
            dir.join("ironsan.img").display()
        ),
    };
    let config = dir.join("ironsan.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:{port}\"]\n\n[[target]]\nname = \"{IRONSAN_IQN}\"\n\n\
             [target.lun.1]\nsize = \"{lun_bytes}\"\nbackend = {backend_toml}\n"
        ),
    )?;
    let child = Command::new(std::env::current_exe()?)
        .arg("target")
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting ironsan target")?;
    let guard = Reaped(child);
    wait_port(port, "ironsan target")?;
    Ok(guard)
}

/// Runs one iscsi-perf and returns its average IOPS.
fn iscsi_perf(url: &str, load: &Workload, qd: u32, seconds: u32) -> Result<f64> {
    let mut cmd = Command::new(which("iscsi-perf").unwrap());
    cmd.args(["-t", &seconds.to_string()])
        .args(["-b", &load.blocks.to_string()])
        .args(["-m", &qd.to_string()]);
    if load.random {
        cmd.arg("-r");
    }
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .context("running iscsi-perf")?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_iscsi_perf(&text).ok_or_else(|| {
        anyhow!(
            "iscsi-perf printed no result ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// The final "iops average N" figure of iscsi-perf's output (its progress lines use the same
/// words, so the last occurrence is the whole-run average).
fn parse_iscsi_perf(text: &str) -> Option<f64> {
    let at = text.rfind("iops average ")?;
    text[at + "iops average ".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::parse_iscsi_perf;

    #[test]
    fn iscsi_perf_final_average_is_parsed() {
        let out =
            "will run for 3 seconds.\n\n00:00:02 - lba 1050284, iops current 59663 (233 MB/s), \
                   iops average 59663 (233 MB/s), in_flight 32, busy 0        \
                   iops average 58313 (227 MB/s)       \n\nfinished.\n";
        assert_eq!(parse_iscsi_perf(out), Some(58313.0));
        assert_eq!(parse_iscsi_perf("iscsi_connect failed"), None);
    }
}
