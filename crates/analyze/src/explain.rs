//! `ironsan analyze --explain`: why the SAN in a capture is as fast as it is. The time of
//! the busy period (first command to last status) is divided among the things commands
//! waited for; each limit found gets its share of that time, the evidence, what to change,
//! and the throughput bound it implies on its own (measured / share: with N commands of S
//! bytes outstanding and latency L, throughput is N·S/L, so a part t of L caps it at N·S/t,
//! e.g. outstanding × size / RTT for the round trip every command pays). Limits are ranked by
//! share, largest (lowest bound) first.
//!
//! The round trip is taken from exchanges that need no storage work (login, text and NOP
//! pairs, commands such as TEST UNIT READY or INQUIRY, a WRITE's first R2T), the smallest
//! seen: a relay in the path (a WAN optimiser, the delay proxy) acknowledges TCP segments
//! itself, so TCP's own round trip would miss the delay behind it.

use std::collections::HashMap;

use serde::Serialize;

use crate::analysis::Analysis;
use crate::negotiated::Negotiated;
use crate::phases::{command_phases, p50_p99, percentile, CommandPhases, IoDir};
use crate::stats::{idle_between, packet_times, StatsOptions};
use crate::tcp::TcpEventKind;
use crate::window::{window_stats, WindowStats};

/// A limit's share below this is not reported.
const MIN_SHARE: f64 = 0.05;

/// Which limit a finding names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// Commands split smaller than the application's I/O: sequential pieces back to back.
    SplitCommands,
    /// WRITEs waiting for R2Ts (or RDMA Read Requests): a round trip per burst.
    R2tRoundTrips,
    /// Too few commands outstanding for the bandwidth-delay product.
    TooFewOutstanding,
    /// The target takes long between a command and its data or status.
    TargetServiceTime,
    /// The receiver's TCP window full: window / RTT bounds the transfer.
    TcpWindow,
    /// TCP retransmissions: time stalled until a lost segment came again.
    Losses,
    /// Both ends slow while nothing waits on the network or the target (CPU, digests,
    /// copies, the application between commands).
    HostCost,
    /// The wire is busy: the path's bandwidth.
    LinkBandwidth,
}

impl Limit {
    pub fn title(self) -> &'static str {
        match self {
            Limit::SplitCommands => "commands split smaller than the application's I/O",
            Limit::R2tRoundTrips => "R2T round trips on writes",
            Limit::TooFewOutstanding => "too few commands outstanding for the round trip",
            Limit::TargetServiceTime => "target service time",
            Limit::TcpWindow => "the TCP receive window",
            Limit::Losses => "losses and retransmissions",
            Limit::HostCost => "host cost: CPU, digests or the application",
            Limit::LinkBandwidth => "link bandwidth (the wire is busy)",
        }
    }
}

/// One limit found.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub rank: usize,
    pub limit: Limit,
    pub title: &'static str,
    /// Part of the busy period this limit accounts for (0..1).
    pub share: f64,
    /// Throughput this limit alone allows, MB/s (10^6 bytes).
    pub bound_mbps: f64,
    pub measured_mbps: f64,
    pub evidence: Vec<String>,
    pub change: String,
}

/// How the round trip was found.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoundTrip {
    pub us: f64,
    pub samples: usize,
    /// False: no exchange without storage work was seen; the shortest command stands in.
    pub from_exchanges: bool,
}

/// The workload the capture shows.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub reads: usize,
    pub writes: usize,
    pub data_bytes: u64,
    pub duration_s: f64,
    pub measured_mbps: f64,
    pub mean_command_bytes: f64,
    /// Time-weighted over the busy period (Little's law: the sum of latencies over the span).
    pub mean_outstanding: f64,
    pub max_outstanding: usize,
    pub mean_latency_us: f64,
    /// Part of the busy period with no command outstanding.
    pub none_outstanding_share: f64,
    /// Part of the busy period with no packet for at least the idle gap.
    pub link_idle_share: f64,
    /// Part of the busy period during which some command's data was moving (from its first
    /// data to its last).
    pub data_moving_share: f64,
    pub round_trip: RoundTrip,
    pub header_digest: bool,
    pub data_digest: bool,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    pub workload: Option<Workload>,
    pub findings: Vec<Finding>,
    /// Why there is nothing to rank, when there is not.
    pub note: Option<String>,
}

