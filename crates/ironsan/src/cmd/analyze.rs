//! `ironsan analyze`: translate a capture (pcap/pcapng, or an ironsan `--trace` file) into
//! one line per iSCSI/iSER PDU, per-command and per-connection statistics, and a timeline.

use std::io::Write as _;
use std::path::PathBuf;

use analyze::stats::{self, StatsOptions};
use analyze::{explain, listing, phases, series, Options};
use anyhow::Context;
use clap::Args;

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// Capture file: pcap or pcapng (tcpdump, tshark, or an ironsan --trace file).
    pub capture: PathBuf,
    /// TCP port(s) of iSCSI targets (flows on other ports are taken when they start with a
    /// Login or an MPA request).
    #[arg(long = "port", default_values_t = vec![3260u16])]
    pub ports: Vec<u16>,
    /// Print JSON (an object whose `pdus` array has one entry per PDU, plus `commands`,
    /// `connections`, `phases` and per connection `time_series` of commands outstanding and
    /// throughput) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the PDU listing (text mode; on by default unless --commands or --summary).
    #[arg(long)]
    pub pdus: bool,
    /// Print the per-command table.
    #[arg(long)]
    pub commands: bool,
    /// Print the per-connection summary.
    #[arg(long)]
    pub summary: bool,
    /// Print PDU counts per opcode.
    #[arg(long)]
    pub counts: bool,
    /// Print the per-command phase breakdown: p50/p99 per phase and direction (READ: service,
    /// transfer, status; WRITE: R2T wait, transfer, status, and per burst).
    #[arg(long)]
    pub phases: bool,
    /// Explain the throughput: the limits found (too few commands outstanding, commands split
    /// smaller than the application's I/O, R2T round trips, target service time, losses, host
    /// cost, link bandwidth), ranked, each with its evidence, what to change and the bound it
    /// implies beside the measured throughput. With --json: an "explain" member.
    #[arg(long)]
    pub explain: bool,
    /// Pauses between packets of at least this many microseconds count as idle.
    #[arg(long, default_value_t = 1000)]
    pub idle_gap_us: u64,
    /// Link rate in Mbit/s, for utilization.
    #[arg(long)]
    pub link_mbit: Option<f64>,
    /// Write the timeline as SVG to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the timeline as a self-contained HTML page: per connection PDU lanes, a command
    /// lane and lanes of outstanding commands, read/write MB/s, bytes in flight and window,
    /// TCP events (and cwnd and RTT with --tcp-info); zoom, pan, hover details. Scales to
    /// captures of a million PDUs (aggregated per pixel column when zoomed out).
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// TCP_INFO samples for the --html page's cwnd and RTT lanes: a CSV of `ironsan bench
    /// --tcp-info FILE`, or `ironsan target --tcp-info DIR`'s directory (every conn-*.csv in
    /// it) or one of its files (repeatable). The samples carry no wall-clock time: each is
    /// placed on its connection (by the peer in a target file's name, in order for bench's
    /// sIcJ names) and aligned by the bytes the socket had received.
    #[arg(long = "tcp-info", value_name = "FILE|DIR")]
    pub tcp_info: Vec<PathBuf>,
}

/// Reads TCP_INFO sample files (a directory: every .csv in it), each socket named by the
/// file's `conn` column or else by the file name.
fn read_tcp_info(paths: &[PathBuf]) -> anyhow::Result<Vec<analyze::timeline::TcpInfoTrace>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "csv"))
                .collect();
            v.sort();
            files.extend(v);
        } else {
            files.push(p.clone());
        }
    }
    let mut out = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let stem = f
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        for (name, samples) in analyze::tcpinfo::read_csv(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
        {
            out.push(analyze::timeline::TcpInfoTrace {
                name: name.unwrap_or_else(|| stem.clone()),
                samples,
            });
        }
    }
    Ok(out)
}

