//! Polling a connection's socket for a while after the last PDU it carried, in both roles'
//! readers: on a busy connection the next PDU usually arrives within tens of microseconds,
//! and catching it awake saves the reader's thread a sleep in epoll and a wake-up, which
//! cost this kind of machine more than the polling. Each try reads the socket directly
//! (tokio's own reads only look at readiness its reactor last saw), and the reader yields
//! to the runtime's other tasks between tries, as the software RNIC's engine task does
//! (`datamover_iser::rnic_task`). The window restarts with every PDU, so an idle
//! connection stops polling one window after its last PDU and then costs no CPU. On a
//! machine with more runnable threads than cores the spin only takes CPU from threads with
//! work: a try that comes more than a window after the one before (the thread was
//! descheduled, or the runtime's other tasks were long) stops polling for [`BACK_OFF`].
//! `SO_BUSY_POLL` is asked for on the socket as well, where the kernel grants it.

use crate::frame::{complete_frame, FrameError, FrameReader};
use bytes::{BufMut, BytesMut};
use iscsi_wire::Digests;
use std::io;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

pub use datamover::tcp_defaults::DEFAULT_POLL;

/// Tries per window at most, whatever the clock says (a bound on the loop's count).
const MAX_TRIES: u32 = 1 << 20;

/// How long a reader does not poll after a spin found itself descheduled.
pub const BACK_OFF: Duration = Duration::from_millis(100);

pub use crate::frame::ReadNow;

