//! Bandwidth and latency of RDMA Write, RDMA Read and Send versus message size (in the manner of
//! perftest's ib_write_bw), measured between two RNIC instances over loopback TCP in one process,
//! next to a plain TCP socket stream measured in the same run as the baseline.

use rdma::{
    Access, CompletionChannel, CompletionQueue, ConnParams, ConnectRequest, Listener, MemoryRegion,
    Provider, QpCaps, QueuePair, RecvWr, SendOp, SendWr, WcStatus,
};
use rnic::{Channel, Cq, Mr, Qp, Rnic};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Read,
    Send,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
        }
    }
}

#[derive(Debug, Clone)]
pub struct BwOptions {
    pub ops: Vec<Op>,
    pub sizes: Vec<usize>,
    /// Bytes to move per (op, size) point; at least `min_iters` messages are sent.
    pub bytes_per_point: usize,
    pub min_iters: usize,
    /// Messages in flight.
    pub depth: usize,
    pub crc: bool,
    /// How long each RNIC's progress thread polls after its last work before it sleeps
    /// ([`Rnic::polling`]); iSER's engines poll so (`datamover_iser::rnic_task`), and a ceiling
    /// measured with engines that sleep is not theirs.
    pub poll: Duration,
}

#[derive(Debug, Clone)]
pub struct BwPoint {
    pub op: Op,
    pub size: usize,
    pub iters: usize,
    pub mib_per_s: f64,
    /// Mean time from post to completion.
    pub avg_latency_us: f64,
}

struct Side {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    /// Both CQs report to it: the measuring thread sleeps on it instead of polling, leaving the
    /// CPU to the progress threads (it matters on a loaded machine).
    ch: Channel,
}

fn side(dev: &Rnic, pd: &rnic::Pd) -> rdma::Result<Side> {
    let ch = dev.create_channel()?;
    let scq = dev.create_cq(8192, Some(&ch))?;
    let rcq = dev.create_cq(8192, Some(&ch))?;
    let qp = dev.create_qp(
        pd,
        &scq,
        &rcq,
        QpCaps {
            max_send_wr: 4096,
            max_recv_wr: 4096,
            max_sge: 4,
        },
    )?;
    Ok(Side { qp, scq, rcq, ch })
}

type Res<T> = std::result::Result<T, String>;

/// Runs every (op, size) point; returns the points.
pub fn run_loopback(opt: &BwOptions) -> Res<Vec<BwPoint>> {
    let e = |x: rdma::Error| x.to_string();
    let a = Rnic::polling(opt.poll).map_err(e)?;
    let b = Rnic::polling(opt.poll).map_err(e)?;
    let pda = a.alloc_pd().map_err(e)?;
    let pdb = b.alloc_pd().map_err(e)?;
    let max = *opt.sizes.iter().max().unwrap_or(&4096);
    let depth = opt.depth.max(1);
    // Buffers: one message-size slot per in-flight message, capped at 256 MiB per side.
    let slots = depth.min((256 << 20) / max.max(1)).max(1);
    let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let abuf = a.reg_mr(&pda, max * slots, all).map_err(e)?;
    let bbuf = b.reg_mr(&pdb, max * slots, all).map_err(e)?;
    abuf.with_bytes_mut(|s| {
        s.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i * 31 % 251) as u8)
    });
    let sa = side(&a, &pda).map_err(e)?;
    let sb = side(&b, &pdb).map_err(e)?;
    let listener = b.listen("127.0.0.1:0".parse().unwrap()).map_err(e)?;
    let addr = listener.local_addr();
    let params = ConnParams {
        crc: opt.crc,
        ird: 64,
        ord: 64,
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    std::thread::scope(|s| -> Res<()> {
        let p2 = params.clone();
        let qb = &sb.qp;
        let h = s.spawn(move || -> Res<()> {
            let req = listener
                .get_request(Duration::from_secs(10))
                .map_err(e)?
                .ok_or("no request")?;
            req.accept(qb, &p2).map_err(e)?;
            Ok(())
        });
        sa.qp.connect(addr, &params).map_err(e)?;
        h.join().map_err(|_| "accept thread panicked".to_string())?
    })?;
    // The responder holds its transmit side until the initiator's first FPDU: send one.
    sb.qp
        .post_recv(RecvWr {
            wr_id: 0,
            sges: vec![bbuf.sge(0, 1)],
        })
        .map_err(e)?;
    sa.qp
        .post_send(SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sges: vec![abuf.sge(0, 1)],
            signaled: true,
        })
        .map_err(e)?;
    wait_ok(&sb.rcq, &sb.ch)?;
    wait_ok(&sa.scq, &sa.ch)?;

    let mut points = Vec::new();
    for &op in &opt.ops {
        for &size in &opt.sizes {
            let iters = (opt.bytes_per_point / size).max(opt.min_iters);
            points.push(measure(op, size, iters, slots, &sa, &sb, &abuf, &bbuf)?);
        }
    }
    sa.qp.disconnect();
    sa.qp.wait_closed(Duration::from_secs(5));
    Ok(points)
}

