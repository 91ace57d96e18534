//! A raw TCP request/response over loopback, the floor an iSCSI/TCP command's latency is
//! measured against: a client thread sends a request (48 bytes, an iSCSI command's header)
//! and waits for the answer (4,144 bytes: a 4 KiB read's Data-In with its header), a server
//! thread answers, one round trip at a time, both in this process. Reads block in the kernel
//! as an unpolled reader's do; with `poll` both ends spin on non-blocking reads instead.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct RrConfig {
    /// Round trips timed (after `warmup` untimed ones).
    pub round_trips: u64,
    pub warmup: u64,
    pub request_bytes: usize,
    pub response_bytes: usize,
    /// Spin on non-blocking reads instead of blocking in the kernel, at both ends.
    pub poll: bool,
}

impl Default for RrConfig {
    fn default() -> RrConfig {
        RrConfig {
            round_trips: 20_000,
            warmup: 1_000,
            request_bytes: 48,
            response_bytes: 4_144,
            poll: false,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RrSummary {
    pub round_trips: u64,
    pub seconds: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// CPU seconds this process spent during the timed round trips (both ends).
    pub cpu_seconds: f64,
}

/// The longest one read may wait: a peer gone quiet ends the run instead of hanging it.
const READ_LIMIT: Duration = Duration::from_secs(10);

/// Runs `cfg` over a fresh loopback connection.
pub fn run(cfg: &RrConfig) -> io::Result<RrSummary> {
    if cfg.request_bytes == 0 || cfg.response_bytes == 0 {
        return Err(io::Error::other(
            "request and response need at least a byte",
        ));
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let total = cfg.warmup + cfg.round_trips;
    let server_cfg = cfg.clone();
    let server = std::thread::Builder::new()
        .name("tcp-rr-server".into())
        .spawn(move || -> io::Result<()> {
            let (s, _) = listener.accept()?;
            serve(s, &server_cfg, total)
        })?;
    let client = TcpStream::connect(addr)?;
    let timed = ask(client, cfg, total);
    let served = server
        .join()
        .map_err(|_| io::Error::other("the tcp-rr server thread panicked"))?;
    let (latencies_ns, seconds, cpu_seconds) = timed?;
    served?;
    Ok(summarize(latencies_ns, seconds, cpu_seconds))
}

fn prepare(s: &TcpStream, poll: bool) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(poll)?;
    s.set_read_timeout(Some(READ_LIMIT))
}

fn serve(mut s: TcpStream, cfg: &RrConfig, total: u64) -> io::Result<()> {
    prepare(&s, cfg.poll)?;
    let mut req = vec![0u8; cfg.request_bytes];
    let resp = vec![0x5a; cfg.response_bytes];
    for _ in 0..total {
        read_exact(&mut s, &mut req, cfg.poll)?;
        write_all(&mut s, &resp)?;
    }
    Ok(())
}

/// The client's side: every round trip's latency in nanoseconds (the timed ones), the
/// seconds they took and the process's CPU seconds meanwhile.
fn ask(mut s: TcpStream, cfg: &RrConfig, total: u64) -> io::Result<(Vec<u64>, f64, f64)> {
    prepare(&s, cfg.poll)?;
    let req = vec![0xa5; cfg.request_bytes];
    let mut resp = vec![0u8; cfg.response_bytes];
    let mut latencies = Vec::with_capacity(usize::try_from(cfg.round_trips).unwrap_or(0));
    let (mut started, mut cpu0) = (Instant::now(), process_cpu_seconds());
    for i in 0..total {
        if i == cfg.warmup {
            (started, cpu0) = (Instant::now(), process_cpu_seconds());
        }
        let t = Instant::now();
        write_all(&mut s, &req)?;
        read_exact(&mut s, &mut resp, cfg.poll)?;
        if i >= cfg.warmup {
            latencies.push(t.elapsed().as_nanos() as u64);
        }
    }
    if resp.iter().any(|&b| b != 0x5a) {
        return Err(io::Error::other("the answer came back changed"));
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((latencies, seconds, process_cpu_seconds() - cpu0))
}

/// Fills `buf`: blocking reads, or non-blocking ones tried until the bytes are there (at most
/// [`READ_LIMIT`] either way).
fn read_exact(s: &mut TcpStream, buf: &mut [u8], poll: bool) -> io::Result<()> {
    if !poll {
        return s.read_exact(buf);
    }
    let deadline = Instant::now() + READ_LIMIT;
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                // As the iSCSI/TCP readers poll: other threads with work go first.
                std::thread::yield_now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf`, waiting out a full send buffer on a non-blocking socket (bounded).
fn write_all(s: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + READ_LIMIT;
    let mut sent = 0;
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::hint::spin_loop()
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn summarize(mut ns: Vec<u64>, seconds: f64, cpu_seconds: f64) -> RrSummary {
    ns.sort_unstable();
    let at = |p: f64| -> f64 {
        if ns.is_empty() {
            return 0.0;
        }
        let i = ((ns.len() as f64 * p).ceil() as usize).clamp(1, ns.len()) - 1;
        ns[i] as f64 / 1e3
    };
    let mean = if ns.is_empty() {
        0.0
    } else {
        ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1e3
    };
    RrSummary {
        round_trips: ns.len() as u64,
        seconds,
        p50_us: at(0.50),
        p99_us: at(0.99),
        mean_us: mean,
        cpu_seconds,
    }
}

/// User plus system CPU seconds of this process so far.
pub fn process_cpu_seconds() -> f64 {
    rusage_cpu_seconds(libc::RUSAGE_SELF)
}

/// User plus system CPU seconds `getrusage(who)` reports: `RUSAGE_SELF` (this process) or
/// `RUSAGE_CHILDREN` (the children it has waited for).
pub fn rusage_cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given; on an invalid `who` it fails
    // and leaves the zeroes.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both variants run their round trips over loopback and report ordered percentiles.
    #[test]
    fn round_trips_blocking_and_polled() {
        for poll in [false, true] {
            let s = run(&RrConfig {
                round_trips: 200,
                warmup: 10,
                poll,
                ..RrConfig::default()
            })
            .unwrap();
            assert_eq!(s.round_trips, 200);
            assert!(s.p50_us > 0.0 && s.p50_us <= s.p99_us, "{s:?}");
            assert!(s.mean_us > 0.0 && s.seconds > 0.0, "{s:?}");
        }
    }

    #[test]
    fn percentiles_of_known_latencies() {
        let s = summarize((1..=100).map(|i| i * 1000).collect(), 1.0, 0.0);
        assert_eq!(s.p50_us, 50.0);
        assert_eq!(s.p99_us, 99.0);
        assert_eq!(s.mean_us, 50.5);
    }
}