/// Each data command's time, split into what it waited for (µs).
#[derive(Debug, Clone, Copy, Default)]
struct TimeSplit {
    latency: f64,
    round_trip: f64,
    r2t_waits: f64,
    service: f64,
    transfer: f64,
    unexplained: f64,
}

impl TimeSplit {
    /// `queued_us`: of a READ's wait for data, the part its connection was still carrying
    /// earlier commands' data (see [`read_queueing`]); it counts as transfer, not service.
    fn of(c: &CommandPhases, rtt: f64, queued_us: f64) -> TimeSplit {
        let latency = c.total_us.unwrap_or(0.0);
        // A WRITE's solicited data moves in its bursts; between them it waits for R2Ts.
        let transfer = if c.bursts.is_empty() {
            c.transfer_us.unwrap_or(0.0)
        } else {
            c.bursts.iter().filter_map(|b| b.transfer_us).sum()
        };
        // The phase that holds the command's one unavoidable round trip, with the target's
        // work: a READ's wait for data, a WRITE's wait for status.
        let (waited, r2t_waits) = match c.dir {
            IoDir::Read => (c.service_us.unwrap_or(0.0), 0.0),
            _ => (
                c.status_us.unwrap_or(0.0),
                c.bursts.iter().map(|b| b.r2t_wait_us).sum(),
            ),
        };
        let queued = queued_us.min(waited);
        let round_trip = rtt.min(waited - queued);
        let service = waited - queued - round_trip;
        let transfer = transfer + queued;
        let unexplained = (latency - round_trip - service - r2t_waits - transfer).max(0.0);
        TimeSplit {
            latency,
            round_trip,
            r2t_waits,
            service,
            transfer,
            unexplained,
        }
    }

    fn add(mut self, o: TimeSplit) -> TimeSplit {
        self.latency += o.latency;
        self.round_trip += o.round_trip;
        self.r2t_waits += o.r2t_waits;
        self.service += o.service;
        self.transfer += o.transfer;
        self.unexplained += o.unexplained;
        self
    }
}

/// Explains a capture.
pub fn explain(a: &Analysis, opts: &StatsOptions) -> Diagnosis {
    explain_phases(a, &command_phases(a), opts)
}

/// Explains a capture whose command phases ([`command_phases`]) are already worked out.
pub fn explain_phases(a: &Analysis, cmds: &[CommandPhases], opts: &StatsOptions) -> Diagnosis {
    // The READs and WRITEs (not INQUIRY and the like) that completed.
    let data: Vec<&CommandPhases> = cmds
        .iter()
        .filter(|c| c.dir != IoDir::Other && c.lba.is_some() && c.total_us.is_some())
        .collect();
    if data.is_empty() {
        return Diagnosis {
            workload: None,
            findings: Vec::new(),
            note: Some("no completed READ or WRITE in the capture: nothing to explain".into()),
        };
    }
    let rtt = round_trip(a, cmds, &data);
    let w = workload(a, &data, rtt, opts);
    let queued = read_queueing(&data);
    let splits: Vec<TimeSplit> = data
        .iter()
        .zip(&queued)
        .map(|(c, &q)| TimeSplit::of(c, rtt.us, q))
        .collect();
    let split = splits
        .iter()
        .copied()
        .fold(TimeSplit::default(), TimeSplit::add);
    let mut findings = Vec::new();
    findings.extend(split_commands(&data, &w, &split));
    findings.extend(r2t_round_trips(a, &data, &w, &split));
    findings.extend(too_few_outstanding(&w, &split));
    findings.extend(target_service_time(&data, &splits, &w, &split));
    let window = tcp_window(a, &w);
    // Data trickling against a full window keeps commands in transfer without the wire
    // being busy: that time is the window's, not the link's.
    let window_time = window.as_ref().map_or(0.0, |f| f.share);
    findings.extend(window);
    let loss = losses(a, &w);
    // A stall after a loss may look like time with nothing outstanding (the status was lost
    // after the capture point): it is the loss's, not the hosts'.
    let stalled = loss.as_ref().map_or(0.0, |f| f.share);
    findings.extend(loss);
    findings.extend(host_cost(&w, &split, stalled));
    findings.extend(link_bandwidth(&w, &split, window_time));
    // Stable: at equal shares the more specific cause (listed first above) stays first.
    findings.sort_by(|x, y| y.share.total_cmp(&x.share));
    findings.retain(|f| f.share >= MIN_SHARE);
    for (i, f) in findings.iter_mut().enumerate() {
        f.rank = i + 1;
    }
    Diagnosis {
        workload: Some(w),
        findings,
        note: None,
    }
}

