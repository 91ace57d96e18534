//! The one tracing hook of iSCSI/TCP: a socket wrapper that copies every byte read or
//! written into a pcapng trace ([`pcap_trace::PduTrace`]), in the order the bytes crossed
//! the socket, so `ironsan analyze` and tshark decode the file like a capture. Both roles
//! wrap their sockets in it; without a trace it only forwards.

use pcap_trace::{PduTrace, Side, TraceConnection};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A socket (or one half of it) whose traffic is also recorded in a pcapng trace: each
/// successful read records the bytes it filled and each write the bytes the kernel took, in
/// the order they crossed the socket. Without a trace it only forwards.
pub struct Traced<S> {
    inner: S,
    trace: Option<Arc<TraceConnection>>,
    /// Vectored writes are gathered here so one write makes one traced segment.
    scratch: Vec<u8>,
}

impl Traced<TcpStream> {
    /// The socket itself (for its descriptor: TCP_INFO sampling).
    pub fn socket(&self) -> &TcpStream {
        &self.inner
    }

    /// Wraps a connected socket; with `trace`, writes its handshake into the trace (`side`:
    /// whether this end accepted or connected).
    pub fn new(inner: TcpStream, trace: Option<&PduTrace>, side: Side) -> Traced<TcpStream> {
        let trace = trace.and_then(|t| {
            let local = inner.local_addr().ok()?;
            let peer = inner.peer_addr().ok()?;
            Some(Arc::new(t.connection(local, peer, side)))
        });
        Traced {
            inner,
            trace,
            scratch: Vec::new(),
        }
    }

    /// The two halves, sharing the trace connection (closed in the trace when both drop).
    pub fn into_split(self) -> (Traced<OwnedReadHalf>, Traced<OwnedWriteHalf>) {
        let (r, w) = self.inner.into_split();
        (
            Traced {
                inner: r,
                trace: self.trace.clone(),
                scratch: Vec::new(),
            },
            Traced {
                inner: w,
                trace: self.trace,
                scratch: Vec::new(),
            },
        )
    }
}

impl crate::poll::ReadNow for Traced<OwnedReadHalf> {
    fn read_now(&mut self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
        let before = buf.len();
        let n = crate::poll::recv_now(self.inner.as_ref(), buf, 0)?;
        if let Some(t) = &self.trace {
            if n > 0 {
                t.received(&buf[before..]);
            }
        }
        Ok(n)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Traced<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(t)) = (&r, &me.trace) {
            let got = &buf.filled()[before..];
            if !got.is_empty() {
                t.received(got);
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Traced<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let sending = me.trace.as_ref().map(|t| t.sending());
        let r = Pin::new(&mut me.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(s)) = (&r, sending) {
            if *n > 0 {
                s.sent(&buf[..*n]);
            }
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let sending = me.trace.as_ref().map(|t| t.sending());
        let r = Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(s)) = (&r, sending) {
            let mut left = *n;
            me.scratch.clear();
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                me.scratch.extend_from_slice(&b[..take]);
                left -= take;
            }
            if !me.scratch.is_empty() {
                s.sent(&me.scratch);
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
