//! `ironsan bench rbd`: an RBD image served by ironsan, measured against its ceiling and
//! against tgtd, on one cluster, in one run.
//!
//! Three sides read and write the same image: fio's `rbd` engine straight on librbd (no
//! iSCSI: the most a librbd client gets from this cluster), ironsan's target with the image
//! as an `rbd` LUN, and Debian's tgtd with its `bs_rbd` store (package tgt-rbd). Both
//! targets are driven by the same initiator (`ironsan bench`, a child process) over
//! loopback. Each workload runs on every side in turn, the order rotating round by round so
//! drift in the machine or the cluster hits all sides; the table shows means, each side's
//! ratio to fio, ironsan's ratio to tgtd, and the CPU seconds per GB moved of the process
//! that holds librbd (fio, the ironsan target, tgtd). The sides `ironsan-eventfd` and
//! `ironsan-callback` are ironsan with its LUN's `completions` set (an A/B of how librbd
//! reports completions, in one run).
//!
//! The image is created (without exclusive-lock, so both targets may keep it open while
//! only one does I/O) and written once before measuring when it does not exist, and
//! removed afterwards (once the cluster has dropped the stopped targets' watches); an
//! existing image is used as it is and kept.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::bench_procs::{
    self, cpu_seconds, free_port, reaped_children_cpu_seconds, wait_port, which, Reaped, Scratch,
};

#[derive(clap::Args)]
pub struct RbdArgs {
    /// The cluster's configuration file (scripts/ceph-test-cluster.sh prints one).
    #[arg(long, default_value = "/etc/ceph/ceph.conf")]
    pub conf: PathBuf,
    /// Ceph client id (the `admin` of client.admin).
    #[arg(long, default_value = "admin")]
    pub user: String,
    #[arg(long, default_value = "rbd")]
    pub pool: String,
    /// The image all sides use; created (and removed afterwards) if it does not exist.
    #[arg(long, default_value = "ironsan-bench")]
    pub image: String,
    /// Size of an image this benchmark creates.
    #[arg(long, default_value = "512MiB")]
    pub image_size: String,
    /// Sides to run, a comma list of fio, ironsan, tgtd, ironsan-eventfd and
    /// ironsan-callback (ironsan with that `completions` mode).
    #[arg(long, default_value = "fio,ironsan,tgtd")]
    pub sides: String,
    /// Seconds per run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// Runs per side and workload (the order of the sides rotates each round).
    #[arg(long, default_value_t = 2)]
    pub repeat: u32,
    /// Write the table as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the table as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write a bar chart (MB/s per workload and side) as SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// One workload: what the issue's ceiling is measured at (`bench backends` measures the same).
pub(super) struct Workload {
    pub(super) name: &'static str,
    pub(super) write: bool,
    pub(super) random: bool,
    pub(super) bytes: u32,
    pub(super) qd: u32,
}

pub(super) const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "rand read 4 KiB QD32",
        write: false,
        random: true,
        bytes: 4096,
        qd: 32,
    },
    Workload {
        name: "rand write 4 KiB QD32",
        write: true,
        random: true,
        bytes: 4096,
        qd: 32,
    },
    Workload {
        name: "seq read 1 MiB QD8",
        write: false,
        random: false,
        bytes: 1 << 20,
        qd: 8,
    },
    Workload {
        name: "seq write 1 MiB QD8",
        write: true,
        random: false,
        bytes: 1 << 20,
        qd: 8,
    },
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Fio,
    Ironsan,
    Tgtd,
    /// ironsan with `completions = "eventfd"`.
    IronsanEventfd,
    /// ironsan with `completions = "callback"`.
    IronsanCallback,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Fio => "fio rbd",
            Side::Ironsan => "ironsan",
            Side::IronsanEventfd => "ironsan eventfd",
            Side::IronsanCallback => "ironsan callback",
            Side::Tgtd => "tgtd bs_rbd",
        }
    }
}