/// For each command (in `data`'s order), how long a READ's first data could not have left
/// because its connection was still carrying earlier READs' data: a stream delivers in order,
/// so with several READs outstanding a late first Data-In is queueing behind the others'
/// transfer (the link's or the window's time), not the target's work.
fn read_queueing(data: &[&CommandPhases]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..data.len()).collect();
    order.sort_by_key(|&i| (data[i].conn, data[i].start_ns));
    let mut queued = vec![0.0; data.len()];
    // Per connection: when the data of the READs before this one had all gone by.
    let mut busy_until: HashMap<usize, u64> = HashMap::new();
    for i in order {
        let c = data[i];
        if c.dir != IoDir::Read {
            continue;
        }
        let (Some(service), Some(transfer)) = (c.service_us, c.transfer_us) else {
            continue;
        };
        let until = busy_until.entry(c.conn).or_insert(0);
        queued[i] = us_between(c.start_ns, *until).min(service);
        let last_data = c.start_ns + ((service + transfer) * 1e3) as u64;
        *until = (*until).max(last_data);
    }
    queued
}

fn us_between(from_ns: u64, to_ns: u64) -> f64 {
    to_ns.saturating_sub(from_ns) as f64 / 1e3
}

/// The smallest round trip among exchanges that need no storage work.
fn round_trip(a: &Analysis, cmds: &[CommandPhases], data: &[&CommandPhases]) -> RoundTrip {
    let mut samples: Vec<f64> = Vec::new();
    let mut asked: HashMap<(usize, u32), u64> = HashMap::new();
    for p in &a.pdus {
        let Some(itt) = p.itt.filter(|&t| t != 0xffff_ffff) else {
            continue;
        };
        match p.opcode {
            // Login, Text, NOP-Out, Logout.
            0x03 | 0x04 | 0x00 | 0x06 => {
                asked.insert((p.conn, itt), p.ts_ns);
            }
            0x23 | 0x24 | 0x20 | 0x26 => {
                if let Some(t) = asked.remove(&(p.conn, itt)) {
                    samples.push(us_between(t, p.ts_ns));
                }
            }
            _ => {}
        }
    }
    const NO_STORAGE_WORK: [&str; 6] = [
        "TEST UNIT READY",
        "INQUIRY",
        "READ CAPACITY",
        "REPORT LUNS",
        "MODE SENSE",
        "REQUEST SENSE",
    ];
    for c in cmds {
        if NO_STORAGE_WORK.iter().any(|n| c.cdb.starts_with(n)) {
            if let Some(end) = c.end_ns {
                samples.push(us_between(c.start_ns, end));
            }
        }
        if let Some(w) = c.r2t_wait_us {
            samples.push(w);
        }
    }
    match samples.iter().copied().reduce(f64::min) {
        Some(us) => RoundTrip {
            us,
            samples: samples.len(),
            from_exchanges: true,
        },
        None => RoundTrip {
            us: data
                .iter()
                .filter_map(|c| c.total_us)
                .reduce(f64::min)
                .unwrap_or(0.0),
            samples: 0,
            from_exchanges: false,
        },
    }
}

fn workload(
    a: &Analysis,
    data: &[&CommandPhases],
    round_trip: RoundTrip,
    opts: &StatsOptions,
) -> Workload {
    let start = data.iter().map(|c| c.start_ns).min().unwrap_or(0);
    let end = data.iter().filter_map(|c| c.end_ns).max().unwrap_or(start);
    let span_ns = end.saturating_sub(start).max(1);
    let duration_s = span_ns as f64 / 1e9;
    let bytes = |c: &&CommandPhases| match c.dir {
        IoDir::Read => c.read_bytes,
        _ => c.immediate_bytes + c.unsolicited_bytes + c.solicited_bytes,
    };
    let data_bytes: u64 = data.iter().map(bytes).sum();
    let latency_sum: f64 = data.iter().filter_map(|c| c.total_us).sum();
    let mut times: Vec<u64> = a
        .connections
        .iter()
        .flat_map(|c| c.packets.iter().map(|p| p.ts_ns))
        .collect();
    times.sort_unstable();
    let idle_ns = idle_between(&times, start, end, opts.idle_gap_ns);
    let (none_ns, max_outstanding) = outstanding_profile(data, start, end);
    let digest = |f: fn(&crate::analysis::Connection) -> Option<bool>| {
        a.connections.iter().any(|c| f(c) == Some(true))
    };
    Workload {
        reads: data.iter().filter(|c| c.dir == IoDir::Read).count(),
        writes: data.iter().filter(|c| c.dir == IoDir::Write).count(),
        data_bytes,
        duration_s,
        measured_mbps: data_bytes as f64 / duration_s / 1e6,
        mean_command_bytes: data_bytes as f64 / data.len() as f64,
        mean_outstanding: latency_sum / (span_ns as f64 / 1e3),
        max_outstanding,
        mean_latency_us: latency_sum / data.len() as f64,
        none_outstanding_share: none_ns as f64 / span_ns as f64,
        link_idle_share: idle_ns as f64 / span_ns as f64,
        data_moving_share: data_moving_ns(data) as f64 / span_ns as f64,
        round_trip,
        header_digest: digest(|c| c.header_digest),
        data_digest: digest(|c| c.data_digest),
    }
}

