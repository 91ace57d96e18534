//! The TCP side of a connection: connecting, framing PDUs with digests, the login exchange
//! driven by `iscsi_login::InitiatorLogin`, the SendTargets exchange of a discovery session,
//! the writer task that sends a connection's PDUs in vectored batches, and [`Traced`], the
//! socket wrapper that copies every byte read or written into a pcapng trace.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use iscsi_login::{
    ConnectionParams, InitiatorLogin, InitiatorLoginConfig, InitiatorStep, SessionParams,
};
use iscsi_wire::{Bhs, Digests, FrameLayout, Pdu, BHS_LEN};
use pcap_trace::{PduTrace, Side, TraceConnection};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::core::OutPdu;
use crate::Error;

pub(crate) const READ_CHUNK: usize = 512 * 1024;
/// Login and text PDUs larger than this are refused.
pub(crate) const LOGIN_MAX_DATA: u32 = 64 * 1024;

/// A socket (or one half of it) whose traffic is also recorded in a pcapng trace: each
/// successful read records the bytes it filled and each write the bytes the kernel took, in
/// the order they crossed the socket. Without a trace it only forwards.
pub(crate) struct Traced<S> {
    inner: S,
    trace: Option<Arc<TraceConnection>>,
    /// Vectored writes are gathered here so one write makes one traced segment.
    scratch: Vec<u8>,
}

/// A connected socket, traced or not.
pub(crate) type Stream = Traced<TcpStream>;

impl Traced<TcpStream> {
    /// The socket itself (for its descriptor: TCP_INFO sampling).
    pub(crate) fn socket(&self) -> &TcpStream {
        &self.inner
    }

    /// Wraps a connected socket; with `trace`, writes its handshake into the trace.
    pub(crate) fn new(inner: TcpStream, trace: Option<&PduTrace>) -> Traced<TcpStream> {
        let trace = trace.and_then(|t| {
            let local = inner.local_addr().ok()?;
            let peer = inner.peer_addr().ok()?;
            Some(Arc::new(t.connection(local, peer, Side::Connected)))
        });
        Traced {
            inner,
            trace,
            scratch: Vec::new(),
        }
    }

    /// The two halves, sharing the trace connection (closed in the trace when both drop).
    pub(crate) fn into_split(self) -> (Traced<OwnedReadHalf>, Traced<OwnedWriteHalf>) {
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
        let r = Pin::new(&mut me.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(t)) = (&r, &me.trace) {
            if *n > 0 {
                t.sent(&buf[..*n]);
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
        let r = Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(t)) = (&r, &me.trace) {
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
                t.sent(&me.scratch);
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

/// Opens a TCP connection to `addr` (`host:port`), bounded by `timeout`, traced into
/// `trace` when given.
pub(crate) async fn connect(
    addr: &str,
    timeout: Duration,
    trace: Option<&PduTrace>,
) -> Result<Stream, Error> {
    let s = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| Error::Connect {
            addr: addr.to_string(),
            why: format!("no answer within {} s", timeout.as_secs()),
        })?
        .map_err(|e| Error::Connect {
            addr: addr.to_string(),
            why: e.to_string(),
        })?;
    let _ = s.set_nodelay(true);
    Ok(Traced::new(s, trace))
}

/// A received PDU.
pub(crate) struct RawPdu {
    pub bhs: Bhs,
    pub data: Bytes,
}

/// Reads until `need` bytes are buffered.
pub(crate) async fn fill<R: AsyncReadExt + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    need: usize,
) -> io::Result<()> {
    while buf.len() < need {
        buf.reserve(READ_CHUNK.max(need - buf.len()));
        if r.read_buf(buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the target closed the connection",
            ));
        }
    }
    Ok(())
}

/// Reads one whole PDU, checking digests.
pub(crate) async fn read_pdu<R: AsyncReadExt + Unpin>(
    r: &mut R,
    rbuf: &mut BytesMut,
    digests: Digests,
    max_data: u32,
) -> Result<RawPdu, Error> {
    fill(r, rbuf, BHS_LEN).await.map_err(Error::io)?;
    let head: [u8; BHS_LEN] = rbuf[..BHS_LEN].try_into().expect("48 bytes");
    let layout = FrameLayout::of(&head, digests, max_data).map_err(Error::wire)?;
    fill(r, rbuf, layout.total_len()).await.map_err(Error::io)?;
    let frame = rbuf.split_to(layout.total_len()).freeze();
    let (bhs, data) = parse_frame(&frame, &layout)?;
    Ok(RawPdu { bhs, data })
}

