//! `ironsan bench backends`: ironsan's file backend against its RAM LUN, fio and tgtd, in one
//! run.
//!
//! One ironsan target serves three LUNs: RAM (the memory backend), a file on tmpfs, and a
//! file on disk opened O_DIRECT (`direct = true`). fio's io_uring engine runs O_DIRECT
//! straight on the same disk file (the most that file gives), and Debian's tgtd serves it
//! with its rdwr store, O_DIRECT as well (`--bsoflags direct`). Both targets are driven by
//! the same initiator (`ironsan bench`, a child process) over loopback, with `bench rbd`'s
//! workloads; each workload runs on every side in turn, the order rotating round by round,
//! so drift in the machine's load hits all sides. The table shows means, MB/s, IOPS and the
//! CPU seconds per GB moved of the process doing the I/O (the target; fio itself), with the
//! tmpfs file's ratio to RAM, the disk sides' ratio to fio and ironsan's to tgtd.
//!
//! The RAM and tmpfs LUNs are written through once before the runs. The disk file lies
//! under `--disk-dir` (refused if that is tmpfs) and is written in full
//! once before measuring, so reads reach allocated blocks; it is removed afterwards.

use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::bench_procs::{
    self, free_port, reaped_children_cpu_seconds, wait_port, which, Reaped, Scratch,
};
use super::bench_rbd::{parse_fio, rotate_sides, run_initiator, Run, Workload, WORKLOADS};

#[derive(clap::Args)]
pub struct BackendsArgs {
    /// Directory of the disk file (a real file system: /tmp may be tmpfs).
    #[arg(long, default_value = "/var/tmp")]
    pub disk_dir: PathBuf,
    /// Directory of the tmpfs file.
    #[arg(long, default_value = "/dev/shm")]
    pub tmpfs_dir: PathBuf,
    /// Size of every LUN and file.
    #[arg(long, default_value = "1GiB")]
    pub size: String,
    /// Sides to run, a comma list of ram, tmpfs, disk (ironsan's LUNs), fio and tgtd.
    #[arg(long, default_value = "ram,tmpfs,disk,fio,tgtd")]
    pub sides: String,
    /// ironsan's file LUNs' `io` key: uring or threads.
    #[arg(long, default_value = "uring")]
    pub io: String,
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
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Ram,
    Tmpfs,
    Disk,
    Fio,
    Tgtd,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Ram => "ironsan RAM",
            Side::Tmpfs => "ironsan file tmpfs",
            Side::Disk => "ironsan file disk",
            Side::Fio => "fio io_uring disk",
            Side::Tgtd => "tgtd rdwr disk",
        }
    }

    /// ironsan's LUN number for its sides.
    fn lun(self) -> Option<u32> {
        match self {
            Side::Ram => Some(1),
            Side::Tmpfs => Some(2),
            Side::Disk => Some(3),
            Side::Fio | Side::Tgtd => None,
        }
    }
}

fn parse_sides(s: &str) -> Result<Vec<Side>> {
    let mut sides = Vec::new();
    for name in s.split(',').map(str::trim) {
        let side = match name {
            "ram" => Side::Ram,
            "tmpfs" => Side::Tmpfs,
            "disk" => Side::Disk,
            "fio" => Side::Fio,
            "tgtd" => Side::Tgtd,
            other => bail!("--sides {other:?}: use a comma list of ram, tmpfs, disk, fio and tgtd"),
        };
        if !sides.contains(&side) {
            sides.push(side);
        }
    }
    Ok(sides)
}

const TGT_IQN: &str = "iqn.2026-11.org.ironsan.bench:tgtd-file";
const IRONSAN_IQN: &str = "iqn.2026-11.org.ironsan.bench:ironsan-backends";

