//! A ping speaking rdma-core's `rping` application protocol (librdmacm/examples/rping.c), so it
//! interoperates with `rping -s` / `rping -c` over Linux siw:
//!
//! 1. client Sends its source buffer descriptor `{buf: u64 BE, rkey: u32 BE, size: u32 BE}`;
//! 2. server RDMA Reads the ping data from it, then Sends a 16-byte "go ahead";
//! 3. client Sends its sink buffer descriptor;
//! 4. server RDMA Writes the data (up to its NUL, inclusive) into the sink, then Sends "go ahead";
//! 5. client checks the sink equals the source. Repeat; the client then disconnects.

use crate::next_wc;
use rdma::{
    Access, ConnParams, ConnectRequest, Listener, MemoryRegion, Provider, QpCaps, QueuePair,
    RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// [`server`]'s error when no client came within the timeout.
pub const NO_REQUEST: &str = "no connection request within the timeout";

/// rping's largest ping buffer (RPING_BUFSIZE).
pub const MAX_SIZE: usize = 64 * 1024;
const INFO_LEN: usize = 16;

#[derive(Debug, Clone)]
pub struct PingOptions {
    pub count: u32,
    /// Ping data size (rping -S), at least 25 bytes.
    pub size: usize,
    /// Request MPA CRC.
    pub crc: bool,
    pub timeout: Duration,
    /// Print the ping data like rping -v.
    pub verbose: bool,
}

impl Default for PingOptions {
    fn default() -> Self {
        PingOptions {
            count: 10,
            size: 64,
            crc: false,
            timeout: Duration::from_secs(10),
            verbose: false,
        }
    }
}

/// Summary of a client run.
#[derive(Debug, Clone)]
pub struct PingReport {
    pub iterations: u32,
    pub crc: bool,
    pub rtt_us: Vec<f64>,
}

fn info(buf: u64, rkey: u32, size: u32) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&buf.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_info(b: &[u8]) -> (u64, u32, u32) {
    (
        u64::from_be_bytes(b[..8].try_into().unwrap()),
        u32::from_be_bytes(b[8..12].try_into().unwrap()),
        u32::from_be_bytes(b[12..16].try_into().unwrap()),
    )
}

/// rping's ping text: "rdma-ping-N: " then letters cycling 'A'..'z' from a per-ping start, NUL last.
pub fn ping_data(ping: u32, size: usize, start: u8) -> Vec<u8> {
    let mut v = format!("rdma-ping-{ping}: ").into_bytes();
    v.truncate(size);
    let mut c = start;
    while v.len() < size {
        v.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = v.last_mut() {
        *last = 0;
    }
    v
}

type Res<T> = std::result::Result<T, String>;

fn expect<C: rdma::CompletionQueue>(cq: &C, want: WcOpcode, timeout: Duration) -> Res<rdma::Wc> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wc = next_wc(cq, left)
            .ok_or_else(|| format!("timed out waiting for {want:?} completion"))?;
        if wc.status != WcStatus::Success {
            return Err(format!(
                "{:?} completion failed: {:?}",
                wc.opcode, wc.status
            ));
        }
        if wc.opcode == want {
            return Ok(wc);
        }
        // Send completions are expected along the way; anything else is noted and skipped.
    }
}