/// Checks the digests of a complete frame and returns its header and data segment.
pub(crate) fn parse_frame(frame: &Bytes, layout: &FrameLayout) -> Result<(Bhs, Bytes), Error> {
    let head: &[u8; BHS_LEN] = frame[..BHS_LEN].try_into().expect("48 bytes");
    let header_end = BHS_LEN + layout.header_rest_len();
    if layout.header_digest_len > 0 {
        let got = u32::from_le_bytes(frame[header_end - 4..header_end].try_into().expect("4"));
        let want = digest::crc32c(&frame[..header_end - 4]);
        if got != want {
            return Err(Error::Protocol(format!(
                "header digest error (got {got:08x}, computed {want:08x})"
            )));
        }
    }
    let data_end = header_end + layout.data_len as usize;
    if layout.data_digest_len > 0 {
        let padded = header_end + layout.data_len as usize + layout.pad_len;
        let got = u32::from_le_bytes(frame[padded..padded + 4].try_into().expect("4"));
        let want = digest::crc32c(&frame[header_end..padded]);
        if got != want {
            return Err(Error::Protocol(format!(
                "data digest error (got {got:08x}, computed {want:08x})"
            )));
        }
    }
    let bhs = Bhs::decode(head).map_err(Error::wire)?.bhs;
    Ok((bhs, frame.slice(header_end..data_end)))
}

/// Encodes one PDU into bytes (login and discovery paths).
pub(crate) fn encode(pdu: &Pdu, digests: Digests) -> Vec<u8> {
    let h: Option<iscsi_wire::CrcFn> = digests.header.then_some(&digest::crc32c as _);
    let d: Option<iscsi_wire::CrcFn> = digests.data.then_some(&digest::crc32c as _);
    iscsi_wire::encode_pdu(pdu, h, d)
}

/// What a completed login yields.
#[derive(Debug, Clone)]
pub(crate) struct LoginDone {
    pub tsih: u16,
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// StatSN expected next on this connection.
    pub exp_stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

fn to_wire_stage(s: iscsi_login::Stage) -> iscsi_wire::Stage {
    match s {
        iscsi_login::Stage::Security => iscsi_wire::Stage::Security,
        iscsi_login::Stage::Operational => iscsi_wire::Stage::Operational,
        iscsi_login::Stage::FullFeature => iscsi_wire::Stage::FullFeature,
    }
}

fn from_wire_stage(s: iscsi_wire::Stage) -> iscsi_login::Stage {
    match s {
        iscsi_wire::Stage::Security => iscsi_login::Stage::Security,
        iscsi_wire::Stage::Operational => iscsi_login::Stage::Operational,
        iscsi_wire::Stage::FullFeature => iscsi_login::Stage::FullFeature,
    }
}

/// Runs the login phase on a fresh connection.
pub(crate) async fn login(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    config: InitiatorLoginConfig,
    timeout: Duration,
) -> Result<LoginDone, Error> {
    tokio::time::timeout(timeout, login_exchange(stream, rbuf, config))
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "login did not finish within {} s",
                timeout.as_secs()
            ))
        })?
}

