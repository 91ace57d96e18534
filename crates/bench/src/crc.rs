//! Measures every CRC32C implementation, and copy-then-CRC against the fused copy+CRC, per
//! buffer size, in cycles per byte and GB/s: as [`digest::crc32c`] dispatches, and on each
//! hardware path ([`digest::hw::Path`]) the CPU can run, fused and unfused. Returns rows;
//! presenting them is the caller's job.
//!
//! Each (method, size) cell is timed over many calls per sample and the best (smallest) sample
//! is kept: the least disturbed run on a shared machine. Samples of all methods are interleaved
//! so that a slow period (frequency change, another process) hits all methods alike, which keeps
//! the ratios between methods meaningful even when absolute numbers wander.

use std::hint::black_box;
use std::time::{Duration, Instant};

use digest::hw::Path;
use digest::{crc32c_append, hw, sarwate, slicing8, Crc32c};

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Byte-at-a-time table (the reference).
    Sarwate,
    /// Eight tables, eight bytes per step (the portable path).
    Slicing8,
    /// The CRC32C instruction, one dependent stream.
    Hw1Stream,
    /// The CRC32C instruction in [`hw::STREAMS`] interleaved streams joined by PCLMULQDQ.
    HwStreams,
    /// What [`digest::crc32c`] uses: [`hw::append`] on [`hw::path`], i.e. VPCLMULQDQ folding
    /// for longer buffers where the CPU has it, else the streams.
    Hw,
    /// [`Path::Avx2Fold`]: 256-bit VPCLMULQDQ folding (with `crc32` streams beside it).
    HwAvx2,
    /// [`Path::Avx512Fold`]: 512-bit VPCLMULQDQ folding.
    HwAvx512,
    /// `copy_from_slice` alone, for reference.
    Copy,
    /// `copy_from_slice`, then the CRC over the copy: two passes.
    CopyThenCrc,
    /// [`digest::copy_with_crc32c`] (via [`Crc32c::update_copy`]): one pass.
    FusedCopyCrc,
    /// `copy_from_slice`, then the CRC on one path: [`Path::Streams`], [`Path::Avx2Fold`],
    /// [`Path::Avx512Fold`].
    CopyThenStreams,
    CopyThenAvx2,
    CopyThenAvx512,
    /// [`hw::copy_append_with`] on one path: the fused kernel, or copy-then-CRC where that
    /// measured faster for the length.
    FusedStreams,
    FusedAvx2,
    FusedAvx512,
}

