//! The delay proxy: a TCP relay that makes a loopback path look like a long link. Each
//! direction is an emulated link with a one-way delay and an optional rate: bytes read at
//! time t leave at `max(t, link free) + len/rate + delay`. Buffers are bounded (when the
//! in-flight bytes of a direction reach the bound, the proxy stops reading and TCP flow
//! control pushes back on the sender).
//!
//! A slow target (`service_delay`): the direction from the upstream target is cut into iSCSI
//! PDUs (digests off) and each Data-In and SCSI Response is held that much longer, while
//! login, R2T, NOP and Text PDUs pass at the link's delay: to the initiator the target's
//! backend looks slow, the network does not.
//!
//! Faults (`faults`, see [`crate::fault`]): at a chosen PDU or byte of a chosen connection
//! and direction, the proxy cuts the connection, stalls the direction, drops the PDU or
//! flips a byte of it; scenarios that must end with nothing acknowledged lost.
//!
//! Loss injection: a user-space relay cannot make the kernel lose a TCP segment, so
//! `drop_segment` installs a one-shot netfilter rule (`iptables-legacy` INPUT chain, statistic match in
//! nth mode on the exact 4-tuple of the relay's outgoing connection) that drops the Nth
//! data-carrying segment of that direction; the kernel's TCP then really retransmits it. It
//! needs root and is meant to run inside a private network namespace.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fault::{Fault, LoginWatch, Piece, StreamCutter};

pub use crate::fault::Direction;

/// Drop one segment: the `nth` (1-based) data-carrying segment of `direction` on the first
/// relayed connection.
#[derive(Debug, Clone, Copy)]
pub struct DropSegment {
    pub direction: Direction,
    pub nth: u32,
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    /// One-way delay added in each direction.
    pub delay: Duration,
    /// Link rate in bytes per second (None: unlimited).
    pub rate: Option<f64>,
    /// Bytes in flight per direction before the proxy stops reading.
    pub buffer: usize,
    pub drop_segment: Option<DropSegment>,
    /// Extra time each Data-In and SCSI Response from the upstream target is held (an
    /// emulated slow backend).
    pub service_delay: Duration,
    /// Faults to inject, each on its connection (in accept order) and direction.
    pub faults: Vec<Fault>,
}

impl ProxyConfig {
    pub fn new(listen: SocketAddr, upstream: SocketAddr, delay: Duration) -> ProxyConfig {
        ProxyConfig {
            listen,
            upstream,
            delay,
            rate: None,
            buffer: 64 << 20,
            drop_segment: None,
            service_delay: Duration::ZERO,
            faults: Vec::new(),
        }
    }
}

