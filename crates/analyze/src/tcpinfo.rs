//! TCP flow control seen from inside the stack: `getsockopt(TCP_INFO)` on a live socket,
//! sampled at a fixed interval on a thread (cwnd, ssthresh, rtt, retransmits, delivery rate,
//! unacked), written as a table (CSV/JSON) and plotted as cwnd and throughput over time.
//!
//! ```no_run
//! # use std::os::fd::AsFd;
//! # let stream = std::net::TcpStream::connect("127.0.0.1:3260").unwrap();
//! let sampler = analyze::tcpinfo::TcpInfoSampler::new(stream.as_fd(), std::time::Duration::from_millis(10)).unwrap();
//! // ... run the workload on `stream` ...
//! let samples = sampler.stop();
//! std::fs::write("cwnd.svg", analyze::tcpinfo::cwnd_plot(&samples).to_svg()).unwrap();
//! ```

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use report::{Cell, LinePlot, Series, Table};
use serde::Serialize;

/// The fields of Linux `struct tcp_info` this module reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TcpInfo {
    pub state: u8,
    pub ca_state: u8,
    pub retransmits: u8,
    pub rto_us: u32,
    pub snd_mss: u32,
    pub unacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub rtt_us: u32,
    pub rttvar_us: u32,
    pub snd_ssthresh: u32,
    pub snd_cwnd: u32,
    pub total_retrans: u32,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub delivery_rate: u64,
    pub bytes_sent: u64,
    pub bytes_retrans: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_ne_bytes(a)
    })
}

impl TcpInfo {
    /// Parses the kernel's `struct tcp_info` bytes (offsets from include/uapi/linux/tcp.h);
    /// fields past `len` (older kernels return less) stay 0.
    pub fn parse(b: &[u8]) -> TcpInfo {
        TcpInfo {
            state: b.first().copied().unwrap_or(0),
            ca_state: b.get(1).copied().unwrap_or(0),
            retransmits: b.get(2).copied().unwrap_or(0),
            rto_us: u32_at(b, 8),
            snd_mss: u32_at(b, 16),
            unacked: u32_at(b, 24),
            lost: u32_at(b, 32),
            retrans: u32_at(b, 36),
            rtt_us: u32_at(b, 68),
            rttvar_us: u32_at(b, 72),
            snd_ssthresh: u32_at(b, 76),
            snd_cwnd: u32_at(b, 80),
            total_retrans: u32_at(b, 100),
            bytes_acked: u64_at(b, 120),
            bytes_received: u64_at(b, 128),
            delivery_rate: u64_at(b, 160),
            bytes_sent: u64_at(b, 200),
            bytes_retrans: u64_at(b, 208),
        }
    }
}

/// Reads TCP_INFO of a socket once.
pub fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<TcpInfo> {
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `fd` is a valid open descriptor for the duration of the borrow; `buf` is a
    // writable buffer of `len` bytes and `len` points to its size, which the kernel updates
    // to the number of bytes written (never more than the size given).
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpInfo::parse(&buf[..(len as usize).min(buf.len())]))
}

/// One sample: time since the sampler started and the socket's TCP_INFO.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TcpSample {
    pub t: f64,
    pub info: TcpInfo,
}

/// Samples a socket's TCP_INFO on a thread until stopped. It holds a duplicate of the
/// descriptor, so the socket stays valid while sampled even if the caller closes its copy.
pub struct TcpInfoSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<TcpSample>>>,
}

/// Upper bound on samples kept (about 28 hours at 100 ms, 17 minutes at 1 ms).
pub const MAX_SAMPLES: usize = 1_000_000;