impl Method {
    pub const ALL: [Method; 16] = [
        Method::Sarwate,
        Method::Slicing8,
        Method::Hw1Stream,
        Method::HwStreams,
        Method::HwAvx2,
        Method::HwAvx512,
        Method::Hw,
        Method::Copy,
        Method::CopyThenCrc,
        Method::FusedCopyCrc,
        Method::CopyThenStreams,
        Method::FusedStreams,
        Method::CopyThenAvx2,
        Method::FusedAvx2,
        Method::CopyThenAvx512,
        Method::FusedAvx512,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Sarwate => "sarwate",
            Method::Slicing8 => "slicing-by-8",
            Method::Hw1Stream => "hw-1stream",
            Method::HwStreams => "hw-4stream",
            Method::HwAvx2 => "hw-avx2",
            Method::HwAvx512 => "hw-avx512",
            Method::Hw => "hw",
            Method::Copy => "copy",
            Method::CopyThenCrc => "copy-then-crc",
            Method::FusedCopyCrc => "fused-copy-crc",
            Method::CopyThenStreams => "copy-then-4stream",
            Method::FusedStreams => "fused-4stream",
            Method::CopyThenAvx2 => "copy-then-avx2",
            Method::FusedAvx2 => "fused-avx2",
            Method::CopyThenAvx512 => "copy-then-avx512",
            Method::FusedAvx512 => "fused-avx512",
        }
    }

    /// The hardware path a per-path method runs on.
    pub fn path(self) -> Option<Path> {
        match self {
            Method::HwStreams | Method::CopyThenStreams | Method::FusedStreams => {
                Some(Path::Streams)
            }
            Method::HwAvx2 | Method::CopyThenAvx2 | Method::FusedAvx2 => Some(Path::Avx2Fold),
            Method::HwAvx512 | Method::CopyThenAvx512 | Method::FusedAvx512 => {
                Some(Path::Avx512Fold)
            }
            _ => None,
        }
    }

    /// For a fused method, the copy-then-CRC it must beat.
    pub fn unfused(self) -> Option<Method> {
        match self {
            Method::FusedCopyCrc => Some(Method::CopyThenCrc),
            Method::FusedStreams => Some(Method::CopyThenStreams),
            Method::FusedAvx2 => Some(Method::CopyThenAvx2),
            Method::FusedAvx512 => Some(Method::CopyThenAvx512),
            _ => None,
        }
    }

    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether this CPU can run it.
    pub fn available(self) -> bool {
        match self {
            Method::Hw1Stream | Method::Hw => hw::available(),
            _ => self.path().is_none_or(Path::available),
        }
    }

    /// Every method this CPU can run.
    pub fn all_available() -> Vec<Method> {
        Method::ALL.into_iter().filter(|m| m.available()).collect()
    }

    /// One call over `src` (and `dst` for the copying methods), continuing from the CRC `prev`
    /// that the previous call returned: chaining the calls makes each wait for the one before,
    /// as a per-PDU digest does, instead of letting the CPU overlap independent calls.
    fn run_once(self, prev: u32, dst: &mut [u8], src: &[u8]) -> u32 {
        match self {
            Method::Sarwate => sarwate::append(prev, src),
            Method::Slicing8 => slicing8::append(prev, src),
            Method::Hw1Stream => hw::append_1stream(prev, src),
            Method::HwStreams => hw::append_streams::<{ hw::STREAMS }>(prev, src),
            Method::Hw => hw::append(prev, src),
            Method::HwAvx2 | Method::HwAvx512 => hw::append_with(self.path().unwrap(), prev, src),
            Method::Copy => {
                dst.copy_from_slice(src);
                prev ^ u32::from(dst[dst.len() / 2])
            }
            Method::CopyThenCrc => {
                dst.copy_from_slice(src);
                crc32c_append(prev, black_box(&*dst))
            }
            Method::FusedCopyCrc => {
                let mut state = Crc32c::resume(prev);
                state.update_copy(dst, src);
                state.finalize()
            }
            Method::CopyThenStreams | Method::CopyThenAvx2 | Method::CopyThenAvx512 => {
                dst.copy_from_slice(src);
                hw::append_with(self.path().unwrap(), prev, black_box(&*dst))
            }
            Method::FusedStreams | Method::FusedAvx2 | Method::FusedAvx512 => {
                hw::copy_append_with(self.path().unwrap(), prev, dst, src)
            }
        }
    }
}

/// The time base: the x86-64 time-stamp counter, else nanoseconds of the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Ticks per second, measured against the monotonic clock.
    pub ticks_per_sec: f64,
    /// True when ticks are TSC cycles, false when they are nanoseconds.
    pub is_tsc: bool,
}

impl Clock {
    /// Measures the tick rate over `period` (50 ms is plenty for 4 significant digits).
    pub fn calibrate(period: Duration) -> Clock {
        if !cfg!(target_arch = "x86_64") {
            return Clock {
                ticks_per_sec: 1e9,
                is_tsc: false,
            };
        }
        let clock = Clock {
            ticks_per_sec: 0.0,
            is_tsc: true,
        };
        let (t0, c0) = (Instant::now(), clock.now());
        while t0.elapsed() < period {
            std::hint::spin_loop();
        }
        let (elapsed, c1) = (t0.elapsed(), clock.now());
        Clock {
            ticks_per_sec: (c1 - c0) as f64 / elapsed.as_secs_f64(),
            ..clock
        }
    }

    /// The current tick count.
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.is_tsc {
            // SAFETY: RDTSC exists on every x86-64 CPU and only reads the time-stamp counter.
            return unsafe { core::arch::x86_64::_rdtsc() };
        }
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    /// What a tick is, for column headers: `"cycles"` (TSC) or `"ns"`.
    pub fn unit(&self) -> &'static str {
        if self.is_tsc {
            "cycles"
        } else {
            "ns"
        }
    }
}

