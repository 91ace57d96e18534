//! `ironsan bench crc`: measures the CRC32C implementations of the `digest` crate per buffer
//! size and presents them as tables, CSV/JSON and an SVG plot of cycles per byte.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use bench::crc::{self, Clock, Config, Measurement, Method};
use digest::hw::Path;
use report::{format_size, parse_size, Cell, LinePlot, Series, Table, TickLabels};

#[derive(clap::Args)]
pub struct CrcArgs {
    /// Buffer sizes, comma-separated (e.g. 512,8k,64KiB). Default: 512 B to 64 KiB in powers of 2.
    #[arg(long, value_delimiter = ',', value_parser = parse_size_arg)]
    pub sizes: Vec<usize>,
    /// Methods to measure, comma-separated (default: all this CPU can run): sarwate,
    /// slicing-by-8, hw-1stream, hw-4stream, hw-avx2, hw-avx512, hw, copy, copy-then-crc,
    /// fused-copy-crc, and per hardware path copy-then-4stream, fused-4stream, copy-then-avx2,
    /// fused-avx2, copy-then-avx512, fused-avx512.
    #[arg(long, value_delimiter = ',', value_parser = parse_method)]
    pub methods: Vec<Method>,
    /// Timed samples per method and size; the best is reported.
    #[arg(long, default_value_t = 30)]
    pub samples: usize,
    /// Bytes processed per sample (e.g. 256k).
    #[arg(long, default_value = "256k", value_parser = parse_size_arg)]
    pub bytes_per_sample: usize,
    /// Write the results as CSV (one row per size and method).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the results as JSON to FILE, or to standard output (tables then go to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Draw cycles per byte against buffer size, one line per method, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Make digest::crc32c (the hw, copy-then-crc and fused-copy-crc columns) use this hardware
    /// path instead of the best one: streams, avx2-vpclmul or avx512-vpclmul.
    #[arg(long, value_parser = parse_path)]
    pub path: Option<Path>,
    /// Exit with an error unless, at 8 KiB, hardware < slicing-by-8 < Sarwate, the fused
    /// copy+CRC costs at most 1.1x the CRC alone, and on every path measured the fused copy
    /// costs no more than copy-then-CRC.
    #[arg(long)]
    pub check: bool,
    /// Multiply every factor --check allows by this: 1 checks the promise, 2 only guards
    /// against a collapse (what a test on a shared, noisy machine can hold).
    #[arg(long, value_name = "F", default_value_t = 1.0, requires = "check")]
    pub check_slack: f64,
}

fn parse_size_arg(s: &str) -> Result<usize, String> {
    let bytes = parse_size(s).map_err(|e| e.to_string())?;
    match usize::try_from(bytes) {
        Ok(0) => Err("size must be at least 1 byte".into()),
        Ok(n) if n <= 1 << 30 => Ok(n),
        _ => Err(format!("{s}: at most 1 GiB")),
    }
}

fn parse_method(s: &str) -> Result<Method, String> {
    Method::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
        format!("unknown method {s:?}; one of: {}", names.join(", "))
    })
}

fn parse_path(s: &str) -> Result<Path, String> {
    Path::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Path::ALL.iter().map(|p| p.name()).collect();
        format!("unknown path {s:?}; one of: {}", names.join(", "))
    })
}

const CHECK_SIZE: usize = 8192;

