//! TCP flow control seen from inside the stack, live: `getsockopt(TCP_INFO)` on a socket,
//! sampled at a fixed interval on a thread. The samples are `analyze::tcpinfo` data, written
//! as a table (CSV/JSON) and plotted as cwnd and throughput over time there.
//!
//! ```no_run
//! # use std::os::fd::AsFd;
//! # let stream = std::net::TcpStream::connect("127.0.0.1:3260").unwrap();
//! let sampler = lab::tcpinfo::TcpInfoSampler::new(stream.as_fd(), std::time::Duration::from_millis(10)).unwrap();
//! // ... run the workload on `stream` ...
//! let samples = sampler.stop();
//! std::fs::write("cwnd.svg", analyze::tcpinfo::cwnd_plot(&samples).to_svg()).unwrap();
//! ```

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use analyze::tcpinfo::{TcpInfo, TcpSample};

/// Reads TCP_INFO of a socket once.
pub fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<TcpInfo> {
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `fd` is a valid open descriptor for the duration of the borrow; `buf` is a
    // writable buffer of `len` bytes and `len` points to its size, which the kernel updates
    // to the number of bytes written (never more than the size given).
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpInfo::parse(&buf[..(len as usize).min(buf.len())]))
}

/// Samples a socket's TCP_INFO on a thread until stopped. It holds a duplicate of the
/// descriptor, so the socket stays valid while sampled even if the caller closes its copy.
pub struct TcpInfoSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<TcpSample>>>,
}

/// Upper bound on samples kept (about 28 hours at 100 ms, 17 minutes at 1 ms).
pub const MAX_SAMPLES: usize = 1_000_000;

impl TcpInfoSampler {
    pub fn new(fd: BorrowedFd<'_>, interval: Duration) -> io::Result<TcpInfoSampler> {
        let owned: OwnedFd = fd.try_clone_to_owned()?;
        tcp_info(owned.as_fd_ref())?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tcp-info".into())
            .spawn(move || {
                let start = Instant::now();
                let mut out = Vec::new();
                let mut ok = true;
                while !flag.load(Ordering::Relaxed) && out.len() < MAX_SAMPLES {
                    match tcp_info(owned.as_fd_ref()) {
                        Ok(info) => out.push(TcpSample {
                            t: start.elapsed().as_secs_f64(),
                            info,
                        }),
                        Err(_) => {
                            ok = false;
                            break;
                        }
                    }
                    std::thread::sleep(interval);
                }
                // One last sample at the moment of the stop, so the series covers all of
                // the traffic up to it (not only up to the last tick).
                if ok && out.len() < MAX_SAMPLES {
                    if let Ok(info) = tcp_info(owned.as_fd_ref()) {
                        out.push(TcpSample {
                            t: start.elapsed().as_secs_f64(),
                            info,
                        });
                    }
                }
                out
            })?;
        Ok(TcpInfoSampler {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops sampling (after one last sample taken now) and returns the samples.
    pub fn stop(mut self) -> Vec<TcpSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for TcpInfoSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

trait AsFdRef {
    fn as_fd_ref(&self) -> BorrowedFd<'_>;
}
impl AsFdRef for OwnedFd {
    fn as_fd_ref(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use analyze::tcpinfo::{cwnd_plot, cwnd_throughput_svg, table, table_named};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn samples_a_real_loopback_transfer() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0usize;
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n;
            }
            total
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let sampler = TcpInfoSampler::new(c.as_fd(), Duration::from_millis(1)).unwrap();
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..32 {
            c.write_all(&chunk).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let samples = sampler.stop();
        drop(c);
        assert_eq!(reader.join().unwrap(), 32 << 20);
        assert!(samples.len() >= 2);
        let last = samples.last().unwrap().info;
        // TCP_ESTABLISHED = 1; all 32 MiB were acknowledged before the last sample.
        assert_eq!(last.state, 1);
        assert!(last.snd_cwnd >= 10, "cwnd {}", last.snd_cwnd);
        assert!(last.snd_mss > 0);
        assert!(last.bytes_acked >= 32 << 20, "acked {}", last.bytes_acked);
        let csv = table(&samples).to_csv();
        assert_eq!(csv.lines().count(), samples.len() + 1);
        assert!(cwnd_plot(&samples).to_svg().contains("cwnd"));
        let named = vec![("c0".to_string(), samples.clone())];
        let csv = table_named(&named).to_csv();
        assert!(csv.starts_with("conn,t_s,cwnd,"), "{csv}");
        assert_eq!(csv.lines().count(), samples.len() + 1);
        let svg = cwnd_throughput_svg(&named);
        let doc = roxmltree::Document::parse(&svg).expect("the stacked SVG parses");
        let panels = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("svg"))
            .map(|n| n.attribute("y").unwrap().parse::<f64>().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(panels.len(), 2, "cwnd and throughput panels");
        assert!(panels[1] > panels[0]);
    }

    #[test]
    fn not_a_socket_is_an_error() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(tcp_info(f.as_fd()).is_err());
    }
}
