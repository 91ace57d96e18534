//! The access generator behind `ironsan bench`: keeps `qd` commands of exactly `size` bytes
//! outstanding per session (sequential or random, reads, writes or a mix), for a duration
//! or a count, records every latency, and optionally verifies data (blocks carry a pattern
//! that depends only on their LBA and a run seed, so any read of a written block can be
//! checked, whatever the order of the writes). Also the `--script` step language.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use iscsi_initiator::scsi::Capacity;
use iscsi_initiator::{Error, RecoveryStats};

pub use crate::device::BlockDevice;

/// Reads, writes, or a mix with the given percentage of reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rw {
    Read,
    Write,
    Mixed { read_pct: u8 },
}

impl Rw {
    pub fn label(&self) -> String {
        match self {
            Rw::Read => "read".into(),
            Rw::Write => "write".into(),
            Rw::Mixed { read_pct } => format!("mixed{read_pct}"),
        }
    }
    fn reads(&self) -> bool {
        !matches!(self, Rw::Write)
    }
}

/// Where each command goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Seq,
    Rand,
}

impl Pattern {
    pub fn label(&self) -> &'static str {
        match self {
            Pattern::Seq => "seq",
            Pattern::Rand => "rand",
        }
    }
}

/// One measurement point.
#[derive(Debug, Clone)]
pub struct Workload {
    pub rw: Rw,
    pub pattern: Pattern,
    /// Bytes per command (a multiple of the block size).
    pub size: u32,
    /// Commands outstanding per session.
    pub qd: usize,
    /// Stop after this long...
    pub duration: Option<Duration>,
    /// ...or after this many commands in total.
    pub count: Option<u64>,
    /// Bytes of the LUN used (from LBA 0); `None` = the whole LUN.
    pub span: Option<u64>,
    pub verify: bool,
    pub seed: u64,
}

/// Counters visible while a run goes on (for a progress line).
#[derive(Debug, Default)]
pub struct Progress {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
}

/// What one point measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub size: u32,
    pub rw: String,
    pub pattern: String,
    pub qd: usize,
    pub sessions: usize,
    pub connections: usize,
    pub ops: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// 10^6 bytes per second.
    pub mb_per_s: f64,
    pub iops: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_max_us: f64,
    /// Blocks compared by `--verify`.
    pub verified_bytes: u64,
    /// Error recovery during the point, summed over its sessions.
    pub recovery: RecoveryStats,
    /// Write data registered in place (iSER) during the point: registrations that served
    /// again, and registrations made.
    pub write_registrations: datamover::RegistrationStats,
}

