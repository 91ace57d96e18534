//! What memory registration costs an iSER READ, per command, on the software RNIC: the read
//! data (already in memory, as a backend produced it) leaves as one RDMA Write, from
//! - a region registered for the command and released after it (the datamover before pools),
//! - a region taken from a pool of regions registered earlier ([`MrPool`], what the target does
//!   now), the data copied in, or
//! - the memory the data already lives in, registered once (a RAM LUN registered as a whole,
//!   or a registration-cache hit): no registration and no copy.
//!
//! Two RNICs in this process, connected over loopback, one command at a time (the cost, not the
//! throughput); the strategies alternate in rounds so that a noisy machine affects all alike.
//! Reported per command: the median wall time and the process CPU time (both RNICs' progress
//! threads included).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma::{
    Access, ConnParams, ConnectRequest, Listener, MemoryRegion, Provider, QpCaps, QueuePair,
    RecvWr, SendOp, SendWr,
};
use rdma_tools::bw::wait_ok;
use rnic::{Channel, Cq, Mr, Qp, Rnic};

use datamover_iser::mr_pool::MrPool;

/// How the data of one command reaches registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// reg_mr for the command, copy in, write, release.
    RegisterPerCommand,
    /// A pooled region, copy in, write, return.
    Pool,
    /// Write straight from memory registered once.
    RegisteredOnce,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [
        Strategy::RegisterPerCommand,
        Strategy::Pool,
        Strategy::RegisteredOnce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::RegisterPerCommand => "register per command",
            Strategy::Pool => "pre-registered pool",
            Strategy::RegisteredOnce => "registered once",
        }
    }
}

/// One size's figures for one strategy.
#[derive(Debug, Clone)]
pub struct RegPoint {
    pub strategy: Strategy,
    pub size: usize,
    pub commands: usize,
    /// Median over rounds of the mean wall time per command.
    pub wall_us: f64,
    /// Median over rounds of the process CPU time per command.
    pub cpu_us: f64,
}

type Res<T> = Result<T, String>;

/// Two connected software RNICs: `a` writes into `b`'s sink.
struct Pair {
    a: Arc<Rnic>,
    pda: rnic::Pd,
    qp: Qp,
    cq: Cq,
    ch: Channel,
    sink: Mr,
    _b: (Rnic, Qp, Cq),
}