async fn login_exchange(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    config: InitiatorLoginConfig,
) -> Result<LoginDone, Error> {
    let mut sm = InitiatorLogin::new(config);
    let mut req = sm.first_request();
    let mut exp_stat_sn = 0u32;
    let mut first = true;
    // InitiatorLogin bounds the exchanges itself; this bound only guards the loop.
    for _ in 0..100 {
        let bhs = Bhs::LoginRequest(iscsi_wire::LoginRequest {
            transit: req.transit,
            cont: req.cont,
            csg: to_wire_stage(req.csg),
            nsg: to_wire_stage(req.nsg),
            version_max: req.version_max,
            version_min: req.version_min,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            cid: req.cid,
            cmd_sn: req.cmd_sn,
            exp_stat_sn: if first { req.exp_stat_sn } else { exp_stat_sn },
        });
        first = false;
        let pdu = Pdu::new(bhs, Bytes::from(std::mem::take(&mut req.data)));
        stream
            .write_all(&encode(&pdu, Digests::default()))
            .await
            .map_err(Error::io)?;
        let resp = read_pdu(stream, rbuf, Digests::default(), LOGIN_MAX_DATA).await?;
        let Bhs::LoginResponse(r) = resp.bhs else {
            return Err(Error::Protocol(format!(
                "expected a Login Response, got {}",
                resp.bhs.opcode().name()
            )));
        };
        exp_stat_sn = r.stat_sn.wrapping_add(1);
        let lr = iscsi_login::LoginResponse {
            transit: r.transit,
            cont: r.cont,
            csg: from_wire_stage(r.csg),
            nsg: from_wire_stage(r.nsg),
            version_max: r.version_max,
            version_active: r.version_active,
            isid: r.isid,
            tsih: r.tsih,
            itt: r.itt,
            status_class: r.status_class,
            status_detail: r.status_detail,
            data: resp.data.to_vec(),
        };
        let mut rng = |b: &mut [u8]| rand::RngCore::fill_bytes(&mut rand::thread_rng(), b);
        match sm.on_response(&lr, &mut rng).map_err(Error::Login)? {
            InitiatorStep::Send(next) => req = next,
            InitiatorStep::Complete {
                tsih,
                session,
                connection,
                ..
            } => {
                return Ok(LoginDone {
                    tsih,
                    session,
                    connection,
                    exp_stat_sn,
                    exp_cmd_sn: r.exp_cmd_sn,
                    max_cmd_sn: r.max_cmd_sn,
                })
            }
        }
    }
    Err(Error::Protocol("login did not converge".into()))
}

/// One Text exchange (with continuation) on a logged-in discovery connection.
pub(crate) async fn text_exchange(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    digests: Digests,
    done: &LoginDone,
    cmd_sn: u32,
    request: &[u8],
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    let mut ttt = iscsi_wire::RESERVED_TAG;
    let mut exp_stat_sn = done.exp_stat_sn;
    let mut data = Bytes::copy_from_slice(request);
    // Each round brings at least one PDU of text; 1024 rounds is far beyond any target.
    for _ in 0..1024 {
        let bhs = Bhs::TextRequest(iscsi_wire::TextRequest {
            immediate: true,
            final_: true,
            cont: false,
            lun: 0,
            itt: 1,
            ttt,
            cmd_sn,
            exp_stat_sn,
        });
        stream
            .write_all(&encode(&Pdu::new(bhs, std::mem::take(&mut data)), digests))
            .await
            .map_err(Error::io)?;
        let resp = loop_skip_nop(stream, rbuf, digests, &mut exp_stat_sn).await?;
        let Bhs::TextResponse(t) = resp.bhs else {
            return Err(Error::Protocol(format!(
                "expected a Text Response, got {}",
                resp.bhs.opcode().name()
            )));
        };
        exp_stat_sn = t.stat_sn.wrapping_add(1);
        out.extend_from_slice(&resp.data);
        if out.len() > 4 << 20 {
            return Err(Error::Protocol("SendTargets answer over 4 MiB".into()));
        }
        if t.final_ && !t.cont {
            return Ok(out);
        }
        ttt = t.ttt;
    }
    Err(Error::Protocol("text exchange did not end".into()))
}

async fn loop_skip_nop(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    digests: Digests,
    exp_stat_sn: &mut u32,
) -> Result<RawPdu, Error> {
    for _ in 0..64 {
        let p = read_pdu(stream, rbuf, digests, LOGIN_MAX_DATA).await?;
        match &p.bhs {
            Bhs::NopIn(n) if n.ttt != iscsi_wire::RESERVED_TAG => {
                let reply = Bhs::NopOut(iscsi_wire::NopOut {
                    immediate: true,
                    lun: n.lun,
                    itt: iscsi_wire::RESERVED_TAG,
                    ttt: n.ttt,
                    cmd_sn: 0,
                    exp_stat_sn: *exp_stat_sn,
                });
                stream
                    .write_all(&encode(&Pdu::new(reply, Bytes::new()), digests))
                    .await
                    .map_err(Error::io)?;
            }
            Bhs::AsyncMessage(_) | Bhs::NopIn(_) => {}
            _ => return Ok(p),
        }
    }
    Err(Error::Protocol("the target sent only NOP-Ins".into()))
}