impl TcpInfoSampler {
    pub fn new(fd: BorrowedFd<'_>, interval: Duration) -> io::Result<TcpInfoSampler> {
        let owned: OwnedFd = fd.try_clone_to_owned()?;
        tcp_info(owned.as_fd_ref())?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tcp-info".into())
            .spawn(move || {
                let start = Instant::now();
                let mut out = Vec::new();
                let mut ok = true;
                while !flag.load(Ordering::Relaxed) && out.len() < MAX_SAMPLES {
                    match tcp_info(owned.as_fd_ref()) {
                        Ok(info) => out.push(TcpSample {
                            t: start.elapsed().as_secs_f64(),
                            info,
                        }),
                        Err(_) => {
                            ok = false;
                            break;
                        }
                    }
                    std::thread::sleep(interval);
                }
                // One last sample at the moment of the stop, so the series covers all of
                // the traffic up to it (not only up to the last tick).
                if ok && out.len() < MAX_SAMPLES {
                    if let Ok(info) = tcp_info(owned.as_fd_ref()) {
                        out.push(TcpSample {
                            t: start.elapsed().as_secs_f64(),
                            info,
                        });
                    }
                }
                out
            })?;
        Ok(TcpInfoSampler {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops sampling (after one last sample taken now) and returns the samples.
    pub fn stop(mut self) -> Vec<TcpSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for TcpInfoSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

trait AsFdRef {
    fn as_fd_ref(&self) -> BorrowedFd<'_>;
}
impl AsFdRef for OwnedFd {
    fn as_fd_ref(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.as_fd()
    }
}

/// Throughput between consecutive samples (bytes acked or received, whichever moved), MB/s.
pub fn throughput(samples: &[TcpSample]) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .filter(|w| w[1].t > w[0].t)
        .map(|w| {
            let acked = w[1].info.bytes_acked.saturating_sub(w[0].info.bytes_acked);
            let recv = w[1]
                .info
                .bytes_received
                .saturating_sub(w[0].info.bytes_received);
            (w[1].t, acked.max(recv) as f64 / (w[1].t - w[0].t) / 1e6)
        })
        .collect()
}

const COLUMNS: [&str; 11] = [
    "t_s",
    "cwnd",
    "ssthresh",
    "rtt_us",
    "rttvar_us",
    "retransmits",
    "total_retrans",
    "unacked",
    "delivery_rate_Bps",
    "bytes_acked",
    "bytes_received",
];

fn row(s: &TcpSample) -> [Cell; 11] {
    let i = &s.info;
    [
        Cell::float(s.t, 4),
        Cell::from(i.snd_cwnd),
        Cell::from(i.snd_ssthresh),
        Cell::from(i.rtt_us),
        Cell::from(i.rttvar_us),
        Cell::from(i.retransmits as u32),
        Cell::from(i.total_retrans),
        Cell::from(i.unacked),
        Cell::from(i.delivery_rate),
        Cell::from(i.bytes_acked),
        Cell::from(i.bytes_received),
    ]
}

/// The samples as a table (print it, or `to_csv` / `to_json`).
pub fn table(samples: &[TcpSample]) -> Table {
    let mut t = Table::new(COLUMNS);
    for s in samples {
        t.push_row(row(s));
    }
    t
}

/// The samples of several sockets, each under a name: one table with a leading `conn` column.
pub fn table_named(conns: &[(String, Vec<TcpSample>)]) -> Table {
    let mut t = Table::new(std::iter::once("conn").chain(COLUMNS));
    for (name, samples) in conns {
        for s in samples {
            t.push_row(std::iter::once(Cell::from(name.clone())).chain(row(s)));
        }
    }
    t
}

/// Splits one CSV line into fields (double quotes around a field that holds a comma or a
/// quote, as [`Table::to_csv`] writes).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// One socket's samples read back from a file, with its name when the file had a `conn` column.
pub type NamedSamples = (Option<String>, Vec<TcpSample>);

/// Samples read back from CSV that [`table`] (`ironsan target --tcp-info DIR`, one socket per
/// file) or [`table_named`] (`ironsan bench --tcp-info FILE`, a leading `conn` column) wrote:
/// one entry per socket in the order first seen, with its name (None without a `conn`
/// column). Columns are found by their header; only `t_s` is required, absent ones read 0.
/// The times are seconds since the sampler started: the file holds no wall-clock time.
pub fn read_csv(text: &str) -> Result<Vec<NamedSamples>, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Ok(Vec::new());
    };
    let header = csv_fields(header);
    let col = |name: &str| header.iter().position(|h| h.trim() == name);
    let t_col = col("t_s").ok_or("no t_s column: not a TCP_INFO samples file")?;
    let conn_col = col("conn");
    // The columns the writer puts after t_s, in its order.
    let cols: [Option<usize>; 10] = std::array::from_fn(|i| col(COLUMNS[i + 1]));
    let mut out: Vec<NamedSamples> = Vec::new();
    for (n, line) in lines {
        let f = csv_fields(line);
        let num = |c: Option<usize>| -> Result<u64, String> {
            match c.and_then(|c| f.get(c)).map(|s| s.trim()) {
                None | Some("") => Ok(0),
                Some(s) => s
                    .parse::<u64>()
                    .map_err(|_| format!("line {}: {s:?} is not a whole number", n + 1)),
            }
        };
        let t: f64 = f
            .get(t_col)
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("line {}: no time in column t_s", n + 1))?;
        let v = cols.map(num);
        let [cwnd, ssthresh, rtt, rttvar, retransmits, total_retrans, unacked, rate, acked, received] =
            v;
        let info = TcpInfo {
            snd_cwnd: cwnd? as u32,
            snd_ssthresh: ssthresh? as u32,
            rtt_us: rtt? as u32,
            rttvar_us: rttvar? as u32,
            retransmits: retransmits?.min(255) as u8,
            total_retrans: total_retrans? as u32,
            unacked: unacked? as u32,
            delivery_rate: rate?,
            bytes_acked: acked?,
            bytes_received: received?,
            ..TcpInfo::default()
        };
        let name = conn_col.and_then(|c| f.get(c)).cloned();
        let sample = TcpSample { t, info };
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(sample),
            None => out.push((name, vec![sample])),
        }
    }
    Ok(out)
}