/// Reads what `socket` has received into `buf`'s spare room (at least `room` bytes of it)
/// without waiting (the socket is non-blocking, as every tokio socket is).
pub fn recv_now(socket: &TcpStream, buf: &mut BytesMut, room: usize) -> io::Result<usize> {
    buf.reserve(room);
    let n = socket2::SockRef::from(socket).recv(buf.spare_capacity_mut())?;
    // SAFETY: recv(2) initialised the first `n` bytes of the spare room it was given (and
    // never reports more than it was given). Exercised by every poll test of this crate
    // (`tests/socket_poll.rs`) and by both roles' readers with polling on.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

/// Asks the kernel to busy-poll the socket's receive queue for up to `window` on a blocking
/// read (`SO_BUSY_POLL`). Kernels without it, and those that want privileges for it, refuse:
/// that is expected and not reported.
pub fn set_busy_poll(socket: &TcpStream, window: Duration) {
    let us = u32::try_from(window.as_micros()).unwrap_or(u32::MAX);
    if us > 0 {
        let _ = socket2::SockRef::from(socket).set_busy_poll(us);
    }
}

/// One reader's polling window: how long it polls after the last PDU it handled.
#[derive(Debug)]
pub struct SocketPoll {
    window: Duration,
    last: Instant,
    /// No polling before this (the last spin was descheduled).
    paused_until: Option<Instant>,
}

impl SocketPoll {
    /// Polls for `window` after each PDU (zero: never).
    pub fn new(window: Duration) -> SocketPoll {
        SocketPoll {
            window,
            last: Instant::now(),
            paused_until: None,
        }
    }

    /// The window this reader polls for.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Whether polling is paused now, the last spin having found itself descheduled.
    pub fn paused(&self) -> bool {
        self.paused_until.is_some_and(|t| Instant::now() < t)
    }

    /// A PDU was handled: the window starts again from now.
    pub fn busy(&mut self) {
        if !self.window.is_zero() {
            self.last = Instant::now();
        }
    }

    /// Before the reader waits for its next frame: while the window since the last PDU
    /// lasts and no whole frame is buffered, reads what has arrived without waiting,
    /// yielding to the runtime's other tasks between tries. Returns when a whole frame is
    /// buffered, or the window has passed (the reader then waits as usual); an error or
    /// the end of the stream is returned as the reader's own read would.
    pub async fn spin<R: ReadNow + tokio::io::AsyncRead + Unpin>(
        &mut self,
        r: &mut FrameReader<R>,
        digests: Digests,
        max_data: u32,
    ) -> Result<(), FrameError> {
        if self.window.is_zero() || self.paused() {
            return Ok(());
        }
        let mut tried = Instant::now();
        // The buffer is looked at again only when bytes came (with header digests, the
        // look computes the header's CRC).
        let mut grew = true;
        for _ in 0..MAX_TRIES {
            let now = Instant::now();
            if now - tried > self.window {
                self.paused_until = Some(now + BACK_OFF);
                return Ok(());
            }
            tried = now;
            if grew && complete_frame(r.buffered(), digests, max_data)?.is_some() {
                return Ok(());
            }
            grew = false;
            if now - self.last >= self.window {
                return Ok(());
            }
            match r.read_now() {
                Ok(0) => return Err(FrameError::Eof),
                // Bytes came: the next PDU is under way, so its rest is polled for anew.
                Ok(_) => {
                    self.last = Instant::now();
                    grew = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The runtime's other tasks first, then the machine's other threads: on
                    // an idle core sched_yield returns at once, on a busy one the spin
                    // takes no CPU from the threads that have work.
                    std::thread::yield_now();
                    tokio::task::yield_now().await
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::write_pdu;
    use crate::trace::Traced;
    use iscsi_wire::{Bhs, NopOut, Pdu};
    use pcap_trace::Side;
    use tokio::net::TcpListener;

    type Reader = FrameReader<Traced<tokio::net::tcp::OwnedReadHalf>>;

    /// A connected pair: the reader of one end, the other end whole.
    async fn pair() -> (Reader, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let (r, _w) = Traced::new(s, None, Side::Accepted).into_split();
        (FrameReader::new(r, 64 * 1024), peer)
    }

    fn nop(data: &'static [u8]) -> Pdu {
        Pdu {
            bhs: Bhs::NopOut(NopOut {
                itt: 7,
                ttt: 0xffff_ffff,
                ..Default::default()
            }),
            ahs: Default::default(),
            data: bytes::Bytes::from_static(data),
        }
    }

    /// A frame that arrives while the reader polls is taken by the spin's own reads, whole
    /// and unchanged; the spin returns as soon as it is buffered.
    #[tokio::test]
    async fn a_frame_arriving_in_the_window_is_read_by_the_spin() {
        let (mut r, mut peer) = pair().await;
        let mut poll = SocketPoll::new(Duration::from_secs(5));
        poll.busy();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            write_pdu(&mut peer, &nop(b"polled bytes"), Digests::default())
                .await
                .unwrap();
            peer
        });
        let started = Instant::now();
        poll.spin(&mut r, Digests::default(), 8192).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "returned on the frame"
        );
        assert!(complete_frame(r.buffered(), Digests::default(), 8192)
            .unwrap()
            .is_some());
        let got = r.read_pdu(Digests::default(), 8192).await.unwrap();
        assert_eq!(&got.pdu.data[..], b"polled bytes");
        drop(sender.await.unwrap());
    }

    /// Without traffic the spin ends once the window has passed, and a zero window never
    /// spins; the end of the stream is reported as the reader's own read reports it.
    #[tokio::test]
    async fn the_spin_ends_with_the_window_and_reports_the_end_of_the_stream() {
        let (mut r, peer) = pair().await;
        let window = Duration::from_millis(20);
        let mut poll = SocketPoll::new(window);
        poll.busy();
        let started = Instant::now();
        poll.spin(&mut r, Digests::default(), 8192).await.unwrap();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "bounded: {took:?}");
        assert!(
            took >= window || poll.paused(),
            "polled the window: {took:?}"
        );
        let mut off = SocketPoll::new(Duration::ZERO);
        let started = Instant::now();
        off.spin(&mut r, Digests::default(), 8192).await.unwrap();
        // Returns without waiting for bytes that never come (a shared machine may deschedule
        // the test for milliseconds, hence the loose bound).
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(peer);
        let mut poll = SocketPoll::new(Duration::from_secs(5));
        poll.busy();
        let end = poll.spin(&mut r, Digests::default(), 8192).await;
        assert!(matches!(end, Err(FrameError::Eof)), "{end:?}");
    }

    /// A spin that finds itself descheduled for longer than its window pauses polling.
    #[tokio::test]
    async fn a_descheduled_spin_pauses_polling() {
        let (mut r, _peer) = pair().await;
        let mut poll = SocketPoll::new(Duration::from_micros(200));
        poll.busy();
        // Another task holding the thread longer than the window stands for the descheduling.
        let hog = tokio::spawn(async { std::thread::sleep(Duration::from_millis(2)) });
        poll.spin(&mut r, Digests::default(), 8192).await.unwrap();
        hog.await.unwrap();
        assert!(poll.paused(), "paused after a long gap");
        // Paused: the next spin returns at once, not after its window.
        poll.window = Duration::from_secs(5);
        poll.busy();
        let started = Instant::now();
        poll.spin(&mut r, Digests::default(), 8192).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