/// The file system type `stat -f` names for `dir`.
fn fs_type(dir: &Path) -> Result<String> {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .context("running stat -f")?;
    if !out.status.success() {
        bail!("stat -f {} failed ({})", dir.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Writes `bytes` of non-zero data to `path` and syncs it, so every block is allocated.
fn fill(path: &Path, bytes: u64) -> Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

pub fn run(a: BackendsArgs) -> Result<()> {
    let sides = parse_sides(&a.sides)?;
    let bytes = report::parse_size(&a.size).map_err(|e| anyhow!("--size {:?}: {e:?}", a.size))?;
    if a.repeat == 0 || a.seconds == 0 {
        bail!("--repeat and --seconds must be at least 1");
    }
    if a.io != "uring" && a.io != "threads" {
        bail!("--io {:?}: use uring or threads", a.io);
    }
    if sides.contains(&Side::Fio) && which("fio").is_none() {
        bail!("fio not found: install it with `apt-get install -y fio`");
    }
    let disk_fs = fs_type(&a.disk_dir)?;
    if disk_fs == "tmpfs" {
        bail!(
            "--disk-dir {} is tmpfs: name a directory on a disk",
            a.disk_dir.display()
        );
    }
    let tag = format!("ironsan-bench-backends.{}", std::process::id());
    let disk_dir = Scratch(a.disk_dir.join(&tag));
    let tmpfs_dir = Scratch(a.tmpfs_dir.join(&tag));
    for d in [&disk_dir.0, &tmpfs_dir.0] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let disk = disk_dir.0.join("disk.img");
    eprintln!(
        "bench backends: writing {} ({} bytes, {disk_fs})",
        disk.display(),
        bytes
    );
    fill(&disk, bytes)?;

    let port = free_port()?;
    let ironsan = start_ironsan(&a, &tmpfs_dir.0, &disk, port, bytes)?;
    for lun in [1, 2] {
        let url = format!("iscsi://127.0.0.1:{port}/{IRONSAN_IQN}/{lun}");
        precondition(&url, bytes)?;
    }
    let tgtd = match sides.contains(&Side::Tgtd) {
        true => {
            let port = free_port()?;
            let disk = disk.to_string_lossy().into_owned();
            let lun = ["-b", &disk, "--bsoflags", "direct"];
            Some((
                bench_procs::start_tgtd(&tmpfs_dir.0, port, TGT_IQN, &lun, &[])?,
                port,
            ))
        }
        false => None,
    };
    eprintln!(
        "bench backends: sides {}, io {}, {} s x {} per point",
        sides
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        a.io,
        a.seconds,
        a.repeat
    );

    let runs = rotate_sides(&sides, a.repeat, Side::name, |load, side| {
        match (side, &tgtd) {
            (Side::Fio, _) => run_fio(a.seconds, &disk, bytes, load),
            (Side::Tgtd, Some((child, port))) => {
                let url = format!("iscsi://127.0.0.1:{port}/{TGT_IQN}/1");
                run_initiator(a.seconds, load, &url, child.0.id())
            }
            _ => {
                let lun = side.lun().unwrap_or(1);
                let url = format!("iscsi://127.0.0.1:{port}/{IRONSAN_IQN}/{lun}");
                run_initiator(a.seconds, load, &url, ironsan.0.id())
            }
        }
    })?;
    drop((ironsan, tgtd));
    report(&a, &sides, &runs)
}

fn report(a: &BackendsArgs, sides: &[Side], runs: &[Vec<Run>]) -> Result<()> {
    let mut table = report::Table::new([
        "workload", "side", "MB/s", "IOPS", "CPU s/GB", "x RAM", "x fio", "x tgtd",
    ]);
    for (w, load) in WORKLOADS.iter().enumerate() {
        let iops = |s: usize| runs[w][s].ops / runs[w][s].seconds.max(1e-9);
        let of = |side: Side| sides.iter().position(|&x| x == side).map(iops);
        let ratio = |x: f64, y: Option<f64>| match y {
            Some(y) if y > 0.0 => report::Cell::float(x / y, 2),
            _ => report::Cell::Text(String::new()),
        };
        let blank = || report::Cell::Text(String::new());
        for (s, &side) in sides.iter().enumerate() {
            let r = runs[w][s];
            let x = iops(s);
            table.push_row([
                report::Cell::Text(load.name.into()),
                report::Cell::Text(side.name().into()),
                report::Cell::float(r.bytes / r.seconds.max(1e-9) / 1e6, 1),
                report::Cell::float(x, 0),
                report::Cell::float(r.cpu / (r.bytes / 1e9).max(1e-12), 2),
                match side {
                    Side::Tmpfs => ratio(x, of(Side::Ram)),
                    _ => blank(),
                },
                match side {
                    Side::Disk | Side::Tgtd => ratio(x, of(Side::Fio)),
                    _ => blank(),
                },
                match side {
                    Side::Disk => ratio(x, of(Side::Tgtd)),
                    _ => blank(),
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
    Ok(())
}

/// fio's io_uring engine, O_DIRECT, on the disk file; the cost is fio's whole CPU.
fn run_fio(seconds: u32, disk: &Path, bytes: u64, load: &Workload) -> Result<Run> {
    let rw = match (load.write, load.random) {
        (false, true) => "randread",
        (true, true) => "randwrite",
        (false, false) => "read",
        (true, false) => "write",
    };
    let before = reaped_children_cpu_seconds();
    let out = Command::new("fio")
        .args([
            "--name=disk",
            "--ioengine=io_uring",
            "--direct=1",
            "--time_based",
            "--norandommap",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", disk.display()))
        .arg(format!("--size={bytes}"))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={}", load.bytes))
        .arg(format!("--iodepth={}", load.qd))
        .arg(format!("--runtime={seconds}"))
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

/// Writes LUN `url` through once (1 MiB sequential writes), as the disk file is: the RAM
/// LUN allocates its memory, and tmpfs its pages, at a block's first write, which would
/// otherwise be measured as the random writes' cost.
fn precondition(url: &str, bytes: u64) -> Result<()> {
    eprintln!("bench backends: writing {url} through once");
    let status = Command::new(std::env::current_exe()?)
        .args([
            "bench",
            url,
            "--rw",
            "write",
            "--pattern",
            "seq",
            "--size",
            "1m",
        ])
        .args(["--qd", "8", "--count", &bytes.div_ceil(1 << 20).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running ironsan bench")?;
    if !status.success() {
        bail!("writing {url} through failed ({status})");
    }
    Ok(())
}

/// ironsan's target with LUN 1 in RAM, LUN 2 a file in `tmpfs_dir`, LUN 3 the `disk` file
/// (O_DIRECT).
fn start_ironsan(
    a: &BackendsArgs,
    tmpfs_dir: &Path,
    disk: &Path,
    port: u16,
    bytes: u64,
) -> Result<Reaped> {
    let config = tmpfs_dir.join("ironsan.toml");
    let io = &a.io;
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:{port}\"]\n\n[[target]]\nname = \"{IRONSAN_IQN}\"\n\n\
             [target.lun.1]\nsize = \"{bytes}\"\nbackend = \"memory\"\n\n\
             [target.lun.2]\nsize = \"{bytes}\"\nio = \"{io}\"\n\
             backend = {{ type = \"file\", path = \"{}\", create = true }}\n\n\
             [target.lun.3]\nsize = \"{bytes}\"\nio = \"{io}\"\ndirect = true\n\
             backend = {{ type = \"file\", path = \"{}\" }}\n",
            tmpfs_dir.join("tmpfs.img").display(),
            disk.display()
        ),
    )?;
    let log = tmpfs_dir.join("ironsan.log");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_sides("ram,disk,fio,ram").unwrap(),
            vec![Side::Ram, Side::Disk, Side::Fio]
        );
        let e = parse_sides("ram,spdk").unwrap_err().to_string();
        assert!(e.contains("spdk"), "{e}");
    }

    #[test]
    fn fill_writes_the_whole_file_with_no_zero_byte() {
        let dir =
            Scratch(std::env::temp_dir().join(format!("ironsan-fill.{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let p = dir.0.join("f");
        fill(&p, (1 << 20) + 5).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(got.len(), (1 << 20) + 5);
        assert!(got.iter().all(|&b| b != 0));
    }
}