/// The next completion of `cq`, sleeping on the channel between checks: poll, re-arm, poll again
/// (the re-arm-then-poll rule), then wait for the channel (bounded).
pub fn wait_ok(cq: &Cq, ch: &Channel) -> Res<rdma::Wc> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = [rdma::Wc::EMPTY];
    let wc = loop {
        if cq.poll(&mut out) == 1 {
            break out[0];
        }
        cq.req_notify(false);
        if cq.poll(&mut out) == 1 {
            break out[0];
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out waiting for a completion".into());
        }
        ch.get_events(Some(left.min(Duration::from_millis(100))))
            .map_err(|x| x.to_string())?;
    };
    if wc.status != WcStatus::Success {
        return Err(format!(
            "{:?} completion failed: {:?}",
            wc.opcode, wc.status
        ));
    }
    Ok(wc)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    op: Op,
    size: usize,
    iters: usize,
    slots: usize,
    sa: &Side,
    sb: &Side,
    abuf: &Mr,
    bbuf: &Mr,
) -> Res<BwPoint> {
    let e = |x: rdma::Error| x.to_string();
    let mut posted = 0usize;
    let mut done = 0usize;
    let mut post_times = std::collections::VecDeque::new();
    let mut lat_sum = 0.0;
    let t0 = Instant::now();
    if op == Op::Send {
        for i in 0..slots.min(iters) {
            sb.qp
                .post_recv(RecvWr {
                    wr_id: i as u64,
                    sges: vec![bbuf.sge((i % slots) * size, size)],
                })
                .map_err(e)?;
        }
    }
    let mut recv_posted = slots.min(iters);
    while done < iters {
        while posted < iters && posted - done < slots {
            let slot = posted % slots;
            let wr_op = match op {
                Op::Write => SendOp::RdmaWrite {
                    remote_addr: bbuf.addr() + (slot * size) as u64,
                    rkey: bbuf.rkey(),
                },
                Op::Read => SendOp::RdmaRead {
                    remote_addr: bbuf.addr() + (slot * size) as u64,
                    rkey: bbuf.rkey(),
                },
                Op::Send => SendOp::Send,
            };
            sa.qp
                .post_send(SendWr {
                    wr_id: posted as u64,
                    op: wr_op,
                    sges: vec![abuf.sge(slot * size, size)],
                    signaled: true,
                })
                .map_err(e)?;
            post_times.push_back(Instant::now());
            posted += 1;
        }
        wait_ok(&sa.scq, &sa.ch)?;
        if op == Op::Send {
            // The receiver's completion is the one that matters; then repost its buffer.
            wait_ok(&sb.rcq, &sb.ch)?;
            if recv_posted < iters {
                let slot = recv_posted % slots;
                sb.qp
                    .post_recv(RecvWr {
                        wr_id: recv_posted as u64,
                        sges: vec![bbuf.sge(slot * size, size)],
                    })
                    .map_err(e)?;
                recv_posted += 1;
            }
        }
        lat_sum += post_times
            .pop_front()
            .map(|t| t.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        done += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(BwPoint {
        op,
        size,
        iters,
        mib_per_s: (iters * size) as f64 / secs / (1 << 20) as f64,
        avg_latency_us: lat_sum / iters as f64 * 1e6,
    })
}

/// A plain TCP stream between two loopback sockets in this process: `total` bytes written in
/// `chunk`-sized writes and read into a buffer of the same size. Returns MiB/s.
pub fn tcp_baseline(total: usize, chunk: usize) -> Res<f64> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|x| x.to_string())?;
    let addr = l.local_addr().map_err(|x| x.to_string())?;
    let reader = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; chunk];
        let mut got = 0;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(got);
            }
            got += n;
        }
    });
    let mut s = std::net::TcpStream::connect(addr).map_err(|x| x.to_string())?;
    s.set_nodelay(true).map_err(|x| x.to_string())?;
    let buf: Vec<u8> = (0..chunk).map(|i| (i * 31 % 251) as u8).collect();
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&buf).map_err(|x| x.to_string())?;
        sent += chunk;
    }
    drop(s);
    let got = reader
        .join()
        .map_err(|_| "reader panicked".to_string())?
        .map_err(|x| x.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    if got != sent {
        return Err(format!("TCP baseline lost data: sent {sent}, got {got}"));
    }
    Ok(sent as f64 / secs / (1 << 20) as f64)
}