/// Congestion window and throughput over time of several named sockets, one line per
/// socket, as one SVG: the cwnd plot above the throughput plot.
pub fn cwnd_throughput_svg(conns: &[(String, Vec<TcpSample>)]) -> String {
    let cwnd = LinePlot {
        title: "TCP congestion window (TCP_INFO)".into(),
        x_label: "time (s)".into(),
        y_label: "cwnd (segments)".into(),
        series: conns
            .iter()
            .map(|(n, s)| {
                Series::new(
                    n.clone(),
                    s.iter().map(|s| (s.t, s.info.snd_cwnd as f64)).collect(),
                )
            })
            .collect(),
        ..LinePlot::default()
    };
    let tput = LinePlot {
        title: "Throughput (bytes acked or received between samples)".into(),
        x_label: "time (s)".into(),
        y_label: "MB/s".into(),
        series: conns
            .iter()
            .map(|(n, s)| Series::new(n.clone(), throughput(s)))
            .collect(),
        ..LinePlot::default()
    };
    stack_svgs(&[cwnd.to_svg(), tput.to_svg()])
}

/// Puts whole SVG documents one below the other in one document (each keeps its own
/// coordinates inside a nested `<svg>` placed by `y`).
fn stack_svgs(parts: &[String]) -> String {
    let size = |doc: &str, attr: &str| -> f64 {
        let key = format!("{attr}=\"");
        doc.find(&key)
            .and_then(|i| {
                let rest = &doc[i + key.len()..];
                rest[..rest.find('"')?].parse().ok()
            })
            .unwrap_or(0.0)
    };
    let width = parts.iter().map(|p| size(p, "width")).fold(0.0, f64::max);
    let mut y = 0.0;
    let mut body = String::new();
    for p in parts {
        let start = p.find("<svg").unwrap_or(0);
        let inner = &p[start..];
        body.push_str(&inner.replacen("<svg", &format!("<svg y=\"{y}\""), 1));
        body.push('\n');
        y += size(p, "height");
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{y}\" viewBox=\"0 0 {width} {y}\">\n{body}</svg>\n"
    )
}