fn connect(max: usize) -> Res<Pair> {
    let e = |x: rdma::Error| x.to_string();
    let a = Arc::new(Rnic::new().map_err(e)?);
    let b = Rnic::new().map_err(e)?;
    let pda = a.alloc_pd().map_err(e)?;
    let pdb = b.alloc_pd().map_err(e)?;
    let ch = a.create_channel().map_err(e)?;
    let cq = a.create_cq(64, Some(&ch)).map_err(e)?;
    let qp = a.create_qp(&pda, &cq, &cq, QpCaps::default()).map_err(e)?;
    let cqb = b.create_cq(64, None).map_err(e)?;
    let qpb = b
        .create_qp(&pdb, &cqb, &cqb, QpCaps::default())
        .map_err(e)?;
    let sink = b
        .reg_mr(&pdb, max, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e)?;
    // The responder holds its transmit side until the first FPDU arrives: one Send opens it.
    let first = b.reg_mr(&pdb, 64, Access::LOCAL_WRITE).map_err(e)?;
    qpb.post_recv(RecvWr {
        wr_id: 0,
        sges: vec![first.sge(0, 1)],
    })
    .map_err(e)?;
    let listener = b.listen("127.0.0.1:0".parse().unwrap()).map_err(e)?;
    let addr = listener.local_addr();
    let params = ConnParams {
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    std::thread::scope(|s| -> Res<()> {
        let qpb = &qpb;
        let p2 = params.clone();
        let h = s.spawn(move || -> Res<()> {
            let req = listener
                .get_request(Duration::from_secs(10))
                .map_err(e)?
                .ok_or("no connection request")?;
            req.accept(qpb, &p2).map(|_| ()).map_err(e)
        });
        qp.connect(addr, &params).map_err(e)?;
        h.join()
            .map_err(|_| "the accepting thread panicked".to_string())?
    })?;
    let one = a.reg_mr(&pda, 1, Access::NONE).map_err(e)?;
    qp.post_send(SendWr {
        wr_id: 0,
        op: SendOp::Send,
        sges: vec![one.sge(0, 1)],
        signaled: true,
    })
    .map_err(e)?;
    wait_ok(&cq, &ch)?;
    Ok(Pair {
        a,
        pda,
        qp,
        cq,
        ch,
        sink,
        _b: (b, qpb, cqb),
    })
}

/// User plus system CPU time of this process.
fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given; RUSAGE_SELF is always valid.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

impl Pair {
    /// One command's read data (`data`, in ordinary memory) written to the peer the way
    /// `strategy` does it; `once` holds the same bytes in memory registered once.
    fn command(
        &self,
        strategy: Strategy,
        data: &[u8],
        once: &Mr,
        pool: &Arc<MrPool<Rnic>>,
    ) -> Res<()> {
        let e = |x: rdma::Error| x.to_string();
        let write = |mr: &Mr| -> Res<()> {
            self.qp
                .post_send(SendWr {
                    wr_id: 1,
                    op: SendOp::RdmaWrite {
                        remote_addr: self.sink.addr(),
                        rkey: self.sink.rkey(),
                    },
                    sges: vec![mr.sge(0, data.len())],
                    signaled: true,
                })
                .map_err(e)?;
            wait_ok(&self.cq, &self.ch).map(|_| ())
        };
        match strategy {
            Strategy::RegisterPerCommand => {
                let mr = self
                    .a
                    .reg_mr(&self.pda, data.len(), Access::NONE)
                    .map_err(e)?;
                mr.write_at(0, data);
                write(&mr)
            }
            Strategy::Pool => {
                let lease = pool.take(data.len()).map_err(e)?;
                lease.mr().write_at(0, data);
                write(lease.mr())
            }
            Strategy::RegisteredOnce => write(once),
        }
    }
}

/// Measures every strategy at every size: `rounds` alternating rounds of about
/// `bytes_per_round` (at least 4 commands) each.
pub fn measure(sizes: &[usize], bytes_per_round: usize, rounds: usize) -> Res<Vec<RegPoint>> {
    let max = sizes.iter().copied().max().unwrap_or(4096).max(1);
    let pair = connect(max)?;
    let e = |x: rdma::Error| x.to_string();
    let data: Vec<u8> = (0..max).map(|i| (i * 7 % 251) as u8).collect();
    let once = pair.a.reg_mr(&pair.pda, max, Access::NONE).map_err(e)?;
    once.write_at(0, &data);
    let pool = MrPool::new(pair.a.clone(), pair.pda.clone(), Access::NONE, 2 * max);
    let mut points = Vec::new();
    for &size in sizes {
        let n = (bytes_per_round / size).clamp(4, 2000);
        let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); Strategy::ALL.len()];
        for s in Strategy::ALL {
            pair.command(s, &data[..size], &once, &pool)?; // warm up (the pool's first take)
        }
        for _ in 0..rounds.max(1) {
            for (i, s) in Strategy::ALL.into_iter().enumerate() {
                let (t0, c0) = (Instant::now(), process_cpu());
                for _ in 0..n {
                    pair.command(s, &data[..size], &once, &pool)?;
                }
                let wall = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
                let cpu = (process_cpu() - c0).as_secs_f64() * 1e6 / n as f64;
                samples[i].push((wall, cpu));
            }
        }
        for (i, s) in Strategy::ALL.into_iter().enumerate() {
            points.push(RegPoint {
                strategy: s,
                size,
                commands: n * rounds.max(1),
                wall_us: median(samples[i].iter().map(|x| x.0).collect()),
                cpu_us: median(samples[i].iter().map(|x| x.1).collect()),
            });
        }
    }
    pair.qp.disconnect();
    Ok(points)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_places_the_commands_bytes() {
        let size = 100_000;
        let pair = connect(size).unwrap();
        let pool = MrPool::new(pair.a.clone(), pair.pda.clone(), Access::NONE, 1 << 20);
        for (k, s) in Strategy::ALL.into_iter().enumerate() {
            let data: Vec<u8> = (0..size).map(|i| (i * 13 + k * 101) as u8).collect();
            let once = pair.a.reg_mr(&pair.pda, size, Access::NONE).unwrap();
            once.write_at(0, &data);
            pair.command(s, &data, &once, &pool).unwrap();
            // A Write completes locally once sent; the peer places it a moment later.
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut got = vec![0u8; size];
            loop {
                pair.sink.read_at(0, &mut got);
                if got == data || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(got == data, "{}: the peer holds other bytes", s.name());
        }
    }

    #[test]
    fn measure_reports_each_strategy_at_each_size() {
        let points = measure(&[4096, 1 << 20], 1 << 20, 1).unwrap();
        assert_eq!(points.len(), 6);
        assert!(points.iter().all(|p| p.wall_us > 0.0 && p.commands >= 4));
    }
}
