//! The long-delay experiment: for each one-way delay d and block size B, sequential
//! commands with one outstanding through the delay proxy (rate R), compared with the model
//! throughput = B / (k·d + B/R), where k is the number of one-way trips a command needs:
//! 4 for a WRITE with InitialR2T=Yes and no immediate data (command, R2T, data, status:
//! the model of the brief), 2 for a READ (command, data+status). The baseline is a raw TCP
//! stream through the same proxy. The commands come from the ironsan initiator library.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use report::{Cell, LinePlot, Series, Table, TickLabels};
use serde::Serialize;

use bytes::Bytes;
use iscsi_initiator::{IscsiUrl, SessionConfig};

use crate::proxy::{DelayProxy, ProxyConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
}

impl Op {
    /// One-way trips per command with one outstanding.
    pub fn trips(self) -> f64 {
        match self {
            Op::Read => 2.0,
            Op::Write => 4.0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ExperimentConfig {
    pub target: SocketAddr,
    pub target_name: String,
    pub lun: u16,
    pub delays_ms: Vec<f64>,
    pub block_sizes: Vec<u32>,
    pub ops: Vec<Op>,
    /// Link rate in bytes/s (None: unlimited, R taken from the baseline at delay 0).
    pub rate: Option<f64>,
    /// Measuring time per point.
    pub duration: Duration,
    /// At least this many commands per point (after one warm-up command).
    pub min_commands: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub op: Op,
    pub delay_ms: f64,
    pub block: u32,
    pub commands: u32,
    pub measured_mbps: f64,
    /// B / (trips·d + B/R).
    pub model_mbps: f64,
    /// The brief's model B / (4·d + B/R), whatever the op.
    pub model4_mbps: f64,
    pub baseline_mbps: f64,
}

impl Point {
    pub fn ratio(&self) -> f64 {
        self.measured_mbps / self.model_mbps
    }
}

/// The model, bytes/s.
pub fn model(block: f64, one_way_s: f64, trips: f64, rate: f64) -> f64 {
    block / (trips * one_way_s + block / rate)
}

/// Raw TCP stream through a proxy with this delay and rate, bytes/s.
pub fn baseline(delay: Duration, rate: Option<f64>, duration: Duration) -> io::Result<f64> {
    let server = TcpListener::bind("127.0.0.1:0")?;
    let upstream = server.local_addr()?;
    let sender = std::thread::spawn(move || -> io::Result<()> {
        let (mut s, _) = server.accept()?;
        let buf = vec![0u8; 256 * 1024];
        // Ends when the client closes.
        while s.write_all(&buf).is_ok() {}
        Ok(())
    });
    let mut cfg = ProxyConfig::new("127.0.0.1:0".parse().expect("literal"), upstream, delay);
    cfg.rate = rate;
    let proxy = DelayProxy::start(cfg)?;
    let mut c = TcpStream::connect(proxy.local_addr())?;
    c.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut buf = vec![0u8; 256 * 1024];
    // Warm up: the first bytes include the pipeline fill of one delay.
    let mut got = 0usize;
    while got < 64 * 1024 {
        got += c.read(&mut buf)?;
    }
    let start = Instant::now();
    let mut bytes = 0usize;
    while start.elapsed() < duration {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        bytes += n;
    }
    let rate = bytes as f64 / start.elapsed().as_secs_f64();
    drop(c);
    drop(proxy);
    let _ = sender.join();
    Ok(rate)
}

/// Sequential commands of `block` bytes with one outstanding through the proxy, bytes/s
/// and the number of commands measured. The commands are the ironsan initiator's, on a
/// session negotiated to keep the model's trip count: one connection, no digests,
/// InitialR2T=Yes and ImmediateData=No (a WRITE waits for its R2T), MaxOutstandingR2T=1,
/// and each command exactly `block` bytes (one READ or WRITE, never split).
pub fn measure(
    cfg: &ExperimentConfig,
    op: Op,
    delay: Duration,
    block: u32,
) -> io::Result<(f64, u32)> {
    let mut pcfg = ProxyConfig::new("127.0.0.1:0".parse().expect("literal"), cfg.target, delay);
    pcfg.rate = cfg.rate;
    let proxy = DelayProxy::start(pcfg)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(measure_session(cfg, op, proxy.local_addr(), block))
        .map_err(|e| io::Error::other(e.to_string()))
}

/// The session settings that keep the model's trips per command.
pub fn session_config(url: &IscsiUrl) -> SessionConfig {
    SessionConfig {
        connections: 1,
        immediate_data: false,
        initial_r2t: true,
        max_outstanding_r2t: 1,
        max_recv_data_segment_length: 262_144,
        max_burst_length: 16_776_192,
        first_burst_length: 262_144,
        nop_interval: None,
        ..SessionConfig::from_url(url)
    }
}

async fn measure_session(
    cfg: &ExperimentConfig,
    op: Op,
    via: SocketAddr,
    block: u32,
) -> Result<(f64, u32), iscsi_initiator::Error> {
    let url = IscsiUrl::parse_lun(&format!("iscsi://{via}/{}/{}", cfg.target_name, cfg.lun))?;
    let s = transports::connect_session(&url, session_config(&url)).await?;
    let lun = cfg.lun;
    s.test_unit_ready(lun).await?;
    let cap = s.capacity(lun).await?;
    let bs = cap.block_size.max(1);
    let per = (block / bs).max(1);
    let span = cap.blocks.saturating_sub(per as u64).max(1);
    let data = Bytes::from(vec![0x5au8; (per * bs) as usize]);
    let one = |lba: u64| {
        let s = &s;
        let data = data.clone();
        async move {
            match op {
                Op::Read => s.read(lun, lba, per, bs).await.map(|_| ()),
                Op::Write => s.write(lun, lba, bs, data).await,
            }
        }
    };
    let mut lba = 0u64;
    one(lba).await?;
    let start = Instant::now();
    let mut n = 0u32;
    // Bounded by time and count.
    while (start.elapsed() < cfg.duration || n < cfg.min_commands) && n < 1_000_000 {
        lba = (lba + per as u64) % span;
        one(lba).await?;
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = s.logout().await;
    Ok((n as f64 * (per * bs) as f64 / secs, n))
}

/// Runs the sweep; `progress` is told about each point as it is measured.
pub fn run(cfg: &ExperimentConfig, mut progress: impl FnMut(&Point)) -> io::Result<Vec<Point>> {
    let mut points = Vec::new();
    let mut rate = cfg.rate;
    for &d in &cfg.delays_ms {
        let delay = Duration::from_secs_f64(d / 1e3);
        let base = baseline(delay, cfg.rate, cfg.duration)?;
        let r = *rate.get_or_insert(base);
        for &op in &cfg.ops {
            for &b in &cfg.block_sizes {
                let (measured, n) = measure(cfg, op, delay, b)?;
                let p = Point {
                    op,
                    delay_ms: d,
                    block: b,
                    commands: n,
                    measured_mbps: measured / 1e6,
                    model_mbps: model(b as f64, d / 1e3, op.trips(), r) / 1e6,
                    model4_mbps: model(b as f64, d / 1e3, 4.0, r) / 1e6,
                    baseline_mbps: base / 1e6,
                };
                progress(&p);
                points.push(p);
            }
        }
    }
    Ok(points)
}

pub fn table(points: &[Point]) -> Table {
    let mut t = Table::new([
        "op",
        "delay_ms",
        "block",
        "commands",
        "measured_MB/s",
        "model_MB/s",
        "measured/model",
        "model_4d_MB/s",
        "baseline_MB/s",
        "of_baseline",
    ]);
    for p in points {
        t.push_row([
            Cell::Text(format!("{:?}", p.op).to_lowercase()),
            Cell::float(p.delay_ms, 1),
            Cell::Text(report::format_size(p.block as u64)),
            Cell::from(p.commands),
            Cell::float(p.measured_mbps, 3),
            Cell::float(p.model_mbps, 3),
            Cell::float(p.ratio(), 3),
            Cell::float(p.model4_mbps, 3),
            Cell::float(p.baseline_mbps, 3),
            Cell::float(p.measured_mbps / p.baseline_mbps, 3),
        ]);
    }
    t
}

/// Throughput against delay: measured and model per (op, block), and the socket baseline.
pub fn plot(points: &[Point]) -> LinePlot {
    let mut series = Vec::new();
    let mut keys: Vec<(Op, u32)> = points.iter().map(|p| (p.op, p.block)).collect();
    keys.dedup();
    keys.sort_by_key(|k| (k.0 == Op::Write, k.1));
    keys.dedup();
    for (op, b) in keys {
        let pts: Vec<&Point> = points
            .iter()
            .filter(|p| p.op == op && p.block == b)
            .collect();
        let name = format!(
            "{} {}",
            format!("{op:?}").to_lowercase(),
            report::format_size(b as u64)
        );
        series.push(Series::new(
            format!("{name} measured"),
            pts.iter().map(|p| (p.delay_ms, p.measured_mbps)).collect(),
        ));
        series.push(Series::new(
            format!("{name} model"),
            pts.iter().map(|p| (p.delay_ms, p.model_mbps)).collect(),
        ));
    }
    let mut base: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.delay_ms, p.baseline_mbps))
        .collect();
    base.dedup_by(|a, b| a.0 == b.0);
    series.push(Series::new("socket baseline", base));
    LinePlot {
        title: "Sequential I/O, one command outstanding, through the delay proxy".into(),
        x_label: "one-way delay (ms)".into(),
        y_label: "MB/s".into(),
        y_log: true,
        x_ticks: TickLabels::Number,
        series,
        ..LinePlot::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_limits() {
        // No delay: the link rate.
        assert_eq!(model(32768.0, 0.0, 4.0, 1e6), 1e6);
        // 32 KiB, 10 ms one way, 4 trips, 100 MB/s: 32768 / (0.04 + 0.00032768).
        let m = model(32768.0, 0.01, 4.0, 1e8);
        assert!((m - 32768.0 / 0.040_327_68).abs() < 1e-6);
    }

    #[test]
    fn baseline_through_a_rate_limited_proxy_is_below_the_rate() {
        let r = baseline(Duration::ZERO, Some(20e6), Duration::from_millis(300)).unwrap();
        assert!(r < 20e6 * 1.1, "{r}");
        assert!(r > 0.0);
    }
}