/// Time covered by the commands' data phases (first data to last), overlaps counted once.
fn data_moving_ns(data: &[&CommandPhases]) -> u64 {
    let mut spans: Vec<(u64, u64)> = data
        .iter()
        .filter_map(|c| {
            let wait = c.service_us.or(c.r2t_wait_us).unwrap_or(0.0);
            let from = c.start_ns + ((c.send_us + wait) * 1e3) as u64;
            Some((from, from + (c.transfer_us? * 1e3) as u64))
        })
        .collect();
    spans.sort_unstable();
    let (mut covered, mut reach) = (0u64, 0u64);
    for (from, to) in spans {
        let from = from.max(reach);
        if to > from {
            covered += to - from;
            reach = to;
        }
    }
    covered
}

/// Time in [start, end] with no command outstanding, and the most outstanding at once.
fn outstanding_profile(data: &[&CommandPhases], start: u64, end: u64) -> (u64, usize) {
    let mut edges: Vec<(u64, i32)> = Vec::with_capacity(data.len() * 2);
    for c in data {
        edges.push((c.start_ns, 1));
        edges.push((c.end_ns.unwrap_or(end), -1));
    }
    // Ends before starts at the same instant: back-to-back commands do not overlap.
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut level, mut max, mut none, mut last) = (0i32, 0i32, 0u64, start);
    for (t, d) in edges {
        if level == 0 {
            none += t.saturating_sub(last);
        }
        level += d;
        max = max.max(level);
        last = t;
    }
    (none, max.max(0) as usize)
}

/// Share of the commands' time that a part of it stands for: with N outstanding and S bytes
/// each, throughput is N·S/L, so a part t of the latency L alone would allow N·S/t, which is
/// measured / share.
fn command_share(part_us: f64, split: &TimeSplit) -> f64 {
    if split.latency <= 0.0 {
        return 0.0;
    }
    part_us / split.latency
}

fn finding(
    limit: Limit,
    share: f64,
    w: &Workload,
    evidence: Vec<String>,
    change: String,
) -> Finding {
    Finding {
        rank: 0,
        limit,
        title: limit.title(),
        share,
        bound_mbps: if share > 0.0 {
            w.measured_mbps / share
        } else {
            f64::INFINITY
        },
        measured_mbps: w.measured_mbps,
        evidence,
        change,
    }
}

fn kib(bytes: f64) -> String {
    if bytes >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", bytes / 1024.0 / 1024.0)
    } else {
        format!("{:.1} KiB", bytes / 1024.0)
    }
}

fn ms(us: f64) -> String {
    if us < 1000.0 {
        format!("{:.3} ms", us / 1e3)
    } else {
        format!("{:.2} ms", us / 1e3)
    }
}

fn too_few_outstanding(w: &Workload, split: &TimeSplit) -> Option<Finding> {
    let rtt = w.round_trip.us;
    if rtt <= 0.0 {
        return None;
    }
    let share = command_share(split.round_trip, split);
    let per_command_mbps = w.mean_command_bytes / rtt;
    let evidence = vec![
        format!(
            "{:.2} commands outstanding on average (at most {}), {} each; round trip {}",
            w.mean_outstanding,
            w.max_outstanding,
            kib(w.mean_command_bytes),
            ms(rtt)
        ),
        format!(
            "every command waits at least one round trip: outstanding × size / RTT = {:.2} × {} / {} = {:.2} MB/s",
            w.mean_outstanding,
            kib(w.mean_command_bytes),
            ms(rtt),
            w.mean_outstanding * per_command_mbps
        ),
    ];
    let change = format!(
        "keep more commands in flight (queue depth, asynchronous I/O, more sessions or connections) \
         or make them larger: each outstanding {} command adds {:.2} MB/s at this round trip, \
         until the link is full",
        kib(w.mean_command_bytes),
        per_command_mbps
    );
    Some(finding(
        Limit::TooFewOutstanding,
        share,
        w,
        evidence,
        change,
    ))
}