/// Client side (`rping -c`): returns the per-iteration round-trip times.
pub fn client<P: Provider>(
    dev: &P,
    addr: SocketAddr,
    opt: &PingOptions,
    mut line: impl FnMut(String),
) -> Res<PingReport> {
    let size = opt.size.clamp(25, MAX_SIZE - 1);
    let e = |x: rdma::Error| x.to_string();
    let pd = dev.alloc_pd().map_err(e)?;
    let cq = dev.create_cq(64, None).map_err(e)?;
    let qp = dev
        .create_qp(
            &pd,
            &cq,
            &cq,
            QpCaps {
                max_send_wr: 16,
                max_recv_wr: 2,
                max_sge: 1,
            },
        )
        .map_err(e)?;
    let recv_mr = dev.reg_mr(&pd, INFO_LEN, Access::LOCAL_WRITE).map_err(e)?;
    let send_mr = dev.reg_mr(&pd, INFO_LEN, Access::NONE).map_err(e)?;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let start_mr = dev.reg_mr(&pd, size, rw).map_err(e)?;
    let rdma_mr = dev.reg_mr(&pd, size, rw).map_err(e)?;
    let post_recv = || {
        qp.post_recv(RecvWr {
            wr_id: 1,
            sges: vec![recv_mr.sge(0, INFO_LEN)],
        })
        .map_err(e)
    };
    post_recv()?;
    let params = ConnParams {
        ird: 1,
        ord: 1,
        crc: opt.crc,
        timeout: opt.timeout,
        ..Default::default()
    };
    let conn = qp
        .connect(addr, &params)
        .map_err(|x| format!("connect to {addr}: {x}"))?;
    line(format!(
        "connected to {addr}: MPA CRC {}, IRD {} ORD {}",
        if conn.crc { "on" } else { "off" },
        conn.ird,
        conn.ord
    ));
    let send_info = |b: u64, rkey: u32| -> Res<()> {
        send_mr.write_at(0, &info(b, rkey, size as u32));
        qp.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sges: vec![send_mr.sge(0, INFO_LEN)],
            signaled: true,
        })
        .map_err(e)
    };
    let mut rtts = Vec::new();
    let mut start = 65u8;
    for ping in 0..opt.count {
        let data = ping_data(ping, size, start);
        start = if start >= 122 { 65 } else { start + 1 };
        start_mr.write_at(0, &data);
        rdma_mr.write_at(0, &vec![0u8; size]);
        let t0 = Instant::now();
        send_info(start_mr.addr(), start_mr.rkey())?;
        expect(&cq, WcOpcode::Recv, opt.timeout)?;
        post_recv()?;
        send_info(rdma_mr.addr(), rdma_mr.rkey())?;
        expect(&cq, WcOpcode::Recv, opt.timeout)?;
        post_recv()?;
        let rtt = t0.elapsed().as_secs_f64() * 1e6;
        let mut got = vec![0u8; size];
        rdma_mr.read_at(0, &mut got);
        if got != data {
            return Err(format!("ping {ping}: data mismatch"));
        }
        rtts.push(rtt);
        if opt.verbose {
            line(format!(
                "ping data: {}",
                String::from_utf8_lossy(&data[..size - 1])
            ));
        }
        line(format!(
            "ping {}/{}: {size} bytes read and written back, verified, {rtt:.0} us",
            ping + 1,
            opt.count
        ));
    }
    qp.disconnect();
    qp.wait_closed(Duration::from_secs(5));
    Ok(PingReport {
        iterations: opt.count,
        crc: conn.crc,
        rtt_us: rtts,
    })
}