/// A running proxy; dropping it stops accepting (relayed connections end with their peers).
pub struct DelayProxy {
    addr: SocketAddr,
    fired: Arc<Mutex<Vec<Fault>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the writer of a direction does next.
enum Item {
    /// Deliver these bytes at this time; `stalled`: held by a stall fault, given up if the
    /// sending side ends meanwhile.
    Bytes {
        due: Instant,
        data: Vec<u8>,
        stalled: bool,
    },
    /// Cut the connection (a reset fault).
    Reset,
}

impl Item {
    fn len(&self) -> usize {
        match self {
            Item::Bytes { data, .. } => data.len(),
            Item::Reset => 0,
        }
    }
}

struct Queue {
    items: VecDeque<Item>,
    bytes: usize,
    /// The reader saw the end of its input.
    closed: bool,
    /// The writer could not deliver: the reader must stop and reset its input.
    failed: bool,
}

struct Link {
    q: Mutex<Queue>,
    cv: Condvar,
}

const CHUNK: usize = 16 * 1024;

impl DelayProxy {
    pub fn start(cfg: ProxyConfig) -> io::Result<DelayProxy> {
        let listener = TcpListener::bind(cfg.listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let fired = Arc::new(Mutex::new(Vec::new()));
        let fired_log = fired.clone();
        let thread = std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                let mut accepted = 0usize;
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let drop = if accepted == 0 {
                                cfg.drop_segment
                            } else {
                                None
                            };
                            let conn = accepted;
                            accepted += 1;
                            let cfg = cfg.clone();
                            let fired = fired_log.clone();
                            std::thread::spawn(move || {
                                if let Err(e) = relay(client, &cfg, conn, drop, fired) {
                                    eprintln!("delay-proxy: connection ended: {e}");
                                }
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })?;
        Ok(DelayProxy {
            addr,
            fired,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The faults that have fired so far, in order.
    pub fn fired(&self) -> Vec<Fault> {
        self.fired.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A netfilter rule that is deleted when dropped.
struct LossRule {
    spec: Vec<String>,
}

impl LossRule {
    fn install(src: SocketAddr, dst: SocketAddr, nth: u32) -> io::Result<LossRule> {
        let spec: Vec<String> = [
            // INPUT: after the capture point of `tcpdump -i lo`, so the capture holds the
            // original segment and its retransmission, as a capture at the sender would.
            "INPUT",
            "-p",
            "tcp",
            "-s",
            &src.ip().to_string(),
            "--sport",
            &src.port().to_string(),
            "-d",
            &dst.ip().to_string(),
            "--dport",
            &dst.port().to_string(),
            "-m",
            "length",
            "--length",
            "80:65535",
            "-m",
            "statistic",
            "--mode",
            "nth",
            "--every",
            "2000000000",
            "--packet",
            &(nth.saturating_sub(1)).to_string(),
            "-j",
            "DROP",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let st = Command::new("iptables-legacy")
            .arg("-I")
            .args(&spec)
            .status()?;
        if !st.success() {
            return Err(io::Error::other(
                "iptables-legacy could not add the drop rule",
            ));
        }
        Ok(LossRule { spec })
    }
}

impl Drop for LossRule {
    fn drop(&mut self) {
        let _ = Command::new("iptables-legacy")
            .arg("-D")
            .args(&self.spec)
            .status();
    }
}

fn relay(
    client: TcpStream,
    cfg: &ProxyConfig,
    conn: usize,
    drop: Option<DropSegment>,
    fired: Arc<Mutex<Vec<Fault>>>,
) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect(cfg.upstream)?;
    // The proxy is a link, not an endpoint: no Nagle delays of its own.
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let _rule = match drop {
        Some(d) => Some(match d.direction {
            Direction::Up => LossRule::install(server.local_addr()?, cfg.upstream, d.nth)?,
            Direction::Down => LossRule::install(client.local_addr()?, client.peer_addr()?, d.nth)?,
        }),
        None => None,
    };
    let login = Arc::new(LoginWatch::default());
    let up_cut = StreamCutter::new(conn, Direction::Up, &cfg.faults, false, login.clone());
    let slow_target = !cfg.service_delay.is_zero();
    let down_cut = StreamCutter::new(conn, Direction::Down, &cfg.faults, slow_target, login);
    let up = pump(
        client.try_clone()?,
        server.try_clone()?,
        cfg,
        up_cut,
        fired.clone(),
    );
    let down = pump(server, client, cfg, down_cut, fired);
    let _ = up.join();
    let _ = down.join();
    Ok(())
}

/// Extra time a PDU from the target is held by a slow backend: Data-In and SCSI Responses
/// wait, login, R2T, NOP and Text PDUs pass at the link's delay.
fn service_hold(opcode: Option<u8>, service_delay: Duration) -> Duration {
    match opcode {
        Some(0x21 | 0x25) => service_delay,
        _ => Duration::ZERO,
    }
}

/// Cuts the connection: both peers see the end of the stream, then (with a zero linger, once
/// the relay's threads have closed their descriptors) a reset.
fn reset(a: &TcpStream, b: &TcpStream) {
    for s in [a, b] {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// Sleeps until `due`; a stalled item is given up (false) once the sending side has ended.
fn wait_until(due: Instant, stalled: bool, link: &Link) -> bool {
    loop {
        let now = Instant::now();
        if due <= now {
            return true;
        }
        if !stalled {
            std::thread::sleep(due - now);
            return true;
        }
        let q = link.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            return false;
        }
        let slice = (due - now).min(Duration::from_millis(50));
        drop(link.cv.wait_timeout(q, slice));
    }
}

/// One direction: a reader thread stamping departure times and a writer thread delivering.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    cfg: &ProxyConfig,
    mut cutter: StreamCutter,
    fired: Arc<Mutex<Vec<Fault>>>,
) -> JoinHandle<()> {
    let link = Arc::new(Link {
        q: Mutex::new(Queue {
            items: VecDeque::new(),
            bytes: 0,
            closed: false,
            failed: false,
        }),
        cv: Condvar::new(),
    });
    let (delay, rate, cap) = (cfg.delay, cfg.rate, cfg.buffer.max(CHUNK));
    let service_delay = cfg.service_delay;
    let wlink = link.clone();
    let peer = from.try_clone();
    let writer = std::thread::spawn(move || {
        loop {
            let item = {
                let mut q = wlink.q.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(it) = q.items.pop_front() {
                        q.bytes -= it.len();
                        wlink.cv.notify_all();
                        break Some(it);
                    }
                    if q.closed {
                        break None;
                    }
                    q = wlink.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let delivered = match item {
                None => break,
                Some(Item::Reset) => {
                    if let Ok(peer) = &peer {
                        reset(&to, peer);
                    }
                    false
                }
                Some(Item::Bytes { due, data, stalled }) => {
                    wait_until(due, stalled, &wlink) && to.write_all(&data).is_ok()
                }
            };
            if !delivered {
                let mut q = wlink.q.lock().unwrap_or_else(|p| p.into_inner());
                q.failed = true;
                q.items.clear();
                q.bytes = 0;
                wlink.cv.notify_all();
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        let mut link_free = Instant::now();
        let mut stalled_until: Option<Instant> = None;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = Instant::now();
            let start = link_free.max(now);
            let serial = rate.map_or(Duration::ZERO, |r| Duration::from_secs_f64(n as f64 / r));
            link_free = start + serial;
            let due = link_free + delay;
            let mut q = link.q.lock().unwrap_or_else(|p| p.into_inner());
            while q.bytes + n > cap && !q.items.is_empty() && !q.failed {
                q = link.cv.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.failed {
                // The far side is gone: reset this side too so its sender stops.
                let _ = from.shutdown(Shutdown::Both);
                break;
            }
            let pieces = if cutter.is_active() {
                let pieces = cutter.push(&buf[..n]);
                for f in cutter.take_fired() {
                    eprintln!("delay-proxy: fault {f} fired");
                    fired.lock().unwrap_or_else(|p| p.into_inner()).push(f);
                }
                pieces
            } else {
                vec![Piece::Bytes {
                    bytes: buf[..n].to_vec(),
                    opcode: None,
                }]
            };
            for piece in pieces {
                match piece {
                    Piece::Bytes { bytes, opcode } => {
                        let due = due + service_hold(opcode, service_delay);
                        let (due, stalled) = match stalled_until {
                            Some(until) => (due.max(until), true),
                            None => (due, false),
                        };
                        q.bytes += bytes.len();
                        q.items.push_back(Item::Bytes {
                            due,
                            data: bytes,
                            stalled,
                        });
                    }
                    Piece::Stall(d) => stalled_until = Some(Instant::now() + d),
                    Piece::Reset => q.items.push_back(Item::Reset),
                }
            }
            link.cv.notify_all();
        }
        let mut q = link.q.lock().unwrap_or_else(|p| p.into_inner());
        q.closed = true;
        link.cv.notify_all();
        drop(q);
        let _ = writer.join();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        addr
    }

    fn pdu(opcode: u8, data_len: usize) -> Vec<u8> {
        let mut p = vec![0u8; 48 + data_len.div_ceil(4) * 4];
        p[0] = opcode;
        p[5..8].copy_from_slice(&(data_len as u32).to_be_bytes()[1..]);
        p
    }

    #[test]
    fn only_data_in_and_status_are_held() {
        let login = Arc::new(LoginWatch::default());
        let mut cut = StreamCutter::new(0, Direction::Down, &[], true, login);
        let stream = [pdu(0x23, 10), pdu(0x25, 4097), pdu(0x31, 0), pdu(0x21, 0)].concat();
        let (first, rest) = stream.split_at(100);
        let mut out = cut.push(first);
        assert_eq!(
            out.len(),
            1,
            "the login response; the Data-In is not complete yet"
        );
        out.extend(cut.push(rest));
        let held: Vec<(u8, u64)> = out
            .iter()
            .map(|p| match p {
                Piece::Bytes { bytes, opcode } => (
                    bytes[0],
                    service_hold(*opcode, Duration::from_millis(7)).as_millis() as u64,
                ),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(held, [(0x23, 0), (0x25, 7), (0x31, 0), (0x21, 7)]);
    }

    #[test]
    fn round_trip_takes_two_delays_and_bytes_survive() {
        let upstream = echo_server();
        let p = DelayProxy::start(ProxyConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            Duration::from_millis(20),
        ))
        .unwrap();
        let mut c = TcpStream::connect(p.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // First exchange measures the round trip.
        let t = Instant::now();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        let rtt = t.elapsed();
        assert_eq!(&b, b"ping");
        assert!(rtt >= Duration::from_millis(40), "rtt {rtt:?}");
        // A larger payload arrives intact and in order.
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = c.try_clone().unwrap();
        let d2 = data.clone();
        let wt = std::thread::spawn(move || w.write_all(&d2).unwrap());
        let mut got = vec![0u8; data.len()];
        c.read_exact(&mut got).unwrap();
        wt.join().unwrap();
        assert_eq!(got, data);
    }
}