/// Runs of commands of one direction on one connection, each starting at the block after
/// the previous one: (commands in the run, bytes of the run).
fn sequential_runs(data: &[&CommandPhases]) -> Vec<(usize, u64)> {
    let mut runs: Vec<(usize, u64)> = Vec::new();
    // (conn, dir) → (next LBA, index of its run).
    let mut open: HashMap<(usize, IoDir), (u64, usize)> = HashMap::new();
    for c in data {
        let (Some(lba), Some(blocks)) = (c.lba, c.blocks) else {
            continue;
        };
        let key = (c.conn, c.dir);
        let run = match open.get(&key) {
            Some(&(next, run)) if next == lba => run,
            _ => {
                runs.push((0, 0));
                runs.len() - 1
            }
        };
        runs[run].0 += 1;
        runs[run].1 += c.expected_len as u64;
        open.insert(key, (lba + blocks as u64, run));
    }
    runs
}

fn split_commands(data: &[&CommandPhases], w: &Workload, split: &TimeSplit) -> Option<Finding> {
    let runs = sequential_runs(data);
    let in_runs: usize = runs.iter().filter(|r| r.0 >= 2).map(|r| r.0).sum();
    let ranged: usize = runs.iter().map(|r| r.0).sum();
    if ranged == 0 || (in_runs as f64) < 0.5 * ranged as f64 || w.round_trip.us <= 0.0 {
        return None;
    }
    let (mut lengths, mut run_bytes): (Vec<f64>, Vec<f64>) = runs
        .iter()
        .filter(|r| r.0 >= 2)
        .map(|r| (r.0 as f64, r.1 as f64))
        .unzip();
    lengths.sort_by(f64::total_cmp);
    run_bytes.sort_by(f64::total_cmp);
    let pieces = percentile(&lengths, 0.5).unwrap_or(1.0);
    let app_io = percentile(&run_bytes, 0.5).unwrap_or(0.0);
    let whole_mbps = w.mean_outstanding * app_io / w.round_trip.us;
    let evidence = vec![
        format!(
            "{in_runs} of {ranged} READ/WRITE commands continue the previous one's blocks: runs of {pieces:.0} commands of {} (median run {})",
            kib(w.mean_command_bytes),
            kib(app_io)
        ),
        format!(
            "each piece pays its own round trip of {}: {:.2} outstanding × {} / RTT = {:.2} MB/s",
            ms(w.round_trip.us),
            w.mean_outstanding,
            kib(w.mean_command_bytes),
            w.mean_outstanding * w.mean_command_bytes / w.round_trip.us
        ),
    ];
    let change = format!(
        "issue the application's I/O whole (the initiator's largest transfer, e.g. Linux max_sectors_kb; \
         MaxBurstLength), or keep its pieces in flight together: {} per round trip would allow {:.2} MB/s",
        kib(app_io),
        whole_mbps
    );
    // The round trips of the pieces are this limit's time.
    let share = command_share(split.round_trip, split);
    Some(finding(Limit::SplitCommands, share, w, evidence, change))
}

fn negotiated_of_writes(a: &Analysis, data: &[&CommandPhases]) -> Option<Negotiated> {
    let conn = data.iter().find(|c| c.dir == IoDir::Write)?.conn;
    a.connections.get(conn).map(|c| c.negotiated)
}

