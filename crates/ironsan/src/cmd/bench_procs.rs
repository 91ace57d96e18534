//! What the benchmarks that run other programs share: children reaped when dropped, scratch
//! directories, free loopback ports, waiting for a listener, and CPU seconds of a process or
//! of reaped children.

use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// /proc reports CPU times in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SEC: f64 = 100.0;

/// A child process killed (and reaped) when dropped.
pub struct Reaped(pub Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory removed when dropped.
pub struct Scratch(pub PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `tool` on PATH, or in the sbin directories a non-root PATH may lack.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits (20 s at most) until something accepts on 127.0.0.1:port.
pub fn wait_port(port: u16, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what} did not listen on 127.0.0.1:{port} within 20 s")
}

/// Starts Debian's tgtd in the foreground on 127.0.0.1:`port` with one target `iqn`, open to
/// every initiator, whose LUN 1 is made by `lun` (tgtadm's words after `--lun 1`: `-b FILE`,
/// or `--bstype rbd --backing-store POOL/IMAGE --bsopts ...`). `env` is added to tgtd's
/// environment; its log is `dir`/tgtd.log, quoted in any error.
pub fn start_tgtd(
    dir: &Path,
    port: u16,
    iqn: &str,
    lun: &[&str],
    env: &[(&str, &OsStr)],
) -> Result<Reaped> {
    let (tgtd, tgtadm) = match (which("tgtd"), which("tgtadm")) {
        (Some(d), Some(a)) => (d, a),
        _ => bail!("tgtd not found: install it with `apt-get install -y tgt`"),
    };
    // tgtd's control "port" names its management socket and must be small.
    let ctl = (100 + port % 10_000).to_string();
    let log = dir.join("tgtd.log");
    let the_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let child = Command::new(tgtd)
        .args(["-f", "-C", &ctl, "--iscsi"])
        .arg(format!("portal=127.0.0.1:{port}"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting tgtd")?;
    let mut guard = Reaped(child);
    if let Err(e) = wait_port(port, "tgtd") {
        let status = guard.0.try_wait().ok().flatten();
        bail!("{e} (exit {status:?}): {}", the_log().trim());
    }
    let target = ["--op", "new", "--mode", "target", "--tid", "1", "-T", iqn];
    let mut unit = vec![
        "--op",
        "new",
        "--mode",
        "logicalunit",
        "--tid",
        "1",
        "--lun",
        "1",
    ];
    unit.extend_from_slice(lun);
    let bind = [
        "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
    ];
    for step in [&target[..], &unit[..], &bind[..]] {
        let st = Command::new(&tgtadm)
            .args(["-C", &ctl, "--lld", "iscsi"])
            .args(step)
            .status()
            .context("running tgtadm")?;
        if !st.success() {
            bail!(
                "tgtadm {} failed ({st}): {}",
                step.join(" "),
                the_log().trim()
            );
        }
    }
    Ok(guard)
}

/// User plus system CPU seconds of process `pid` so far.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (tick(11), tick(12)) {
        (Some(user), Some(sys)) => Ok((user + sys) / TICKS_PER_SEC),
        _ => bail!("/proc/{pid}/stat: no CPU times"),
    }
}

/// User plus system CPU seconds of all the children this process has waited for so far
/// (every thread of each): the difference around one child's run is that child's cost.
pub fn reaped_children_cpu_seconds() -> f64 {
    bench::tcp_rr::rusage_cpu_seconds(libc::RUSAGE_CHILDREN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_of_this_process_and_of_a_reaped_child() {
        assert!(cpu_seconds(std::process::id()).unwrap() >= 0.0);
        let before = reaped_children_cpu_seconds();
        // A child that burns a little CPU: its cost shows up once it is reaped.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        assert!(reaped_children_cpu_seconds() > before);
        assert!(which("sh").is_some());
        assert!(which("no-such-tool-here").is_none());
    }
}