pub fn run(args: CrcArgs) -> anyhow::Result<()> {
    let mut config = Config {
        samples: args.samples.max(1),
        bytes_per_sample: args.bytes_per_sample,
        ..Config::default()
    };
    if !args.sizes.is_empty() {
        config.sizes = args.sizes.clone();
    }
    if !args.methods.is_empty() {
        let unavailable: Vec<&str> = args
            .methods
            .iter()
            .filter(|m| !m.available())
            .map(|m| m.name())
            .collect();
        if !unavailable.is_empty() {
            bail!("not available on this CPU: {}", unavailable.join(", "));
        }
        config.methods = args.methods.clone();
    }
    if let Some(path) = args.path {
        if !path.available() {
            bail!("CRC32C path {} not available on this CPU", path.name());
        }
        digest::hw::force_path(Some(path));
    }
    if args.check && !config.sizes.contains(&CHECK_SIZE) {
        config.sizes.push(CHECK_SIZE);
        config.sizes.sort_unstable();
    }

    let clock = Clock::calibrate(Duration::from_millis(50));
    let rows = crc::run(&config, &clock);
    let json_to_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));

    let mut text = String::new();
    text.push_str(&format!(
        "CRC32C: digest::crc32c uses the {} path{}; clock: {}\n\n",
        digest::implementation_name(),
        hw_path_note(args.path.is_some()),
        if clock.is_tsc {
            format!(
                "TSC at {:.3} GHz (measured against the monotonic clock)",
                clock.ticks_per_sec / 1e9
            )
        } else {
            "nanoseconds (no TSC on this architecture)".to_string()
        }
    ));
    text.push_str(&format!(
        "{}/byte (best of {}):\n",
        clock.unit(),
        config.samples
    ));
    text.push_str(&wide_table(&rows, &config, |m| Cell::float(m.ticks_per_byte, 3)).to_string());
    text.push_str("\nGB/s:\n");
    text.push_str(&wide_table(&rows, &config, |m| Cell::float(m.gb_per_sec, 2)).to_string());
    if let Some(summary) = ratio_summary(&rows, CHECK_SIZE) {
        text.push_str(&summary);
    }
    if json_to_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }

    let long = long_table(&rows, &clock);
    if let Some(path) = &args.csv {
        std::fs::write(path, long.to_csv())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let json = long.to_json_string();
        if json_to_stdout {
            println!("{json}");
        } else {
            std::fs::write(path, json + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot(&rows, &config, &clock).to_svg())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.check {
        if let Err(problems) = crc::check_ratios(&rows, CHECK_SIZE, args.check_slack) {
            bail!(
                "CRC32C performance relations do not hold:\n  {}",
                problems.join("\n  ")
            );
        }
        eprintln!(
            "check: all relations at {} hold",
            format_size(CHECK_SIZE as u64)
        );
    }
    Ok(())
}

/// Which hardware path the dispatcher runs, and from which length it folds.
fn hw_path_note(forced: bool) -> String {
    if !digest::hw::available() {
        return String::new();
    }
    let path = digest::hw::path();
    let how = if forced { "forced" } else { "the best here" };
    match path {
        Path::Streams => format!(
            " ({}, {how}: crc32 in {} streams)",
            path.name(),
            digest::hw::STREAMS
        ),
        Path::Avx2Fold | Path::Avx512Fold => format!(
            " ({}, {how}: VPCLMULQDQ folding from {} B, crc32 in {} streams below)",
            path.name(),
            path.fold_min_len(),
            digest::hw::STREAMS
        ),
    }
}

fn measured_methods(rows: &[Measurement], config: &Config) -> Vec<Method> {
    config
        .methods
        .iter()
        .copied()
        .filter(|&m| rows.iter().any(|r| r.method == m))
        .collect()
}

/// One row per size, one column per method.
fn wide_table(
    rows: &[Measurement],
    config: &Config,
    value: impl Fn(&Measurement) -> Cell,
) -> Table {
    let methods = measured_methods(rows, config);
    let mut table = Table::new(std::iter::once("size").chain(methods.iter().map(|m| m.name())));
    for &size in &config.sizes {
        let mut cells = vec![Cell::from(format_size(size as u64))];
        for &m in &methods {
            cells.push(
                rows.iter()
                    .find(|r| r.method == m && r.size == size)
                    .map_or(Cell::from(""), &value),
            );
        }
        table.push_row(cells);
    }
    table
}

/// One row per (size, method), for CSV and JSON.
fn long_table(rows: &[Measurement], clock: &Clock) -> Table {
    let per_byte = format!("{}_per_byte", clock.unit());
    let mut table = Table::new([
        "size_bytes",
        "size",
        "method",
        per_byte.as_str(),
        "gb_per_s",
    ]);
    for r in rows {
        table.push_row([
            Cell::from(r.size),
            Cell::from(format_size(r.size as u64)),
            Cell::from(r.method.name()),
            Cell::float(r.ticks_per_byte, 4),
            Cell::float(r.gb_per_sec, 3),
        ]);
    }
    table
}

/// The ratios the engine is judged by, at `size`, as text.
fn ratio_summary(rows: &[Measurement], size: usize) -> Option<String> {
    let get = |m: Method| crc::lookup(rows, m, size);
    let crc_alone = get(Method::Hw).or(get(Method::Slicing8))?;
    let mut out = format!("\nAt {}:\n", format_size(size as u64));
    if let (Some(s), Some(s8)) = (get(Method::Sarwate), get(Method::Slicing8)) {
        out.push_str(&format!("  sarwate / slicing-by-8      = {:.2}x\n", s / s8));
    }
    if let (Some(s8), Some(hw)) = (get(Method::Slicing8), get(Method::Hw)) {
        out.push_str(&format!(
            "  slicing-by-8 / hw           = {:.2}x\n",
            s8 / hw
        ));
    }
    if let (Some(h4), Some(hw)) = (get(Method::HwStreams), get(Method::Hw)) {
        out.push_str(&format!(
            "  hw-4stream / hw             = {:.2}x\n",
            h4 / hw
        ));
    }
    if let (Some(h1), Some(hw)) = (get(Method::Hw1Stream), get(Method::Hw)) {
        out.push_str(&format!(
            "  hw-1stream / hw             = {:.2}x\n",
            h1 / hw
        ));
    }
    if let Some(fused) = get(Method::FusedCopyCrc) {
        out.push_str(&format!(
            "  fused-copy-crc / crc alone  = {:.3}x (bar: <= {})\n",
            fused / crc_alone,
            crc::FUSED_MAX_RATIO
        ));
        if let Some(ctc) = get(Method::CopyThenCrc) {
            out.push_str(&format!(
                "  fused saves {:.0}% of copy-then-crc\n",
                100.0 * (1.0 - fused / ctc)
            ));
        }
    }
    for fused in Method::ALL {
        let Some(pair) = fused.unfused().filter(|_| fused != Method::FusedCopyCrc) else {
            continue;
        };
        if let (Some(f), Some(p)) = (get(fused), get(pair)) {
            out.push_str(&format!(
                "  {:<27} = {:.3}x (bar: <= 1)\n",
                format!("{} / {}", fused.name(), pair.name()),
                f / p
            ));
        }
    }
    Some(out)
}

fn plot(rows: &[Measurement], config: &Config, clock: &Clock) -> LinePlot {
    LinePlot {
        title: "CRC32C cost per byte by buffer size".into(),
        x_label: "buffer size".into(),
        y_label: format!("{} per byte", clock.unit()),
        x_log2: true,
        y_log: true,
        x_ticks: TickLabels::Bytes,
        y_ticks: TickLabels::Number,
        series: measured_methods(rows, config)
            .into_iter()
            .map(|m| {
                Series::new(
                    m.name(),
                    rows.iter()
                        .filter(|r| r.method == m)
                        .map(|r| (r.size as f64, r.ticks_per_byte))
                        .collect(),
                )
            })
            .collect(),
    }
}