fn r2t_round_trips(
    a: &Analysis,
    data: &[&CommandPhases],
    w: &Workload,
    split: &TimeSplit,
) -> Option<Finding> {
    let writes: Vec<&&CommandPhases> = data.iter().filter(|c| c.dir == IoDir::Write).collect();
    let bursts: usize = writes.iter().map(|c| c.bursts.len()).sum();
    if bursts == 0 {
        return None;
    }
    let n = negotiated_of_writes(a, data).unwrap_or_default();
    let shown = |v: Option<String>, default: String| v.unwrap_or(format!("{default} (default)"));
    let yes = |b: bool| if b { "Yes" } else { "No" }.to_string();
    let keys = format!(
        "InitialR2T={} ImmediateData={} FirstBurstLength={} MaxBurstLength={} MaxOutstandingR2T={}{}",
        shown(n.initial_r2t.map(yes), yes(n.initial_r2t_or_default())),
        shown(n.immediate_data.map(yes), yes(n.immediate_data_or_default())),
        shown(
            n.first_burst_length.map(|v| v.to_string()),
            n.first_burst_length_or_default().to_string()
        ),
        shown(
            n.max_burst_length.map(|v| v.to_string()),
            n.max_burst_length_or_default().to_string()
        ),
        shown(
            n.max_outstanding_r2t.map(|v| v.to_string()),
            n.max_outstanding_r2t_or_default().to_string()
        ),
        if n.login_seen { "" } else { "; the login is not in the capture" }
    );
    let mean_wait = split.r2t_waits / writes.len() as f64;
    let solicited: u64 = writes.iter().map(|c| c.solicited_bytes).sum();
    let evidence = vec![
        format!("negotiated {keys}"),
        format!(
            "{} WRITEs of {} on average: {:.1} R2T bursts each, {} waiting for R2Ts per WRITE ({:.1} round trips of {}); {} of {} bytes solicited",
            writes.len(),
            kib(writes.iter().map(|c| c.expected_len as f64).sum::<f64>() / writes.len() as f64),
            bursts as f64 / writes.len() as f64,
            ms(mean_wait),
            mean_wait / w.round_trip.us.max(1.0),
            ms(w.round_trip.us),
            solicited,
            writes.iter().map(|c| c.expected_len as u64).sum::<u64>()
        ),
    ];
    let change =
        "negotiate InitialR2T=No and ImmediateData=Yes with FirstBurstLength at least the \
                  write size (no R2T at all), MaxBurstLength at least the write size (one burst) \
                  and MaxOutstandingR2T above 1 (bursts in parallel): each R2T avoided saves a \
                  round trip"
            .to_string();
    let share = command_share(split.r2t_waits, split);
    Some(finding(Limit::R2tRoundTrips, share, w, evidence, change))
}

fn target_service_time(
    data: &[&CommandPhases],
    splits: &[TimeSplit],
    w: &Workload,
    split: &TimeSplit,
) -> Option<Finding> {
    let mut evidence = Vec::new();
    for dir in [IoDir::Read, IoDir::Write] {
        let mut service: Vec<f64> = data
            .iter()
            .zip(splits)
            .filter(|(c, _)| c.dir == dir)
            .map(|(_, s)| s.service)
            .collect();
        if service.is_empty() {
            continue;
        }
        let (p50, p99) = p50_p99(&mut service);
        let phase = match dir {
            IoDir::Read => "command to first data, less waiting behind earlier data",
            _ => "last data to status",
        };
        evidence.push(format!(
            "{} service ({phase}, less the round trip): p50 {} p99 {}",
            dir.name(),
            ms(p50),
            ms(p99)
        ));
    }
    let mean = split.service / data.len() as f64;
    evidence.push(format!(
        "{:.2} outstanding × {} / {} mean service = {:.2} MB/s",
        w.mean_outstanding,
        kib(w.mean_command_bytes),
        ms(mean),
        if mean > 0.0 {
            w.mean_outstanding * w.mean_command_bytes / mean
        } else {
            f64::INFINITY
        }
    ));
    let change =
        "the target's backend takes the time: faster storage or caching behind the target, \
                  a target with more parallel I/O, or more commands outstanding so that service \
                  times overlap"
            .to_string();
    let share = command_share(split.service, split);
    Some(finding(
        Limit::TargetServiceTime,
        share,
        w,
        evidence,
        change,
    ))
}