fn parse_sides(s: &str) -> Result<Vec<Side>> {
    let mut sides = Vec::new();
    for name in s.split(',').map(str::trim) {
        let side = match name {
            "fio" => Side::Fio,
            "ironsan" => Side::Ironsan,
            "ironsan-eventfd" => Side::IronsanEventfd,
            "ironsan-callback" => Side::IronsanCallback,
            "tgtd" => Side::Tgtd,
            other => bail!("--sides {other:?}: use a comma list of fio, ironsan, tgtd, ironsan-eventfd and ironsan-callback"),
        };
        if !sides.contains(&side) {
            sides.push(side);
        }
    }
    Ok(sides)
}

/// One measured run.
#[derive(Default, Clone, Copy)]
pub(super) struct Run {
    pub(super) bytes: f64,
    pub(super) ops: f64,
    pub(super) seconds: f64,
    /// CPU seconds of the process doing the I/O (here: the one holding librbd) during the run.
    pub(super) cpu: f64,
}

const TGT_IQN: &str = "iqn.2026-11.org.ironsan.bench:tgtd-rbd";
const IRONSAN_IQN: &str = "iqn.2026-11.org.ironsan.bench:ironsan-rbd";

/// The image, removed on drop if this run created it.
struct Image<'a> {
    a: &'a RbdArgs,
    created: bool,
}

/// How long removing the image may wait for the watches of the targets this run killed:
/// the cluster drops a dead client's watch after its watch timeout (30 s by default), and
/// `rbd rm` refuses an image that still has watchers.
const REMOVE_WAIT: Duration = Duration::from_secs(75);

impl Drop for Image<'_> {
    fn drop(&mut self) {
        if !self.created {
            return;
        }
        let deadline = Instant::now() + REMOVE_WAIT;
        let mut told = false;
        while let Err(e) = rbd(self.a, &["rm", "--no-progress", &self.spec()]) {
            if Instant::now() >= deadline {
                eprintln!("bench rbd: could not remove image {}: {e}", self.spec());
                return;
            }
            if !told {
                eprintln!(
                    "bench rbd: removing image {} once the cluster drops the stopped targets' watches",
                    self.spec()
                );
                told = true;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }
}

impl Image<'_> {
    fn spec(&self) -> String {
        self.a.image_spec()
    }
}

impl RbdArgs {
    /// The image as `rbd` and tgtd name it: `pool/image`.
    fn image_spec(&self) -> String {
        format!("{}/{}", self.pool, self.image)
    }
}