/// Fills `buf` (whole blocks starting at `lba`) with the pattern of `seed`.
pub fn fill_pattern(buf: &mut [u8], lba: u64, block_size: u32, seed: u64) {
    for (i, block) in buf.chunks_mut(block_size as usize).enumerate() {
        let b = lba + i as u64;
        let mut x = (b ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for (j, w) in block.chunks_mut(8).enumerate() {
            let v = if j == 0 {
                b
            } else {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let bytes = v.to_le_bytes();
            w.copy_from_slice(&bytes[..w.len()]);
        }
    }
}

/// The pattern seed of the `generation`-th write of a chunk in a run of `seed`: each write
/// of a block carries its own pattern, so a read can tell the latest write from an older
/// one (or from a write that never landed).
pub fn generation_seed(seed: u64, generation: u64) -> u64 {
    seed ^ generation.wrapping_mul(0xd6e8_feb8_6659_fd93)
}

/// Per chunk of the verified region: the generation of the last completed write (0: not
/// written in this run) shifted left by one, and a low bit set while a write is in flight.
pub(crate) struct Generations(Vec<AtomicU64>);

impl Generations {
    fn new(chunks: u64) -> Generations {
        Generations((0..chunks).map(|_| AtomicU64::new(0)).collect())
    }
    fn state(&self, chunk: u64) -> u64 {
        self.0[chunk as usize].load(Ordering::Acquire)
    }
    /// Marks a write to `chunk` in flight; the generation it will write, or None if
    /// another write to it is in flight.
    fn claim(&self, chunk: u64) -> Option<u64> {
        let c = &self.0[chunk as usize];
        let cur = c.load(Ordering::Acquire);
        if cur & 1 == 1 {
            return None;
        }
        c.compare_exchange(cur, cur | 1, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| (cur >> 1) + 1)
    }
    fn complete(&self, chunk: u64, generation: u64) {
        self.0[chunk as usize].store(generation << 1, Ordering::Release);
    }
    fn release(&self, chunk: u64) {
        self.0[chunk as usize].fetch_and(!1, Ordering::AcqRel);
    }
    fn written(&self) -> u64 {
        self.0
            .iter()
            .filter(|c| c.load(Ordering::Acquire) >> 1 > 0)
            .count() as u64
    }
}

/// Compares `data` (read at `lba`) with the pattern; the first differing LBA on mismatch.
pub fn check_pattern(data: &[u8], lba: u64, block_size: u32, seed: u64) -> Result<(), u64> {
    let mut want = vec![0u8; block_size as usize];
    for (i, block) in data.chunks(block_size as usize).enumerate() {
        fill_pattern(&mut want, lba + i as u64, block_size, seed);
        if block != &want[..block.len()] {
            return Err(lba + i as u64);
        }
    }
    Ok(())
}

/// A small fast generator for offsets (xorshift64*); its state must not be zero.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

struct Shared {
    /// With `verify`: what each chunk should hold.
    gens: Option<Arc<Generations>>,
    next_chunk: AtomicU64,
    issued: AtomicU64,
    stop: AtomicBool,
    progress: Arc<Progress>,
}

struct WorkerOut {
    lat_ns: Vec<u64>,
    reads: u64,
    writes: u64,
    verified: u64,
}

/// Issues one command of the workload at `chunk` (with `generation`: writes that write's
/// pattern, or checks a read against it).
#[allow(clippy::too_many_arguments)]
async fn one_op<D: BlockDevice>(
    s: &D,
    lun: u16,
    cap: Capacity,
    w: &Workload,
    chunk: u64,
    write: bool,
    template: &Bytes,
    generation: Option<u64>,
) -> Result<u64, Error> {
    let bs = cap.block_size;
    let blocks = w.size / bs;
    let lba = chunk * blocks as u64;
    if write {
        let data = if let Some(g) = generation {
            let mut v = vec![0u8; w.size as usize];
            fill_pattern(&mut v, lba, bs, generation_seed(w.seed, g));
            Bytes::from(v)
        } else {
            template.clone()
        };
        s.write(lun, lba, blocks, data).await?;
        Ok(0)
    } else {
        let data = s.read(lun, lba, blocks, w.size).await?;
        if let Some(g) = generation {
            check_pattern(&data, lba, bs, generation_seed(w.seed, g)).map_err(|bad| {
                Error::Invalid(format!(
                    "verify: data read at LBA {bad} differs from what was written \
                     there last (write #{g} of that block in this run)"
                ))
            })?;
            return Ok(data.len() as u64);
        }
        Ok(0)
    }
}

#[allow(clippy::too_many_arguments)]
async fn worker<D: BlockDevice>(
    s: Arc<D>,
    lun: u16,
    cap: Capacity,
    w: Arc<Workload>,
    shared: Arc<Shared>,
    chunks: u64,
    deadline: Option<Instant>,
    mut rng: Rng,
    force: Option<bool>,
) -> Result<WorkerOut, Error> {
    let template = Bytes::from(vec![0x5au8; w.size as usize]);
    let mut out = WorkerOut {
        lat_ns: Vec::with_capacity(1024),
        reads: 0,
        writes: 0,
        verified: 0,
    };
    loop {
        if shared.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let n = shared.issued.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = w.count {
            if n >= c {
                break;
            }
        }
        let chunk = match w.pattern {
            Pattern::Seq => shared.next_chunk.fetch_add(1, Ordering::Relaxed) % chunks,
            Pattern::Rand => rng.next_u64() % chunks,
        };
        let write = force.unwrap_or(match w.rw {
            Rw::Read => false,
            Rw::Write => true,
            Rw::Mixed { read_pct } => rng.next_u64() % 100 >= read_pct as u64,
        });
        let mut chunk = chunk;
        // With verify: a write claims its chunk (another chunk is drawn while the one drawn
        // has a write in flight, so the last write is known); a read checks the generation
        // the chunk had when it was sent, if no write touched the chunk meanwhile.
        let mut generation = None;
        let mut before = 0;
        if let Some(g) = &shared.gens {
            if write {
                for _ in 0..64 {
                    generation = g.claim(chunk);
                    if generation.is_some() {
                        break;
                    }
                    chunk = match w.pattern {
                        Pattern::Seq => shared.next_chunk.fetch_add(1, Ordering::Relaxed) % chunks,
                        Pattern::Rand => rng.next_u64() % chunks,
                    };
                }
                if generation.is_none() {
                    // Every chunk drawn is being written (a region of few chunks): skip.
                    tokio::task::yield_now().await;
                    continue;
                }
            } else {
                before = g.state(chunk);
                generation = (before & 1 == 0 && before >> 1 > 0).then_some(before >> 1);
            }
        }
        let t0 = Instant::now();
        let r = one_op(&*s, lun, cap, &w, chunk, write, &template, generation).await;
        if let (Some(g), Some(n)) = (&shared.gens, generation) {
            match (&r, write) {
                (Ok(_), true) => g.complete(chunk, n),
                (Err(_), true) => g.release(chunk),
                // A write to the chunk began meanwhile: the data may be either.
                (Err(Error::Invalid(_)), false) if g.state(chunk) != before => {
                    out.lat_ns.push(t0.elapsed().as_nanos() as u64);
                    out.reads += 1;
                    continue;
                }
                _ => {}
            }
        }
        match r {
            Ok(v) => out.verified += v,
            Err(e) => {
                shared.stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        out.lat_ns.push(t0.elapsed().as_nanos() as u64);
        if write {
            out.writes += 1;
        } else {
            out.reads += 1;
        }
        shared.progress.ops.fetch_add(1, Ordering::Relaxed);
        shared
            .progress
            .bytes
            .fetch_add(w.size as u64, Ordering::Relaxed);
    }
    Ok(out)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Runs `qd` workers per session with every command forced to read (`Some(false)`), write
/// (`Some(true)`) or drawn from the workload (`None`).
async fn run_phase<D: BlockDevice>(
    sessions: &[Arc<D>],
    lun: u16,
    cap: Capacity,
    w: &Workload,
    progress: Arc<Progress>,
    force: Option<bool>,
    gens: Option<Arc<Generations>>,
) -> Result<Summary, Error> {
    let bs = cap.block_size as u64;
    let span = w.span.unwrap_or(cap.bytes()).min(cap.bytes());
    let chunks = span / w.size as u64;
    if chunks == 0 {
        return Err(Error::Invalid(format!(
            "transfer size {} is larger than the {span}-byte region",
            w.size
        )));
    }
    debug_assert!((w.size as u64).is_multiple_of(bs));
    let shared = Arc::new(Shared {
        gens,
        next_chunk: AtomicU64::new(0),
        issued: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        progress,
    });
    let wl = Arc::new(w.clone());
    // Error recovery and registration cache counters, summed over the sessions.
    let counters_of = |sessions: &[Arc<D>]| {
        sessions.iter().fold(
            (
                RecoveryStats::default(),
                datamover::RegistrationStats::default(),
            ),
            |(r, g), s| (r.plus(s.recovery()), g.plus(s.write_registrations())),
        )
    };
    let (recovery_before, registrations_before) = counters_of(sessions);
    let start = Instant::now();
    let deadline = w.duration.map(|d| start + d);
    let mut handles = Vec::new();
    for (si, s) in sessions.iter().enumerate() {
        for q in 0..w.qd.max(1) {
            let seed =
                w.seed ^ ((si as u64) << 32 | q as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            handles.push(tokio::spawn(worker(
                s.clone(),
                lun,
                cap,
                wl.clone(),
                shared.clone(),
                chunks,
                deadline,
                Rng(seed),
                force,
            )));
        }
    }
    let mut lat = Vec::new();
    let (mut reads, mut writes, mut verified) = (0, 0, 0);
    let mut first_err = None;
    for h in handles {
        match h.await {
            Ok(Ok(o)) => {
                lat.extend(o.lat_ns);
                reads += o.reads;
                writes += o.writes;
                verified += o.verified;
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(Error::Invalid(format!("worker failed: {e}")));
            }
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    if let Some(e) = first_err {
        return Err(e);
    }
    lat.sort_unstable();
    let ops = reads + writes;
    let bytes = ops * w.size as u64;
    let (recovery_after, registrations_after) = counters_of(sessions);
    Ok(Summary {
        size: w.size,
        rw: match force {
            Some(true) => "write".into(),
            Some(false) => "read".into(),
            None => w.rw.label(),
        },
        pattern: w.pattern.label().into(),
        qd: w.qd,
        sessions: sessions.len(),
        connections: sessions.first().map_or(0, |s| s.connection_count()),
        ops,
        reads,
        writes,
        bytes,
        seconds: secs,
        mb_per_s: bytes as f64 / secs / 1e6,
        iops: ops as f64 / secs,
        lat_p50_us: percentile(&lat, 0.50),
        lat_p99_us: percentile(&lat, 0.99),
        lat_max_us: lat.last().map_or(0.0, |&v| v as f64 / 1000.0),
        verified_bytes: verified,
        recovery: recovery_after.since(recovery_before),
        write_registrations: registrations_after.since(registrations_before),
    })
}

/// Runs one workload point on the sessions (all logged in to the same LUN). With
/// `verify`, reads are preceded by a pattern write of the region and writes are followed
/// by a read-back of the region; the returned summary is the measured phase.
pub async fn run<D: BlockDevice>(
    sessions: &[Arc<D>],
    lun: u16,
    cap: Capacity,
    w: &Workload,
    progress: Arc<Progress>,
) -> Result<Summary, Error> {
    if w.size == 0 || !w.size.is_multiple_of(cap.block_size) {
        return Err(Error::Invalid(format!(
            "transfer size {} is not a multiple of the {}-byte block size",
            w.size, cap.block_size
        )));
    }
    if w.duration.is_none() && w.count.is_none() {
        return Err(Error::Invalid("give a duration or a count".into()));
    }
    if !w.verify {
        return run_phase(sessions, lun, cap, w, progress, None, None).await;
    }
    let span = w.span.unwrap_or(cap.bytes()).min(cap.bytes());
    let chunks = span / w.size as u64;
    if chunks > 1 << 26 {
        return Err(Error::Invalid(format!(
            "--verify tracks every chunk: {chunks} chunks is too many (give a smaller span)"
        )));
    }
    let gens = Arc::new(Generations::new(chunks));
    let whole = Workload {
        pattern: Pattern::Seq,
        duration: None,
        count: Some(chunks),
        ..w.clone()
    };
    let quiet = || Arc::new(Progress::default());
    if w.rw.reads() {
        // Reads need something known to read: the whole region, generation 1.
        run_phase(
            sessions,
            lun,
            cap,
            &whole,
            quiet(),
            Some(true),
            Some(gens.clone()),
        )
        .await?;
    }
    let mut measured = run_phase(sessions, lun, cap, w, progress, None, Some(gens.clone())).await?;
    if w.rw != Rw::Read {
        // Read every chunk back: each one written in this run must hold the pattern of its
        // latest write (not only the last pass: a lost or misplaced write shows).
        let back = run_phase(
            sessions,
            lun,
            cap,
            &whole,
            quiet(),
            Some(false),
            Some(gens.clone()),
        )
        .await?;
        let written = gens.written() * w.size as u64;
        if back.verified_bytes != written {
            return Err(Error::Invalid(format!(
                "verify: {} of the {} bytes written were read back and compared",
                back.verified_bytes, written
            )));
        }
        measured.verified_bytes += back.verified_bytes;
    }
    Ok(measured)
}

/// One step of a `--script` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `login [URL]`: open the session (the command line's URL when none is given).
    Login(Option<String>),
    /// `repeat N read|write SIZE [seq|rand]`.
    Repeat {
        count: u64,
        write: bool,
        size: u64,
        pattern: Pattern,
    },
    /// `logout`.
    Logout,
}

/// Parses a script: one step per line, `#` comments, blank lines ignored. Errors name the
/// line.
pub fn parse_script(text: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| format!("script line {}: {why}: {raw:?}", i + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "login" if words.len() <= 2 => {
                steps.push(Step::Login(words.get(1).map(|s| s.to_string())))
            }
            "logout" if words.len() == 1 => steps.push(Step::Logout),
            "repeat" if (4..=5).contains(&words.len()) => {
                let count: u64 = words[1]
                    .parse()
                    .map_err(|_| bad("the repeat count is not a number".into()))?;
                let write = match words[2] {
                    "read" => false,
                    "write" => true,
                    _ => return Err(bad("expected read or write".into())),
                };
                let size = byte_size::parse_size(words[3]).map_err(|e| bad(e.to_string()))?;
                let pattern = match words.get(4).copied() {
                    None | Some("seq") => Pattern::Seq,
                    Some("rand") => Pattern::Rand,
                    Some(_) => return Err(bad("expected seq or rand".into())),
                };
                steps.push(Step::Repeat {
                    count,
                    write,
                    size,
                    pattern,
                });
            }
            _ => {
                return Err(bad(
                    "expected `login [URL]`, `repeat N read|write SIZE [seq|rand]` or `logout`"
                        .into(),
                ))
            }
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_lba_only() {
        let mut a = vec![0u8; 4096];
        fill_pattern(&mut a, 10, 512, 7);
        let mut b = vec![0u8; 512];
        fill_pattern(&mut b, 13, 512, 7);
        assert_eq!(&a[3 * 512..4 * 512], &b[..]);
        assert_eq!(check_pattern(&a, 10, 512, 7), Ok(()));
        assert_eq!(check_pattern(&a, 10, 512, 8), Err(10));
        a[2 * 512 + 100] ^= 1;
        assert_eq!(check_pattern(&a, 10, 512, 7), Err(12));
    }

    #[test]
    fn an_older_write_of_a_block_does_not_pass_for_the_latest() {
        let mut first = vec![0u8; 1024];
        fill_pattern(&mut first, 5, 512, generation_seed(7, 1));
        assert_eq!(check_pattern(&first, 5, 512, generation_seed(7, 1)), Ok(()));
        assert_eq!(check_pattern(&first, 5, 512, generation_seed(7, 2)), Err(5));
        let g = Generations::new(4);
        assert_eq!(g.claim(2), Some(1));
        assert_eq!(g.claim(2), None, "one write in flight per chunk");
        g.complete(2, 1);
        assert_eq!((g.state(2), g.claim(2)), (2, Some(2)));
        g.release(2);
        assert_eq!((g.state(2), g.written()), (2, 1));
    }

    #[test]
    fn scripts() {
        let s = parse_script(
            "# demo\nlogin\nrepeat 10 read 128k\nrepeat 5 write 4k rand # x\nlogout\n",
        )
        .unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0], Step::Login(None));
        assert_eq!(
            s[2],
            Step::Repeat {
                count: 5,
                write: true,
                size: 4096,
                pattern: Pattern::Rand
            }
        );
        let e = parse_script("login\nrepeat x read 4k\n").unwrap_err();
        assert!(e.starts_with("script line 2:"), "{e}");
        assert!(parse_script("jump\n").is_err());
        assert!(parse_script("repeat 1 read 4q\n").is_err());
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