/// `ironsan analyze --json`: the listing's fields, then the statistics, phases and series.
#[derive(serde::Serialize)]
struct JsonDoc<'a> {
    #[serde(flatten)]
    listing: listing::JsonListing<'a>,
    commands: &'a [stats::CommandStat],
    connection_stats: &'a [stats::ConnectionStat],
    #[serde(skip_serializing_if = "Option::is_none")]
    explain: Option<explain::Diagnosis>,
    phases: JsonPhases<'a>,
    time_series: Vec<series::ConnectionSeries>,
}

#[derive(serde::Serialize)]
struct JsonPhases<'a> {
    summary: Vec<phases::PhaseSummary>,
    write_data: phases::WriteDataSplit,
    commands: &'a [phases::CommandPhases],
}

pub fn run(args: AnalyzeArgs) -> anyhow::Result<()> {
    let opts = Options {
        ports: args.ports.clone(),
        detect_by_content: true,
    };
    // The capture is read in one library call: a spinner with the time spent, and its size.
    let spinner = super::progress::spinner("analyze");
    if let Ok(m) = std::fs::metadata(&args.capture) {
        spinner.set_message(format!(
            "{} ({})",
            args.capture.display(),
            report::format_size(m.len())
        ));
    }
    let a = analyze::analyze_file(&args.capture, &opts)
        .with_context(|| format!("reading {}", args.capture.display()));
    spinner.finish_and_clear();
    let a = a?;
    let sopts = StatsOptions {
        idle_gap_ns: args.idle_gap_us * 1000,
        link_rate: args.link_mbit.map(|m| m * 1e6 / 8.0),
    };
    let cmds = stats::commands(&a, &sopts);
    let conns = stats::connections(&a, &cmds, &sopts);
    if !args.tcp_info.is_empty() && args.html.is_none() {
        anyhow::bail!("--tcp-info adds lanes to the --html page: give --html too");
    }
    let phases = phases::command_phases(&a);
    if let Some(path) = &args.svg {
        let svg = analyze::timeline::svg(&a, &cmds, &sopts);
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.html {
        let tcp_info = read_tcp_info(&args.tcp_info)?;
        let html = analyze::timeline::html(&a, &cmds, &sopts, &tcp_info);
        std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let doc = JsonDoc {
            listing: listing::json(&a),
            commands: &cmds,
            connection_stats: &conns,
            explain: args
                .explain
                .then(|| explain::explain_phases(&a, &phases, &sopts)),
            phases: JsonPhases {
                summary: phases::summary(&phases),
                write_data: phases::write_data_split(&phases),
                commands: &phases,
            },
            time_series: series::connection_series(&a, &phases),
        };
        // Written as it is serialized: no document tree in memory (see listing::JsonListing).
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
        out.flush()?;
        return Ok(());
    }
    let listing_on =
        args.pdus || !(args.commands || args.summary || args.counts || args.phases || args.explain);
    if listing_on {
        print!("{}", listing::text(&a));
    }
    if args.counts {
        for (op, (name, n)) in listing::opcode_counts(&a) {
            println!("0x{op:02x} {name:<34} {n}");
        }
        println!("total {}", a.pdus.len());
    }
    if args.commands {
        println!("{}", stats::commands_table(&cmds));
    }
    if args.phases {
        print!("{}", phases::text(&phases));
    }
    if args.explain {
        print!(
            "{}",
            explain::text(&explain::explain_phases(&a, &phases, &sopts))
        );
    }
    if args.summary || listing_on {
        println!("{}", stats::connections_table(&conns));
        for c in &a.connections {
            for (dir, e) in &c.tcp_events {
                if !matches!(e.kind, analyze::tcp::TcpEventKind::OutOfOrder) {
                    println!(
                        "c{} {} {:?} at {:.6} s frame {} stream offset {} len {}",
                        c.id,
                        dir.arrow(),
                        e.kind,
                        e.ts_ns.saturating_sub(a.start_ns) as f64 / 1e9,
                        e.frame,
                        e.offset,
                        e.len
                    );
                }
            }
        }
    }
    Ok(())
}