fn rbd(a: &RbdArgs, args: &[&str]) -> Result<String> {
    let out = Command::new("rbd")
        .arg("-c")
        .arg(&a.conf)
        .args(["--id", &a.user])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running rbd")?;
    if !out.status.success() {
        bail!(
            "rbd {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Opens (or creates and fills) the image.
fn prepare_image(a: &RbdArgs) -> Result<Image<'_>> {
    let mut image = Image { a, created: false };
    let spec = image.spec();
    if rbd(a, &["info", &spec]).is_ok() {
        return Ok(image);
    }
    let bytes = report::parse_size(&a.image_size)
        .map_err(|e| anyhow!("--image-size {:?}: {e:?}", a.image_size))?;
    let mib = bytes.div_ceil(1 << 20).to_string();
    rbd(
        a,
        &[
            "create",
            "--size",
            &mib,
            "--image-feature",
            "layering",
            &spec,
        ],
    )?;
    image.created = true;
    // Reads of never-written objects cost the cluster nothing: fill the image first.
    rbd(
        a,
        &[
            "bench",
            "--io-type",
            "write",
            "--io-pattern",
            "seq",
            "--io-size",
            "4M",
            "--io-threads",
            "8",
            "--io-total",
            &bytes.to_string(),
            &spec,
        ],
    )?;
    Ok(image)
}

fn check_tools(sides: &[Side]) -> Result<()> {
    if which("rbd").is_none() {
        bail!("rbd not found: install it with `apt-get install -y ceph-common`");
    }
    if sides.contains(&Side::Fio) {
        let engines = Command::new("fio")
            .arg("--enghelp")
            .output()
            .map_err(|_| anyhow!("fio not found: install it with `apt-get install -y fio`"))?;
        if !String::from_utf8_lossy(&engines.stdout).contains("rbd") {
            bail!("this fio has no rbd engine: install Debian's fio package");
        }
    }
    if sides.contains(&Side::Tgtd) {
        let store = Path::new("/usr/lib/tgt/backing-store/bs_rbd.so");
        if which("tgtd").is_none() || which("tgtadm").is_none() || !store.exists() {
            bail!("tgtd with bs_rbd not found: install it with `apt-get install -y tgt tgt-rbd`");
        }
    }
    Ok(())
}

pub fn run(a: RbdArgs) -> Result<()> {
    let sides = parse_sides(&a.sides)?;
    if a.repeat == 0 || a.seconds == 0 {
        bail!("--repeat and --seconds must be at least 1");
    }
    if !a.conf.is_file() {
        bail!(
            "--conf {}: no such file (start a test cluster with `scripts/ceph-test-cluster.sh start DIR`)",
            a.conf.display()
        );
    }
    check_tools(&sides)?;
    let image = prepare_image(&a)?;
    let scratch =
        Scratch(std::env::temp_dir().join(format!("ironsan-bench-rbd.{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)?;

    // The targets stay up for the whole run; each is idle while another side measures.
    let mut targets: Vec<(Side, Reaped, String)> = Vec::new();
    for &side in &sides {
        let port = free_port()?;
        let (child, url) = match side {
            Side::Fio => continue,
            Side::Ironsan | Side::IronsanEventfd | Side::IronsanCallback => (
                start_ironsan(&a, &scratch.0, port, side)?,
                format!("iscsi://127.0.0.1:{port}/{IRONSAN_IQN}/1"),
            ),
            Side::Tgtd => (
                start_tgtd(&a, &scratch.0, port)?,
                format!("iscsi://127.0.0.1:{port}/{TGT_IQN}/1"),
            ),
        };
        targets.push((side, child, url));
    }
    eprintln!(
        "bench rbd: image {} ({}), sides {}, {} s x {} per point",
        image.spec(),
        a.conf.display(),
        sides
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        a.seconds,
        a.repeat
    );

    let runs = rotate_sides(&sides, a.repeat, Side::name, |load, side| {
        match targets.iter().find(|t| t.0 == side) {
            None => run_fio(&a, load),
            Some((_, target, url)) => run_initiator(a.seconds, load, url, target.0.id()),
        }
    })?;
    drop(targets);
    report(&a, &sides, &runs)
}

/// Runs every workload on every side, `repeat` rounds each, the order of the sides rotating
/// from round to round (so drift in the machine's load hits all sides), and returns each
/// side's runs summed: `runs[workload][side]`. `run` measures one workload on one side.
pub(super) fn rotate_sides<S: Copy>(
    sides: &[S],
    repeat: u32,
    name: fn(S) -> &'static str,
    mut run: impl FnMut(&Workload, S) -> Result<Run>,
) -> Result<Vec<Vec<Run>>> {
    let mut runs = vec![vec![Run::default(); sides.len()]; WORKLOADS.len()];
    for (w, load) in WORKLOADS.iter().enumerate() {
        for round in 0..repeat as usize {
            for k in 0..sides.len() {
                let s = (k + round) % sides.len();
                let r = run(load, sides[s])
                    .with_context(|| format!("{} on {}", load.name, name(sides[s])))?;
                eprintln!(
                    "  {:<22} {:<18} run {}: {:>9.1} MB/s",
                    load.name,
                    name(sides[s]),
                    round + 1,
                    r.bytes / r.seconds / 1e6
                );
                let sum = &mut runs[w][s];
                sum.bytes += r.bytes;
                sum.ops += r.ops;
                sum.seconds += r.seconds;
                sum.cpu += r.cpu;
            }
        }
    }
    Ok(runs)
}

fn report(a: &RbdArgs, sides: &[Side], runs: &[Vec<Run>]) -> Result<()> {
    let mut table = report::Table::new([
        "workload",
        "side",
        "MB/s",
        "IOPS",
        "CPU s/GB",
        "x fio",
        "ironsan/tgtd",
    ]);
    let mut chart = report::BarChart {
        title: "An RBD image: fio's rbd engine, ironsan, tgtd bs_rbd".into(),
        x_label: "workload".into(),
        y_label: "MB/s".into(),
        categories: WORKLOADS.iter().map(|w| w.name.to_string()).collect(),
        series: sides
            .iter()
            .map(|s| report::BarSeries {
                name: s.name().into(),
                values: vec![],
            })
            .collect(),
    };
    for (w, load) in WORKLOADS.iter().enumerate() {
        let mb_s = |s: usize| runs[w][s].bytes / runs[w][s].seconds.max(1e-9) / 1e6;
        let of = |side: Side| sides.iter().position(|&x| x == side).map(mb_s);
        let (fio, ours, tgt) = (of(Side::Fio), of(Side::Ironsan), of(Side::Tgtd));
        for (s, &side) in sides.iter().enumerate() {
            let r = runs[w][s];
            chart.series[s].values.push(mb_s(s));
            let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
                (Some(x), Some(y)) if y > 0.0 => report::Cell::float(x / y, 2),
                _ => report::Cell::Text(String::new()),
            };
            table.push_row([
                report::Cell::Text(load.name.into()),
                report::Cell::Text(side.name().into()),
                report::Cell::float(mb_s(s), 1),
                report::Cell::float(r.ops / r.seconds.max(1e-9), 0),
                report::Cell::float(r.cpu / (r.bytes / 1e9).max(1e-12), 2),
                ratio(Some(mb_s(s)), fio),
                if side == Side::Ironsan {
                    ratio(ours, tgt)
                } else {
                    report::Cell::Text(String::new())
                },
            ]);
        }
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
    Ok(())
}

/// fio's rbd engine on the image: the process is the librbd client, so its whole CPU
/// (every librbd thread) is the cost.
fn run_fio(a: &RbdArgs, load: &Workload) -> Result<Run> {
    let rw = match (load.write, load.random) {
        (false, true) => "randread",
        (true, true) => "randwrite",
        (false, false) => "read",
        (true, false) => "write",
    };
    let before = reaped_children_cpu_seconds();
    let out = Command::new("fio")
        // librados reads the configuration file CEPH_CONF names.
        .env("CEPH_CONF", &a.conf)
        .args([
            "--name=rbd",
            "--ioengine=rbd",
            "--direct=1",
            "--time_based",
            "--norandommap",
            "--output-format=json",
        ])
        .arg(format!("--clientname={}", a.user))
        .arg(format!("--pool={}", a.pool))
        .arg(format!("--rbdname={}", a.image))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={}", load.bytes))
        .arg(format!("--iodepth={}", load.qd))
        .arg(format!("--runtime={}", a.seconds))
        .stdin(Stdio::null())
        .output()
        .context("running fio")?;
    let cpu = reaped_children_cpu_seconds() - before;
    if !out.status.success() {
        bail!(
            "fio failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut run = parse_fio(&String::from_utf8_lossy(&out.stdout), load.write)?;
    run.cpu = cpu;
    Ok(run)
}

/// Bytes, operations and seconds of fio's JSON report (its one job, the direction run).
pub(super) fn parse_fio(text: &str, write: bool) -> Result<Run> {
    // fio may print notices before the JSON object.
    let json = &text[text
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no JSON"))?..];
    let v: serde_json::Value = serde_json::from_str(json).context("fio's JSON")?;
    let dir = &v["jobs"][0][if write { "write" } else { "read" }];
    let num = |k: &str| {
        dir[k]
            .as_f64()
            .ok_or_else(|| anyhow!("fio's JSON has no {k}"))
    };
    let seconds = num("runtime")? / 1e3;
    if seconds <= 0.0 {
        bail!("fio ran for no time");
    }
    Ok(Run {
        bytes: num("io_bytes")?,
        ops: num("total_ios")?,
        seconds,
        cpu: 0.0,
    })
}

/// `ironsan bench` (a child process) against an iSCSI target serving the image; the cost is
/// the target's CPU.
pub(super) fn run_initiator(
    seconds: u32,
    load: &Workload,
    url: &str,
    target_pid: u32,
) -> Result<Run> {
    let json = std::env::temp_dir().join(format!(
        "ironsan-bench-initiator.{}.json",
        std::process::id()
    ));
    let before = cpu_seconds(target_pid)?;
    let status = Command::new(std::env::current_exe()?)
        .args(["bench", url])
        .args(["--rw", if load.write { "write" } else { "read" }])
        .args(["--pattern", if load.random { "rand" } else { "seq" }])
        .args(["--size", &load.bytes.to_string()])
        .args(["--qd", &load.qd.to_string()])
        .args(["--duration", &seconds.to_string()])
        .arg("--json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .context("running ironsan bench")?;
    let cpu = cpu_seconds(target_pid)? - before;
    if !status.success() {
        bail!("ironsan bench {url} failed ({status})");
    }
    let text = std::fs::read_to_string(&json).context("reading the bench's JSON")?;
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&text).context("the bench's JSON")?;
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| anyhow!("the bench's JSON has no {k}"))
    };
    Ok(Run {
        bytes: num("bytes")?,
        ops: num("ops")?,
        seconds: num("seconds")?,
        cpu,
    })
}

/// Starts ironsan's target serving the image; `side` picks its `completions` mode (none for
/// [`Side::Ironsan`]: the default).
fn start_ironsan(a: &RbdArgs, dir: &Path, port: u16, side: Side) -> Result<Reaped> {
    let (tag, mode) = match side {
        Side::IronsanEventfd => ("-eventfd", ", completions = \"eventfd\""),
        Side::IronsanCallback => ("-callback", ", completions = \"callback\""),
        _ => ("", ""),
    };
    let config = dir.join(format!("ironsan{tag}.toml"));
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:{port}\"]\n\n[[target]]\nname = \"{IRONSAN_IQN}\"\n\n\
             [target.lun.1]\nbackend = {{ type = \"rbd\", pool = \"{}\", image = \"{}\", conf = \"{}\", user = \"{}\"{mode} }}\n",
            a.pool,
            a.image,
            a.conf.display(),
            a.user
        ),
    )?;
    let log = dir.join(format!("ironsan{tag}.log"));
    let child = Command::new(std::env::current_exe()?)
        .arg("target")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting ironsan target")?;
    let guard = Reaped(child);
    wait_port(port, "ironsan target").map_err(|e| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        anyhow!("{e}: {}", log.trim())
    })?;
    Ok(guard)
}

fn start_tgtd(a: &RbdArgs, dir: &Path, port: u16) -> Result<Reaped> {
    let spec = a.image_spec();
    let bsopts = format!("conf={};id={}", a.conf.display(), a.user);
    let lun = [
        "--bstype",
        "rbd",
        "--backing-store",
        &spec,
        "--bsopts",
        &bsopts,
    ];
    bench_procs::start_tgtd(
        dir,
        port,
        TGT_IQN,
        &lun,
        &[("CEPH_CONF", a.conf.as_os_str())],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_sides("fio,ironsan,fio").unwrap(),
            vec![Side::Fio, Side::Ironsan]
        );
        assert_eq!(
            parse_sides("ironsan-eventfd, ironsan-callback").unwrap(),
            vec![Side::IronsanEventfd, Side::IronsanCallback]
        );
        let e = parse_sides("fio,spdk").unwrap_err().to_string();
        assert!(e.contains("spdk"), "{e}");
    }

    #[test]
    fn fio_json_gives_bytes_ops_and_seconds() {
        let text = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs": [{"read": {"io_bytes": 8192, "total_ios": 2, "runtime": 500},
           "write": {"io_bytes": 0, "total_ios": 0, "runtime": 0}}]}"#;
        let r = parse_fio(text, false).unwrap();
        assert_eq!((r.bytes, r.ops, r.seconds), (8192.0, 2.0, 0.5));
        assert!(parse_fio(text, true).is_err(), "no time ran writing");
        assert!(parse_fio("fio: engine rbd not loadable", false).is_err());
    }
}
