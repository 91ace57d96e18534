//! `ironsan bench tcp-rr`: a raw TCP request/response over loopback ([`bench::tcp_rr`]), the
//! floor an iSCSI/TCP command's latency is compared with: client and server threads in this
//! process, a 48-byte request and a 4,144-byte answer by default, blocking reads (and, with
//! `--poll`, spinning non-blocking reads too, alternating round by round).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bench::tcp_rr::{self, RrConfig, RrSummary};
use report::{Cell, Table};

#[derive(clap::Args)]
pub struct TcpRrArgs {
    /// Round trips timed per round and variant.
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: u64,
    /// Untimed round trips before them.
    #[arg(long, default_value_t = 1_000)]
    pub warmup: u64,
    /// Bytes of each request (an iSCSI command's header: 48).
    #[arg(long, default_value_t = 48)]
    pub request_bytes: usize,
    /// Bytes of each answer (a 4 KiB read's Data-In with its 48-byte header: 4144).
    #[arg(long, default_value_t = 4_144)]
    pub response_bytes: usize,
    /// Also measure both ends spinning on non-blocking reads instead of blocking.
    #[arg(long)]
    pub poll: bool,
    /// Rounds (each measures every variant, alternating which goes first); the table sums
    /// them (percentiles: the median of the rounds').
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Write the table as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the table as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
}

/// The variants' names, blocking first.
pub const VARIANTS: [&str; 2] = ["blocking", "poll"];

pub fn run(a: TcpRrArgs) -> Result<()> {
    if a.rounds == 0 || a.round_trips == 0 {
        bail!("--rounds and --round-trips must be positive");
    }
    let variants = if a.poll { 2 } else { 1 };
    let mut runs: Vec<Vec<RrSummary>> = vec![Vec::new(); variants];
    for round in 0..a.rounds as usize {
        for k in 0..variants {
            let v = (k + round) % variants;
            let s = measure(&a, v == 1)?;
            runs[v].push(s);
        }
    }
    let mut table = Table::new([
        "variant",
        "request B",
        "answer B",
        "round trips",
        "p50 us",
        "p99 us",
        "mean us",
        "CPU us/round trip",
    ]);
    for (v, rs) in runs.iter().enumerate() {
        let c = combine(rs);
        table.push_row([
            Cell::Text(VARIANTS[v].into()),
            Cell::Int(a.request_bytes as i64),
            Cell::Int(a.response_bytes as i64),
            Cell::Int(c.round_trips as i64),
            Cell::float(c.p50_us, 1),
            Cell::float(c.p99_us, 1),
            Cell::float(c.mean_us, 1),
            Cell::float(c.cpu_seconds * 1e6 / c.round_trips.max(1) as f64, 1),
        ]);
    }
    print!("{table}");
    if let Some(p) = &a.json {
        std::fs::write(p, table.to_json_string())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, table.to_csv()).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// One run of `a`'s sizes and counts, blocking or polled.
pub fn measure(a: &TcpRrArgs, poll: bool) -> Result<RrSummary> {
    tcp_rr::run(&RrConfig {
        round_trips: a.round_trips,
        warmup: a.warmup,
        request_bytes: a.request_bytes,
        response_bytes: a.response_bytes,
        poll,
    })
    .context("tcp-rr over loopback")
}

/// Several rounds as one: counts, seconds and CPU summed, the mean weighted by round trips,
/// percentiles the median of the rounds'.
pub fn combine(rs: &[RrSummary]) -> RrSummary {
    let median = |f: fn(&RrSummary) -> f64| {
        let mut v: Vec<f64> = rs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let round_trips: u64 = rs.iter().map(|r| r.round_trips).sum();
    RrSummary {
        round_trips,
        seconds: rs.iter().map(|r| r.seconds).sum(),
        p50_us: median(|r| r.p50_us),
        p99_us: median(|r| r.p99_us),
        mean_us: rs
            .iter()
            .map(|r| r.mean_us * r.round_trips as f64)
            .sum::<f64>()
            / round_trips.max(1) as f64,
        cpu_seconds: rs.iter().map(|r| r.cpu_seconds).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run of both variants over two rounds writes a row per variant with its
    /// round trips and ordered latencies.
    #[test]
    fn a_short_run_writes_both_variants() {
        let json = std::env::temp_dir().join(format!("tcp-rr-{}.json", std::process::id()));
        run(TcpRrArgs {
            round_trips: 100,
            warmup: 5,
            request_bytes: 48,
            response_bytes: 4144,
            poll: true,
            rounds: 2,
            json: Some(json.clone()),
            csv: None,
        })
        .unwrap();
        let text = std::fs::read_to_string(&json).unwrap();
        let _ = std::fs::remove_file(&json);
        let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
        let rows = rows.as_array().expect("rows");
        assert_eq!(rows.len(), 2, "{text}");
        for (row, name) in rows.iter().zip(VARIANTS) {
            assert_eq!(row["variant"], name);
            assert_eq!(row["round trips"], 200);
            let (p50, p99) = (
                row["p50 us"].as_f64().unwrap(),
                row["p99 us"].as_f64().unwrap(),
            );
            assert!(p50 > 0.0 && p50 <= p99, "{row}");
        }
    }

    #[test]
    fn rounds_combine_into_medians_and_sums() {
        let r = |p50_us, n| RrSummary {
            round_trips: n,
            seconds: 1.0,
            p50_us,
            p99_us: p50_us * 2.0,
            mean_us: p50_us,
            cpu_seconds: 0.5,
        };
        let c = combine(&[r(10.0, 100), r(30.0, 100), r(20.0, 200)]);
        assert_eq!(c.round_trips, 400);
        assert_eq!(c.p50_us, 20.0);
        assert_eq!(c.mean_us, 20.0);
        assert_eq!(c.cpu_seconds, 1.5);
    }
}