/// Sends a Logout (close session) and waits for the response.
pub(crate) async fn logout_plain(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    digests: Digests,
    cmd_sn: u32,
    exp_stat_sn: u32,
) -> Result<(), Error> {
    let bhs = Bhs::LogoutRequest(iscsi_wire::LogoutRequest {
        immediate: true,
        reason: 0,
        itt: 2,
        cid: 0,
        cmd_sn,
        exp_stat_sn,
    });
    stream
        .write_all(&encode(&Pdu::new(bhs, Bytes::new()), digests))
        .await
        .map_err(Error::io)?;
    let mut e = exp_stat_sn;
    let p = loop_skip_nop(stream, rbuf, digests, &mut e).await?;
    match p.bhs {
        Bhs::LogoutResponse(_) => Ok(()),
        other => Err(Error::Protocol(format!(
            "expected a Logout Response, got {}",
            other.opcode().name()
        ))),
    }
}

/// What the writer task is asked to do.
pub(crate) enum WriterMsg {
    Pdu(OutPdu),
    Close,
}

enum Part {
    Head(std::ops::Range<usize>),
    Data(Bytes),
    Pad(usize),
    Digest([u8; 4]),
}

static ZEROS: [u8; 4] = [0; 4];
const BATCH: usize = 128;
const MAX_IOVECS: usize = 512;

/// Sends queued PDUs: each wake-up takes everything queued (up to a batch), encodes the
/// headers into one buffer, and writes headers and payload slices in one vectored write.
pub(crate) async fn writer(
    mut w: Traced<OwnedWriteHalf>,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    digests: Digests,
) -> io::Result<()> {
    let mut batch = Vec::with_capacity(BATCH);
    let mut heads: Vec<u8> = Vec::with_capacity(BATCH * 56);
    let mut parts: Vec<Part> = Vec::with_capacity(BATCH * 4);
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            break;
        }
        heads.clear();
        parts.clear();
        let mut close = false;
        for m in batch.drain(..) {
            let p = match m {
                WriterMsg::Pdu(p) => p,
                WriterMsg::Close => {
                    close = true;
                    break;
                }
            };
            let start = heads.len();
            heads.extend_from_slice(&p.bhs.encode(p.ahs.len(), p.data.len() as u32));
            heads.extend_from_slice(&p.ahs);
            if digests.header {
                let d = digest::crc32c(&heads[start..]);
                heads.extend_from_slice(&d.to_le_bytes());
            }
            parts.push(Part::Head(start..heads.len()));
            if !p.data.is_empty() {
                let pad = iscsi_wire::padded_len(p.data.len() as u32) - p.data.len();
                let dd = digests.data.then(|| {
                    let c = digest::crc32c(&p.data);
                    digest::crc32c_append(c, &ZEROS[..pad]).to_le_bytes()
                });
                parts.push(Part::Data(p.data));
                if pad > 0 {
                    parts.push(Part::Pad(pad));
                }
                if let Some(d) = dd {
                    parts.push(Part::Digest(d));
                }
            }
        }
        write_parts(&mut w, &heads, &parts).await?;
        if close {
            break;
        }
    }
    let _ = w.shutdown().await;
    Ok(())
}

async fn write_parts(
    w: &mut Traced<OwnedWriteHalf>,
    heads: &[u8],
    parts: &[Part],
) -> io::Result<()> {
    for chunk in parts.chunks(MAX_IOVECS) {
        let mut slices: Vec<IoSlice<'_>> = chunk
            .iter()
            .map(|p| match p {
                Part::Head(r) => IoSlice::new(&heads[r.clone()]),
                Part::Data(b) => IoSlice::new(b),
                Part::Pad(n) => IoSlice::new(&ZEROS[..*n]),
                Part::Digest(d) => IoSlice::new(d),
            })
            .collect();
        let mut rest: &mut [IoSlice<'_>] = &mut slices;
        while !rest.is_empty() {
            let n = w.write_vectored(rest).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
    }
    Ok(())
}