/// How much to measure.
#[derive(Debug, Clone)]
pub struct Config {
    /// Buffer sizes in bytes.
    pub sizes: Vec<usize>,
    pub methods: Vec<Method>,
    /// Timed samples per (method, size); the best is kept.
    pub samples: usize,
    /// Bytes processed per sample (the call count is this divided by the size, at least 1).
    pub bytes_per_sample: usize,
}

impl Default for Config {
    /// 512 B to 64 KiB in powers of two, every available method, 30 samples of 256 KiB.
    fn default() -> Config {
        Config {
            sizes: (9..=16).map(|s| 1usize << s).collect(),
            methods: Method::all_available(),
            samples: 30,
            bytes_per_sample: 256 << 10,
        }
    }
}

/// The best sample of one method at one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub method: Method,
    pub size: usize,
    /// Clock ticks per byte (TSC cycles per byte on x86-64).
    pub ticks_per_byte: f64,
    /// Bytes per second, in units of 10^9.
    pub gb_per_sec: f64,
}

/// Runs the benchmark: for each size, all methods' samples interleaved. Methods the CPU cannot
/// run are skipped. Rows come out ordered by size, then in `config.methods` order.
pub fn run(config: &Config, clock: &Clock) -> Vec<Measurement> {
    let methods: Vec<Method> = config
        .methods
        .iter()
        .copied()
        .filter(|m| m.available())
        .collect();
    let max = config.sizes.iter().copied().max().unwrap_or(0);
    // Distinct, irregular bytes; the CRC cost does not depend on them but the result must.
    let src: Vec<u8> = (0..max as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let mut dst = vec![0u8; max];
    let mut rows = Vec::new();
    for &size in &config.sizes {
        let calls = (config.bytes_per_sample / size.max(1)).max(1);
        let (src, dst) = (&src[..size], &mut dst[..size]);
        let mut best = vec![f64::INFINITY; methods.len()];
        for &m in &methods {
            black_box(m.run_once(0, dst, src)); // warm caches and branch predictors
        }
        for _ in 0..config.samples.max(1) {
            for (i, &m) in methods.iter().enumerate() {
                let start = clock.now();
                let mut chain = 0;
                for _ in 0..calls {
                    chain = m.run_once(chain, black_box(&mut *dst), black_box(src));
                }
                let ticks = clock.now().saturating_sub(start) as f64;
                black_box(chain);
                best[i] = best[i].min(ticks / (calls * size).max(1) as f64);
            }
        }
        for (&m, &tpb) in methods.iter().zip(&best) {
            rows.push(Measurement {
                method: m,
                size,
                ticks_per_byte: tpb,
                gb_per_sec: clock.ticks_per_sec / tpb / 1e9,
            });
        }
    }
    rows
}

/// The ticks per byte of `method` at `size`, if measured.
pub fn lookup(rows: &[Measurement], method: Method, size: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.method == method && r.size == size)
        .map(|r| r.ticks_per_byte)
}

/// Fused copy+CRC may cost at most this many times the CRC alone.
pub const FUSED_MAX_RATIO: f64 = 1.1;

