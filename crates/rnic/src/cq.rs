//! Completion queues and the completion channel (an eventfd).

use rdma::{CompletionChannel, CompletionQueue, Result, Wc, WcStatus};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DISARMED: u8 = 0;
const ARMED_SOLICITED: u8 = 1;
const ARMED_ANY: u8 = 2;

pub struct ChannelShared {
    fd: OwnedFd,
}

impl ChannelShared {
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}

/// A completion channel: an eventfd that becomes readable when an armed CQ bound to it gets a
/// completion. Register [`CompletionChannel::fd`] with epoll or tokio's `AsyncFd`.
#[derive(Clone)]
pub struct Channel {
    pub(crate) shared: Arc<ChannelShared>,
}

impl Channel {
    pub fn new() -> Result<Channel> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Channel {
            shared: Arc::new(ChannelShared { fd }),
        })
    }
}

impl CompletionChannel for Channel {
    fn fd(&self) -> RawFd {
        self.shared.fd.as_raw_fd()
    }

    fn get_events(&self, timeout: Option<Duration>) -> Result<u64> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout
            .map(|d| d.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(-1);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(e.into())
            };
        }
        if n == 0 {
            return Ok(0);
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our nonblocking eventfd.
        let r = unsafe { libc::read(self.fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        Ok(if r == 8 { v } else { 0 })
    }
}

/// Moves a QP to the error state when its completion finds the CQ overrun: the RNIC's engine.
/// A trait here so that the CQ, which QPs hold, does not depend on the engine.
pub(crate) trait QpFailer: Send + Sync {
    fn fail_qp(&self, qp_num: u32, reason: String);
}

pub struct CqShared {
    q: Mutex<VecDeque<Wc>>,
    armed: AtomicU8,
    channel: Option<Arc<ChannelShared>>,
    depth: usize,
    /// Set once the CQ overflowed: it stays in error.
    overrun: AtomicBool,
    /// Told to move a QP to the error state when its completion finds the CQ overrun.
    engine: Option<Arc<dyn QpFailer>>,
}

impl CqShared {
    /// Adds a completion and fires the channel if the CQ is armed for it. A completion that
    /// finds the CQ full is never dropped: the CQ goes into error (a [`WcStatus::CqOverrun`]
    /// completion follows it, once per QP, in order), and the QP it belongs to is moved to the
    /// error state, so its owner learns of it from its next poll.
    pub(crate) fn push(&self, wc: Wc) {
        let mut overran = false;
        {
            let mut q = self.q.lock().unwrap();
            q.push_back(wc);
            if q.len() > self.depth || self.overrun.load(Ordering::Relaxed) {
                let first = !self.overrun.swap(true, Ordering::Relaxed);
                // One CqOverrun per QP that completes into the errored CQ: the first, and each
                // later QP whose successful completion arrives.
                if first || wc.status == WcStatus::Success {
                    overran = true;
                    q.push_back(Wc {
                        wr_id: 0,
                        status: WcStatus::CqOverrun,
                        byte_len: 0,
                        invalidated_rkey: None,
                        solicited: false,
                        ..wc
                    });
                }
            }
        }
        if overran {
            if let Some(engine) = &self.engine {
                engine.fail_qp(
                    wc.qp_num,
                    format!(
                        "completion queue overrun: more than {} completions waiting to be polled",
                        self.depth
                    ),
                );
            }
        }
        let armed = self.armed.load(Ordering::Acquire);
        let fire = armed == ARMED_ANY
            || (armed == ARMED_SOLICITED
                && (wc.solicited || wc.status != WcStatus::Success || overran));
        if fire && self.armed.swap(DISARMED, Ordering::AcqRel) != DISARMED {
            if let Some(ch) = &self.channel {
                ch.signal();
            }
        }
    }
}

/// A completion queue of the software RNIC.
#[derive(Clone)]
pub struct Cq {
    pub(crate) shared: Arc<CqShared>,
}

impl Cq {
    /// A CQ holding `depth` completions. One created here (not by an [`crate::Rnic`]) goes
    /// into error when it overflows but cannot stop the QPs completing into it.
    pub fn new(depth: u32, channel: Option<&Channel>) -> Cq {
        Cq::with_engine(depth, channel, None)
    }

    pub(crate) fn with_engine(
        depth: u32,
        channel: Option<&Channel>,
        engine: Option<Arc<dyn QpFailer>>,
    ) -> Cq {
        Cq {
            shared: Arc::new(CqShared {
                q: Mutex::new(VecDeque::new()),
                armed: AtomicU8::new(DISARMED),
                channel: channel.map(|c| c.shared.clone()),
                depth: depth.max(1) as usize,
                overrun: AtomicBool::new(false),
                engine,
            }),
        }
    }

    /// Whether the CQ overflowed (it stays in error; see [`WcStatus::CqOverrun`]).
    pub fn overrun(&self) -> bool {
        self.shared.overrun.load(Ordering::Relaxed)
    }
}

impl CompletionQueue for Cq {
    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut q = self.shared.q.lock().unwrap();
        let n = out.len().min(q.len());
        for slot in out.iter_mut().take(n) {
            *slot = q.pop_front().unwrap();
        }
        n
    }

    fn req_notify(&self, solicited_only: bool) {
        self.shared.armed.store(
            if solicited_only {
                ARMED_SOLICITED
            } else {
                ARMED_ANY
            },
            Ordering::Release,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::WcOpcode;

    fn wc(id: u64) -> Wc {
        Wc {
            wr_id: id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            invalidated_rkey: None,
            solicited: false,
            qp_num: 1,
        }
    }

    #[test]
    fn rearm_then_poll_never_loses_a_wakeup() {
        let ch = Channel::new().unwrap();
        let cq = Cq::new(16, Some(&ch));
        // Not armed: a completion raises no event.
        cq.shared.push(wc(1));
        assert_eq!(ch.get_events(Some(Duration::from_millis(10))).unwrap(), 0);
        // The consumer's loop: arm, then poll. The completion that arrived before the arm is found
        // by the poll, so sleeping is not needed for it.
        cq.req_notify(false);
        let mut out = [wc(0); 4];
        assert_eq!(cq.poll(&mut out), 1);
        // A completion after the arm fires exactly one event, and the arm is consumed.
        cq.shared.push(wc(2));
        cq.shared.push(wc(3));
        assert_eq!(ch.get_events(Some(Duration::from_millis(100))).unwrap(), 1);
        assert_eq!(ch.get_events(Some(Duration::from_millis(10))).unwrap(), 0);
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (2, 3));
    }

    #[test]
    fn an_overflowing_cq_keeps_every_completion_and_says_so() {
        let ch = Channel::new().unwrap();
        let cq = Cq::new(2, Some(&ch));
        cq.req_notify(true);
        for id in 1..=4 {
            cq.shared.push(wc(id));
        }
        assert!(cq.overrun());
        // The overrun fires a solicited-only arm: the owner is woken to find the error.
        assert_eq!(ch.get_events(Some(Duration::from_millis(100))).unwrap(), 1);
        let mut out = [wc(0); 8];
        let n = cq.poll(&mut out);
        let got: Vec<(u64, WcStatus)> = out[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        // Nothing dropped; the error stands right after the completion that did not fit, and
        // after each successful one that arrives at the errored CQ (its QP is failed then).
        assert_eq!(
            got,
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success),
                (0, WcStatus::CqOverrun),
                (4, WcStatus::Success),
                (0, WcStatus::CqOverrun),
            ]
        );
        // A flush after the overrun is kept, without another overrun entry.
        cq.shared.push(Wc {
            status: WcStatus::Flushed,
            ..wc(5)
        });
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!((out[0].wr_id, out[0].status), (5, WcStatus::Flushed));
        assert!(cq.overrun(), "the CQ stays in error");
    }

    #[test]
    fn solicited_only_arm_ignores_unsolicited() {
        let ch = Channel::new().unwrap();
        let cq = Cq::new(16, Some(&ch));
        cq.req_notify(true);
        cq.shared.push(wc(1));
        assert_eq!(ch.get_events(Some(Duration::from_millis(10))).unwrap(), 0);
        cq.shared.push(Wc {
            solicited: true,
            ..wc(2)
        });
        assert_eq!(ch.get_events(Some(Duration::from_millis(100))).unwrap(), 1);
    }
}
