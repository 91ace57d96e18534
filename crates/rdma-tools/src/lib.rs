//! Tools built on the RDMA API, outside the RNIC they exercise: an rping-compatible ping (on
//! any `rdma` provider), a bandwidth/latency test between two software RNICs, and what a
//! listener tried with thousands of clients needs of the process (descriptors).
pub mod bw;
pub mod rping;

use rdma::{CompletionQueue, Wc};
use std::time::{Duration, Instant};

/// Polls `cq` until a completion arrives or `timeout` passes (short sleeps between polls).
pub(crate) fn next_wc<C: CompletionQueue>(cq: &C, timeout: Duration) -> Option<Wc> {
    let deadline = Instant::now() + timeout;
    let mut out = [Wc::EMPTY];
    let mut spins = 0u32;
    loop {
        if cq.poll(&mut out) == 1 {
            return Some(out[0]);
        }
        if Instant::now() >= deadline {
            return None;
        }
        spins += 1;
        if spins > 200 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit (a process may start
/// with 1024, too few for thousands of connections); returns the limit now in force.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, initialised rlimit for this process.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    lim.rlim_cur
}