/// Data sent against a full receive window. Its share is the part of the data segments that
/// found the window full, or of the sending time spent waiting after them for the window to
/// open, whichever is larger; its bound is window / RTT (TCP's round trip when the capture
/// has real acknowledgements, else the exchanges').
fn tcp_window(a: &Analysis, w: &Workload) -> Option<Finding> {
    let stats = a
        .connections
        .iter()
        .flat_map(window_stats)
        .filter(|s| s.segments >= 10)
        .max_by(|x, y| window_share(x).total_cmp(&window_share(y)))?;
    let limited = stats.window_limited as f64 / stats.segments as f64;
    let waiting = stats.limited_time_share;
    if window_share(&stats) < 0.1 {
        return None;
    }
    let rtt = stats.rtt_us.unwrap_or(w.round_trip.us).max(1.0);
    let bound = stats.mean_window / rtt;
    let evidence = vec![
        format!(
            "c{} {}: the receiver advertised {} on average; {:.0}% of {} data segments left with it full (at most {} in flight)",
            stats.conn,
            stats.dir.arrow(),
            kib(stats.mean_window),
            limited * 100.0,
            stats.segments,
            kib(stats.max_in_flight as f64)
        ),
        format!(
            "the sender waited for the window to open {:.0}% of its sending time",
            waiting * 100.0
        ),
        format!(
            "window / RTT = {} / {} = {:.2} MB/s",
            kib(stats.mean_window),
            ms(rtt),
            bound
        ),
    ];
    let change = "give the receiver a larger socket buffer (net.core.rmem_max, net.ipv4.tcp_rmem, \
                  the application's SO_RCVBUF) with window scaling on, so that window / RTT \
                  exceeds the link rate"
        .to_string();
    let mut f = finding(Limit::TcpWindow, window_share(&stats), w, evidence, change);
    f.bound_mbps = bound;
    Some(f)
}

/// Of a direction's segments, the part that found the window full, or of its sending time
/// the part spent waiting after them, whichever is larger.
fn window_share(s: &WindowStats) -> f64 {
    let limited = s.window_limited as f64 / s.segments.max(1) as f64;
    limited.max(s.limited_time_share).min(1.0)
}

/// Time the connection stood still before each retransmission (the timeout or the wait for
/// duplicate acknowledgements), within the busy period.
fn losses(a: &Analysis, w: &Workload) -> Option<Finding> {
    let mut count = 0u64;
    let mut stalled_ns = 0u64;
    for c in &a.connections {
        let times = packet_times(c);
        for (_, e) in &c.tcp_events {
            if !matches!(
                e.kind,
                TcpEventKind::Retransmission | TcpEventKind::LostRetransmitted
            ) {
                continue;
            }
            count += 1;
            let before = times.partition_point(|&t| t < e.ts_ns);
            if let Some(&prev) = before.checked_sub(1).and_then(|i| times.get(i)) {
                stalled_ns += e.ts_ns - prev;
            }
        }
    }
    if count == 0 {
        return None;
    }
    let unrecovered: u64 = a
        .connections
        .iter()
        .map(|c| c.to_target.unrecovered_bytes + c.to_initiator.unrecovered_bytes)
        .sum();
    let share = (stalled_ns as f64 / 1e9 / w.duration_s).min(1.0);
    let evidence = vec![
        format!(
            "{count} retransmitted segment(s); the connection stood still {} before them in all",
            ms(stalled_ns as f64 / 1e3)
        ),
        format!("{unrecovered} bytes never recovered in the capture"),
    ];
    let change = "find where segments are lost (link errors, switch buffer drops, policers); \
                  a retransmission timeout stalls the connection for hundreds of milliseconds, \
                  fast retransmit (enough data in flight, SACK) recovers in a round trip"
        .to_string();
    Some(finding(Limit::Losses, share, w, evidence, change))
}

fn host_cost(w: &Workload, split: &TimeSplit, stalled: f64) -> Option<Finding> {
    let idle_initiator = (w.none_outstanding_share - stalled).max(0.0);
    let share = (command_share(split.unexplained, split) + idle_initiator).min(1.0);
    let mut evidence = vec![
        format!(
            "no command outstanding {:.0}% of the time, not counting stalls after losses (the initiator not issuing)",
            idle_initiator * 100.0
        ),
        format!(
            "{} per command neither on the round trip, the target, R2Ts nor data transfer (sending the command, status)",
            ms(split.unexplained / (w.reads + w.writes) as f64)
        ),
        format!(
            "link idle {:.0}% of the busy period",
            w.link_idle_share * 100.0
        ),
    ];
    if w.header_digest || w.data_digest {
        evidence.push(format!(
            "digests on (header {}, data {}): a CRC32C over every PDU on both sides",
            w.header_digest, w.data_digest
        ));
    }
    let change = "the ends are slow to produce or take PDUs: check CPU on initiator and target, \
                  the application's time between I/Os, copies; turn digests off or use a CRC32C \
                  implementation with hardware support"
        .to_string();
    Some(finding(Limit::HostCost, share, w, evidence, change))
}

