//! Tools built on the RDMA API: an rping-compatible ping and a bandwidth/latency test.
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