/// The relations the engine promises at `size`, checked on measured rows: hardware faster than
/// slicing-by-8 faster than Sarwate; fused copy+CRC within [`FUSED_MAX_RATIO`] of the CRC alone
/// and, on every path measured, no slower than copy-then-CRC on that path. The CRC alone is the hardware path where the CPU has it, else
/// slicing-by-8. Every factor is multiplied by `slack`: 1.0 checks the promise (a benchmark
/// run), 2.0 only guards against a collapse (a test on a shared, noisy machine). Returns
/// every violated relation, worded for a person.
pub fn check_ratios(rows: &[Measurement], size: usize, slack: f64) -> Result<(), Vec<String>> {
    let get = |m: Method| lookup(rows, m, size);
    let mut problems = Vec::new();
    let mut faster = |a: Method, b: Method, factor: f64| {
        let factor = factor * slack;
        if let (Some(ta), Some(tb)) = (get(a), get(b)) {
            if ta > tb * factor {
                problems.push(format!(
                    "{} at {size} B: {ta:.3}/byte is not within {factor}x of {} ({tb:.3}/byte)",
                    a.name(),
                    b.name()
                ));
            }
        }
    };
    faster(Method::Hw, Method::Slicing8, 1.0);
    faster(Method::Slicing8, Method::Sarwate, 1.0);
    let crc_alone = if get(Method::Hw).is_some() {
        Method::Hw
    } else {
        Method::Slicing8
    };
    faster(Method::FusedCopyCrc, crc_alone, FUSED_MAX_RATIO);
    for fused in Method::ALL {
        if let Some(pair) = fused.unfused() {
            faster(fused, pair, 1.0);
        }
    }
    let missing: Vec<&str> = [
        Method::Sarwate,
        Method::Slicing8,
        Method::CopyThenCrc,
        Method::FusedCopyCrc,
    ]
    .into_iter()
    .filter(|&m| get(m).is_none())
    .map(Method::name)
    .collect();
    if !missing.is_empty() {
        problems.push(format!("not measured at {size} B: {}", missing.join(", ")));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(method: Method, ticks_per_byte: f64) -> Measurement {
        Measurement {
            method,
            size: 8192,
            ticks_per_byte,
            gb_per_sec: 1.0 / ticks_per_byte,
        }
    }

    fn good_rows() -> Vec<Measurement> {
        vec![
            row(Method::Sarwate, 6.7),
            row(Method::Slicing8, 1.9),
            row(Method::Hw1Stream, 0.33),
            row(Method::Hw, 0.10),
            row(Method::Copy, 0.05),
            row(Method::CopyThenCrc, 0.16),
            row(Method::FusedCopyCrc, 0.105),
        ]
    }

    #[test]
    fn good_ratios_pass() {
        assert_eq!(check_ratios(&good_rows(), 8192, 1.0), Ok(()));
    }

    #[test]
    fn each_broken_relation_is_reported() {
        let mut rows = good_rows();
        rows[6].ticks_per_byte = 0.2; // fused slower than 1.1x hw and than copy-then-crc
        rows[0].ticks_per_byte = 1.0; // sarwate faster than slicing-by-8
        let problems = check_ratios(&rows, 8192, 1.0).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("slicing-by-8")));
        assert!(problems.iter().any(|p| p.contains("of hw ")));
        assert!(problems.iter().any(|p| p.contains("of copy-then-crc")));
    }

    #[test]
    fn a_fused_path_slower_than_its_pair_is_reported() {
        let mut rows = good_rows();
        rows.push(row(Method::CopyThenAvx2, 0.05));
        rows.push(row(Method::FusedAvx2, 0.06));
        let problems = check_ratios(&rows, 8192, 1.0).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("fused-avx2"), "{problems:?}");
        rows.last_mut().unwrap().ticks_per_byte = 0.04;
        assert_eq!(check_ratios(&rows, 8192, 1.0), Ok(()));
    }

    #[test]
    fn per_path_methods_run_only_where_the_cpu_has_the_path() {
        for m in Method::ALL {
            if let Some(p) = m.path() {
                assert_eq!(m.available(), p.available(), "{}", m.name());
            }
        }
    }

    #[test]
    fn missing_rows_are_reported() {
        let problems = check_ratios(&good_rows(), 4096, 1.0).unwrap_err();
        assert!(
            problems[0].contains("not measured at 4096 B"),
            "{problems:?}"
        );
    }

    #[test]
    fn run_returns_one_row_per_available_method_and_size() {
        let config = Config {
            sizes: vec![512, 4096],
            methods: Method::ALL.to_vec(),
            samples: 2,
            bytes_per_sample: 8192,
        };
        let clock = Clock::calibrate(Duration::from_millis(5));
        assert!(clock.ticks_per_sec > 1e6, "{clock:?}");
        let rows = run(&config, &clock);
        assert_eq!(rows.len(), 2 * Method::all_available().len());
        assert!(rows
            .iter()
            .all(|r| r.ticks_per_byte > 0.0 && r.ticks_per_byte.is_finite()));
        assert_eq!(rows[0].size, 512);
        assert_eq!(rows.last().unwrap().size, 4096);
    }

    #[test]
    fn method_names_round_trip() {
        for m in Method::ALL {
            assert_eq!(Method::from_name(m.name()), Some(m));
        }
        assert_eq!(Method::from_name("nope"), None);
    }
}