/// Congestion window (segments) over time.
pub fn cwnd_plot(samples: &[TcpSample]) -> LinePlot {
    LinePlot {
        title: "TCP congestion window".into(),
        x_label: "time (s)".into(),
        y_label: "segments".into(),
        series: vec![
            Series::new(
                "cwnd",
                samples
                    .iter()
                    .map(|s| (s.t, s.info.snd_cwnd as f64))
                    .collect(),
            ),
            Series::new(
                "ssthresh",
                samples
                    .iter()
                    .filter(|s| s.info.snd_ssthresh < 0x7fff_ffff)
                    .map(|s| (s.t, s.info.snd_ssthresh as f64))
                    .collect(),
            ),
        ],
        ..LinePlot::default()
    }
}

/// Throughput over time (MB/s).
pub fn throughput_plot(samples: &[TcpSample]) -> LinePlot {
    LinePlot {
        title: "Throughput from TCP_INFO".into(),
        x_label: "time (s)".into(),
        y_label: "MB/s".into(),
        series: vec![Series::new("throughput", throughput(samples))],
        ..LinePlot::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn samples_a_real_loopback_transfer() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0usize;
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n;
            }
            total
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let sampler = TcpInfoSampler::new(c.as_fd(), Duration::from_millis(1)).unwrap();
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..32 {
            c.write_all(&chunk).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let samples = sampler.stop();
        drop(c);
        assert_eq!(reader.join().unwrap(), 32 << 20);
        assert!(samples.len() >= 2);
        let last = samples.last().unwrap().info;
        // TCP_ESTABLISHED = 1; all 32 MiB were acknowledged before the last sample.
        assert_eq!(last.state, 1);
        assert!(last.snd_cwnd >= 10, "cwnd {}", last.snd_cwnd);
        assert!(last.snd_mss > 0);
        assert!(last.bytes_acked >= 32 << 20, "acked {}", last.bytes_acked);
        let csv = table(&samples).to_csv();
        assert_eq!(csv.lines().count(), samples.len() + 1);
        assert!(cwnd_plot(&samples).to_svg().contains("cwnd"));
        let named = vec![("c0".to_string(), samples.clone())];
        let csv = table_named(&named).to_csv();
        assert!(csv.starts_with("conn,t_s,cwnd,"), "{csv}");
        assert_eq!(csv.lines().count(), samples.len() + 1);
        let svg = cwnd_throughput_svg(&named);
        let doc = roxmltree::Document::parse(&svg).expect("the stacked SVG parses");
        let panels = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("svg"))
            .map(|n| n.attribute("y").unwrap().parse::<f64>().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(panels.len(), 2, "cwnd and throughput panels");
        assert!(panels[1] > panels[0]);
    }

    /// What `ironsan bench --tcp-info` and `ironsan target --tcp-info` write reads back.
    #[test]
    fn csv_reads_back() {
        let sample = |t: f64, cwnd: u32, acked: u64| TcpSample {
            t,
            info: TcpInfo {
                snd_cwnd: cwnd,
                snd_ssthresh: 0x7fff_ffff,
                rtt_us: 55,
                rttvar_us: 7,
                total_retrans: 2,
                unacked: 3,
                delivery_rate: 123_456_789,
                bytes_acked: acked,
                bytes_received: 99,
                ..TcpInfo::default()
            },
        };
        let a = vec![sample(0.0, 10, 0), sample(0.1, 20, 1 << 20)];
        let b = vec![sample(0.05, 7, 5)];
        let named = vec![("s0c0".to_string(), a.clone()), ("s1c0".to_string(), b)];
        let back = read_csv(&table_named(&named).to_csv()).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].0.as_deref(), Some("s0c0"));
        assert_eq!(back[1].0.as_deref(), Some("s1c0"));
        assert_eq!(back[0].1.len(), 2);
        assert_eq!(back[0].1[1].t, 0.1);
        assert_eq!(back[0].1[1].info, a[1].info);
        assert_eq!(back[1].1[0].info.snd_cwnd, 7);
        let single = read_csv(&table(&a).to_csv()).unwrap();
        assert_eq!(single.len(), 1);
        assert_eq!(single[0].0, None);
        assert_eq!(single[0].1[1].info, a[1].info);
        let err = read_csv("t_s,cwnd\n0.1,ten\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(read_csv("a,b\n1,2\n").is_err());
    }

    #[test]
    fn not_a_socket_is_an_error() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(tcp_info(f.as_fd()).is_err());
    }
}