/// Server side (`rping -s`): serves one client until it disconnects; returns the iterations served.
pub fn server<P: Provider>(
    dev: &P,
    listener: &P::Listener,
    opt: &PingOptions,
    mut line: impl FnMut(String),
) -> Res<u32> {
    let e = |x: rdma::Error| x.to_string();
    // A connection that fails before its request is complete (a port probe, a client that
    // closes or stalls) costs one line, and the server waits on for a real one.
    let deadline = Instant::now() + opt.timeout;
    let req = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match listener.get_request(left) {
            Ok(Some(req)) => break req,
            Ok(None) if left.is_zero() => return Err(NO_REQUEST.into()),
            Ok(None) => {}
            Err(x) if left.is_zero() => return Err(x.to_string()),
            Err(x) => {
                line(format!("connection request dropped: {x}"));
                std::thread::sleep(Duration::from_millis(10).min(left));
            }
        }
    };
    let peer = req.peer_addr();
    let pd = dev.alloc_pd().map_err(e)?;
    let cq = dev.create_cq(64, None).map_err(e)?;
    let qp = dev
        .create_qp(
            &pd,
            &cq,
            &cq,
            QpCaps {
                max_send_wr: 16,
                max_recv_wr: 2,
                max_sge: 1,
            },
        )
        .map_err(e)?;
    let recv_mr = dev.reg_mr(&pd, INFO_LEN, Access::LOCAL_WRITE).map_err(e)?;
    let send_mr = dev.reg_mr(&pd, INFO_LEN, Access::NONE).map_err(e)?;
    let rdma_mr = dev
        .reg_mr(
            &pd,
            MAX_SIZE,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .map_err(e)?;
    let post_recv = || {
        qp.post_recv(RecvWr {
            wr_id: 1,
            sges: vec![recv_mr.sge(0, INFO_LEN)],
        })
        .map_err(e)
    };
    post_recv()?;
    let (ird, ord) = req.peer_ird_ord();
    let params = ConnParams {
        ird: ord.max(1),
        ord: ird.max(1),
        crc: opt.crc,
        timeout: opt.timeout,
        ..Default::default()
    };
    let conn = req.accept(&qp, &params).map_err(e)?;
    line(format!(
        "accepted {peer}: MPA CRC {}, IRD {} ORD {}",
        if conn.crc { "on" } else { "off" },
        conn.ird,
        conn.ord
    ));
    let go_ahead = || {
        qp.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sges: vec![send_mr.sge(0, INFO_LEN)],
            signaled: true,
        })
    };
    let mut served = 0u32;
    // The client disconnects after its last ping: a flushed receive ends the loop.
    let idle = Duration::from_secs(3600);
    loop {
        let wc = match expect(&cq, WcOpcode::Recv, idle) {
            Ok(wc) => wc,
            Err(_) if qp.state() == rdma::QpState::Error => break,
            Err(x) => return Err(x),
        };
        if wc.byte_len as usize != INFO_LEN {
            return Err(format!("received bogus data, size {}", wc.byte_len));
        }
        let mut b = [0u8; INFO_LEN];
        recv_mr.read_at(0, &mut b);
        let (buf, rkey, size) = parse_info(&b);
        post_recv()?;
        let size = (size as usize).min(MAX_SIZE);
        qp.post_send(SendWr {
            wr_id: 3,
            op: SendOp::RdmaRead {
                remote_addr: buf,
                rkey,
            },
            sges: vec![rdma_mr.sge(0, size)],
            signaled: true,
        })
        .map_err(e)?;
        expect(&cq, WcOpcode::RdmaRead, opt.timeout)?;
        let mut data = vec![0u8; size];
        rdma_mr.read_at(0, &mut data);
        let text_len = data.iter().position(|&c| c == 0).unwrap_or(size);
        if opt.verbose {
            line(format!(
                "server ping data: {}",
                String::from_utf8_lossy(&data[..text_len])
            ));
        }
        go_ahead().map_err(e)?;
        let wc = expect(&cq, WcOpcode::Recv, opt.timeout)?;
        if wc.byte_len as usize != INFO_LEN {
            return Err(format!("received bogus data, size {}", wc.byte_len));
        }
        recv_mr.read_at(0, &mut b);
        let (sink, sink_rkey, _) = parse_info(&b);
        post_recv()?;
        let wlen = (text_len + 1).min(size);
        qp.post_send(SendWr {
            wr_id: 4,
            op: SendOp::RdmaWrite {
                remote_addr: sink,
                rkey: sink_rkey,
            },
            sges: vec![rdma_mr.sge(0, wlen)],
            signaled: true,
        })
        .map_err(e)?;
        expect(&cq, WcOpcode::RdmaWrite, opt.timeout)?;
        go_ahead().map_err(e)?;
        served += 1;
        line(format!(
            "served ping {served}: read {size} bytes, wrote {wlen} bytes back"
        ));
    }
    qp.disconnect();
    Ok(served)
}
