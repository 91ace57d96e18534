//! TCP flow control seen from inside the stack, as data: the fields of Linux `struct
//! tcp_info` (cwnd, ssthresh, rtt, retransmits, delivery rate, unacked), samples of them over
//! time, written and read back as a table (CSV/JSON) and plotted as cwnd and throughput over
//! time. The live sampler (`getsockopt(TCP_INFO)` on a thread) is in the `lab` crate.

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

/// One sample: time since the sampler started and the socket's TCP_INFO.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TcpSample {
    pub t: f64,
    pub info: TcpInfo,
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
}