fn link_bandwidth(w: &Workload, split: &TimeSplit, window_time: f64) -> Option<Finding> {
    let busy_wire = 1.0 - w.link_idle_share;
    let transfer = command_share(split.transfer, split);
    let moving = transfer.max(w.data_moving_share) * (1.0 - window_time);
    let share = moving.max(busy_wire).min(1.0);
    let evidence = vec![
        format!(
            "packets flowing {:.0}% of the busy period (gaps of at least the idle gap count as idle)",
            busy_wire * 100.0
        ),
        format!(
            "data moving {:.0}% of the busy period; transfer phases take {:.0}% of the commands' time",
            w.data_moving_share * 100.0,
            transfer * 100.0
        ),
    ];
    let change = "the path's bandwidth is the limit: a faster link or less data (caching, \
                  compression); nothing in the iSCSI exchange is waiting"
        .to_string();
    Some(finding(Limit::LinkBandwidth, share, w, evidence, change))
}

/// The report as text.
pub fn text(d: &Diagnosis) -> String {
    let mut out = String::new();
    let Some(w) = &d.workload else {
        out.push_str(d.note.as_deref().unwrap_or("nothing to explain"));
        out.push('\n');
        return out;
    };
    out.push_str(&format!(
        "measured {:.2} MB/s: {} READ and {} WRITE commands, {} each on average, {:.2} outstanding on average (max {}), mean latency {}, over {:.3} s\n",
        w.measured_mbps,
        w.reads,
        w.writes,
        kib(w.mean_command_bytes),
        w.mean_outstanding,
        w.max_outstanding,
        ms(w.mean_latency_us),
        w.duration_s
    ));
    out.push_str(&format!(
        "round trip {} ({})\n\n",
        ms(w.round_trip.us),
        if w.round_trip.from_exchanges {
            format!(
                "smallest of {} exchanges without storage work",
                w.round_trip.samples
            )
        } else {
            "no exchange without storage work in the capture: the shortest command".into()
        }
    ));
    let width = d.findings.iter().map(|f| f.title.len()).max().unwrap_or(5);
    out.push_str(&format!(
        "{:<4} {:<width$} {:>5} {:>10} {:>13}\n",
        "rank", "limit", "share", "bound_MB/s", "measured_MB/s"
    ));
    for f in &d.findings {
        out.push_str(&format!(
            "{:<4} {:<width$} {:>5.2} {:>10.2} {:>13.2}\n",
            f.rank, f.title, f.share, f.bound_mbps, f.measured_mbps
        ));
        for e in &f.evidence {
            out.push_str(&format!("       evidence: {e}\n"));
        }
        out.push_str(&format!("       change:   {}\n", f.change));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A READ on connection 0 sent at `start_us`, its first data `service_us` later, its data
    /// taking `transfer_us`.
    fn read(start_us: u64, service_us: f64, transfer_us: f64) -> CommandPhases {
        CommandPhases {
            conn: 0,
            itt: start_us as u32,
            dir: IoDir::Read,
            cdb: "READ(10)".into(),
            lba: Some(0),
            blocks: Some(512),
            expected_len: 262_144,
            start_ns: start_us * 1000,
            end_ns: Some((start_us as f64 + service_us + transfer_us) as u64 * 1000),
            total_us: Some(service_us + transfer_us),
            send_us: 0.0,
            service_us: Some(service_us),
            r2t_wait_us: None,
            transfer_us: Some(transfer_us),
            status_us: Some(0.0),
            read_bytes: 262_144,
            immediate_bytes: 0,
            unsolicited_bytes: 0,
            solicited_bytes: 0,
            bursts: Vec::new(),
        }
    }

    #[test]
    fn a_read_waiting_behind_earlier_data_is_queueing_not_service() {
        // Three READs sent together; each one's data follows the one before it on the wire.
        let cmds = [
            read(0, 100.0, 1000.0),
            read(0, 1100.0, 1000.0),
            read(0, 2100.0, 1000.0),
        ];
        let data: Vec<&CommandPhases> = cmds.iter().collect();
        assert_eq!(read_queueing(&data), [0.0, 1100.0, 2100.0]);
        let split = TimeSplit::of(&cmds[2], 50.0, 2100.0);
        assert_eq!(split.service, 0.0, "the target answered at once");
        assert_eq!(split.round_trip, 0.0);
        assert_eq!(
            split.transfer, 3100.0,
            "its own data and the wait behind the others'"
        );
        // A READ sent after the connection went quiet waits for nothing.
        let later = [read(0, 100.0, 1000.0), read(5000, 300.0, 1000.0)];
        let data: Vec<&CommandPhases> = later.iter().collect();
        assert_eq!(read_queueing(&data), [0.0, 0.0]);
    }
}
