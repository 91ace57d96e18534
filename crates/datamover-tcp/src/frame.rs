//! The one iSCSI/TCP PDU framer, used by both roles.
//!
//! Receive side: [`FrameReader`] reads a connection's bytes in large chunks and yields
//! whole frames with the header digest checked ([`complete_frame`] does the same on bytes
//! already buffered, so a reader can handle every buffered PDU under one lock); a
//! [`Frame`] knows where its parts lie and checks the data digest against a CRC the caller
//! computed (usually in the same pass as its copy of the payload).
//! Send side: [`PduBatch`] encodes a batch of PDUs into one header buffer plus payload
//! slices (header digest, padding, data digest — from a precomputed CRC when the producer
//! has one) and writes it with vectored writes, so payloads are never copied in user space.

use bytes::{Bytes, BytesMut};
use datamover::{InPdu, LoginRecvError};
use iscsi_wire::{Bhs, Digests, FrameLayout, Pdu, WireError, BHS_LEN};
use std::io::{self, IoSlice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Iovecs per vectored write (Linux's IOV_MAX is 1024).
const MAX_IOVECS: usize = 512;

/// The rest of a frame read by itself rather than with what follows it (see
/// [`FrameReader::next_frame`]): below this, copying a partly read frame costs less than
/// the extra read.
const LARGE_TAIL: usize = 16 * 1024;
static ZEROS: [u8; 4] = [0; 4];

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection.
    Eof,
    Io(io::Error),
    /// The header announces a frame we refuse (data segment over the limit). `head` is the
    /// BHS as received, for a Reject.
    Layout {
        head: [u8; BHS_LEN],
        err: WireError,
    },
    HeaderDigest {
        got: u32,
        computed: u32,
        /// The whole frame's length as its (untrusted) header says: what a receiver at
        /// ErrorRecoveryLevel ≥ 1 skips to discard the PDU.
        claimed_len: usize,
    },
    DataDigest(DataDigestError),
    /// The header does not decode (unknown opcode, bad field).
    Decode(WireError),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Eof => f.write_str("peer closed the connection"),
            FrameError::Io(e) => write!(f, "read error: {e}"),
            FrameError::Layout { err, .. } => write!(f, "protocol error: {err}"),
            FrameError::HeaderDigest { got, computed, .. } => {
                write!(
                    f,
                    "header digest error (got {got:08x}, computed {computed:08x})"
                )
            }
            FrameError::DataDigest(e) => e.fmt(f),
            FrameError::Decode(e) => write!(f, "protocol error: {e}"),
        }
    }
}

/// A data digest that does not match the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDigestError {
    pub got: u32,
    pub computed: u32,
}

impl std::fmt::Display for DataDigestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "data digest error (got {:08x}, computed {:08x})",
            self.got, self.computed
        )
    }
}

/// Where the parts of one complete, header-checked frame lie in the receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    /// The 48 BHS bytes as received (a Reject echoes them).
    pub head: [u8; BHS_LEN],
    pub layout: FrameLayout,
}

impl Frame {
    /// Bytes of the whole frame.
    pub fn total_len(&self) -> usize {
        self.layout.total_len()
    }

    /// The AHS within the frame.
    pub fn ahs_range(&self) -> std::ops::Range<usize> {
        BHS_LEN..BHS_LEN + self.layout.ahs_len
    }

    /// The data segment (without padding) within the frame.
    pub fn data_range(&self) -> std::ops::Range<usize> {
        let start = BHS_LEN + self.layout.header_rest_len();
        start..start + self.layout.data_len as usize
    }

    /// Whether a data digest follows the payload.
    pub fn has_data_digest(&self) -> bool {
        self.layout.data_digest_len > 0
    }

    /// The data digest as received and the padding it also covers (`None` without one).
    pub fn data_digest_parts<'a>(&self, frame: &'a [u8]) -> Option<(u32, &'a [u8])> {
        if !self.has_data_digest() {
            return None;
        }
        let data_end = self.data_range().end;
        let padded = data_end + self.layout.pad_len;
        let got = u32::from_le_bytes(frame[padded..padded + 4].try_into().expect("4 bytes"));
        Some((got, &frame[data_end..padded]))
    }

    /// Checks the data digest given the CRC32C of the payload (`crc_of_data`, computed by
    /// the caller, often fused with its copy); the padding is folded in here. Ok when the
    /// frame carries no data digest.
    pub fn check_data_digest(&self, frame: &[u8], crc_of_data: u32) -> Result<(), DataDigestError> {
        let Some((got, pad)) = self.data_digest_parts(frame) else {
            return Ok(());
        };
        let computed = digest::crc32c_append(crc_of_data, pad);
        if got != computed {
            return Err(DataDigestError { got, computed });
        }
        Ok(())
    }

    /// Checks the data digest, computing the payload's CRC32C here.
    pub fn verify_data_digest(&self, frame: &[u8]) -> Result<(), DataDigestError> {
        if !self.has_data_digest() {
            return Ok(());
        }
        self.check_data_digest(frame, digest::crc32c(&frame[self.data_range()]))
    }

    /// The decoded PDU of a frame whose digests are checked (AHS and data shared with it).
    pub fn pdu(&self, bhs: Bhs, frame: &Bytes) -> Pdu {
        Pdu {
            bhs,
            ahs: frame.slice(self.ahs_range()),
            data: frame.slice(self.data_range()),
        }
    }
}

/// The frame at the front of `buf` when it is complete (header digest checked), `None`
/// while more bytes are needed.
pub fn complete_frame(
    buf: &[u8],
    digests: Digests,
    max_data: u32,
) -> Result<Option<Frame>, FrameError> {
    let Some(frame) = frame_header(buf, digests, max_data)? else {
        return Ok(None);
    };
    Ok((buf.len() >= frame.total_len()).then_some(frame))
}

/// The layout of the frame at the front of `buf` once its header (BHS, AHS, header digest)
/// is buffered, with the header digest checked.
fn frame_header(buf: &[u8], digests: Digests, max_data: u32) -> Result<Option<Frame>, FrameError> {
    if buf.len() < BHS_LEN {
        return Ok(None);
    }
    let head: [u8; BHS_LEN] = buf[..BHS_LEN].try_into().expect("48 bytes");
    let layout = FrameLayout::of(&head, digests, max_data)
        .map_err(|err| FrameError::Layout { head, err })?;
    let header_end = BHS_LEN + layout.header_rest_len();
    if buf.len() < header_end {
        return Ok(None);
    }
    if layout.header_digest_len > 0 {
        let got = u32::from_le_bytes(buf[header_end - 4..header_end].try_into().expect("4"));
        let computed = digest::crc32c(&buf[..header_end - 4]);
        if got != computed {
            let claimed_len = layout.total_len();
            return Err(FrameError::HeaderDigest {
                got,
                computed,
                claimed_len,
            });
        }
    }
    Ok(Some(Frame { head, layout }))
}

/// The receive side of a connection: a buffer filled by large reads.
pub struct FrameReader<R> {
    r: R,
    buf: BytesMut,
    chunk: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Reads `r` into buffers of at least `chunk` bytes.
    pub fn new(r: R, chunk: usize) -> FrameReader<R> {
        FrameReader {
            r,
            buf: BytesMut::with_capacity(chunk),
            chunk,
        }
    }

    /// The stream read from.
    pub fn get_ref(&self) -> &R {
        &self.r
    }

    /// The stream read from (e.g. to write to it during login).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.r
    }

    /// The bytes received and not yet taken.
    pub fn buffered(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Gives the parts back (the reader, the bytes buffered).
    pub fn into_parts(self) -> (R, BytesMut) {
        (self.r, self.buf)
    }

    /// Rebuilds a reader over `r` with bytes already received.
    pub fn from_parts(r: R, buf: BytesMut, chunk: usize) -> FrameReader<R> {
        FrameReader { r, buf, chunk }
    }

    /// Reads once, towards `need` buffered bytes. A large frame's rest (`tail`) is read
    /// alone, so that the buffer ends with it and, once it is taken, the next read starts a
    /// buffer with nothing to carry over. Other reads leave `headroom` bytes of the buffer
    /// spare, so that a frame such a read began at its end completes in place instead of
    /// being copied into a new buffer (a read at a full buffer's end grows it, copying what
    /// is buffered). Cancel-safe: what arrived stays buffered.
    async fn read_more(
        &mut self,
        need: usize,
        headroom: usize,
        tail: bool,
    ) -> Result<(), FrameError> {
        // At least one byte: a header whose digest or AHS is still to come wants more than
        // `BHS_LEN` (and a read into no room would look like the end of the stream).
        let missing = need.saturating_sub(self.buf.len()).max(1);
        if self.buf.is_empty() || self.buf.capacity() - self.buf.len() < missing {
            self.buf.reserve(self.chunk.max(missing + headroom));
        }
        let spare = self.buf.capacity() - self.buf.len();
        let limit = if tail {
            missing
        } else {
            spare.saturating_sub(headroom).max(missing)
        };
        let mut room = bytes::BufMut::limit(&mut self.buf, limit);
        match self.r.read_buf(&mut room).await {
            Ok(0) => Err(FrameError::Eof),
            Ok(_) => Ok(()),
            Err(e) => Err(FrameError::Io(e)),
        }
    }

    /// Reads until a whole frame is buffered at the front; its header digest is checked.
    /// Cancel-safe.
    pub async fn next_frame(
        &mut self,
        digests: Digests,
        max_data: u32,
    ) -> Result<Frame, FrameError> {
        // Room for the largest frame `max_data` allows (BHS, AHS, digests, padded data),
        // at most half a chunk (reads then take at least the other half): larger frames are
        // copied when they straddle a buffer's end.
        let headroom = (BHS_LEN + 4 * 255 + 8 + max_data as usize + 3).min(self.chunk / 2);
        loop {
            match frame_header(&self.buf, digests, max_data)? {
                Some(f) if self.buf.len() >= f.total_len() => return Ok(f),
                Some(f) => {
                    let tail = f.total_len() - self.buf.len() >= LARGE_TAIL;
                    self.read_more(f.total_len(), headroom, tail).await?
                }
                None => self.read_more(BHS_LEN, headroom, false).await?,
            }
        }
    }

    /// Appends what has arrived without waiting (see [`crate::poll::SocketPoll`]): Ok(0) at
    /// the end of the stream, `WouldBlock` when nothing has arrived.
    pub fn read_now(&mut self) -> io::Result<usize>
    where
        R: ReadNow,
    {
        if self.buf.capacity() - self.buf.len() < self.chunk / 2 {
            self.buf.reserve(self.chunk);
        }
        self.r.read_now(&mut self.buf)
    }

    /// Reads and drops `len` bytes: a PDU whose header failed its digest, discarded at
    /// ErrorRecoveryLevel ≥ 1 by the length its header claims. Cancel-safe.
    pub async fn discard(&mut self, len: usize) -> Result<(), FrameError> {
        while self.buf.len() < len {
            self.read_more(len, 0, false).await?;
        }
        let _ = self.buf.split_to(len);
        Ok(())
    }

    /// Takes the frame at the front of the buffer (after [`FrameReader::next_frame`]).
    pub fn take(&mut self, frame: &Frame) -> BytesMut {
        self.buf.split_to(frame.total_len())
    }

    /// Reads one whole PDU, both digests checked (login phase, discovery, tests).
    pub async fn read_pdu(&mut self, digests: Digests, max_data: u32) -> Result<InPdu, FrameError> {
        let frame = self.next_frame(digests, max_data).await?;
        let bytes = self.take(&frame).freeze();
        frame
            .verify_data_digest(&bytes)
            .map_err(FrameError::DataDigest)?;
        let bhs = Bhs::decode(&frame.head).map_err(FrameError::Decode)?.bhs;
        Ok(InPdu {
            pdu: frame.pdu(bhs, &bytes),
            raw_bhs: frame.head,
        })
    }
}

/// A framing error as the login phase reports it.
pub fn login_recv_error(e: FrameError) -> LoginRecvError {
    match e {
        FrameError::Eof => LoginRecvError::Closed,
        FrameError::Io(e) => LoginRecvError::Io(e.to_string()),
        e => LoginRecvError::Bad(e.to_string()),
    }
}

enum Part {
    Head(std::ops::Range<usize>),
    Data(Bytes),
    Pad(usize),
    Digest([u8; 4]),
}

/// PDUs encoded for one vectored write: every header in one buffer, payloads by reference.
#[derive(Default)]
pub struct PduBatch {
    heads: Vec<u8>,
    parts: Vec<Part>,
}

impl PduBatch {
    pub fn clear(&mut self) {
        self.heads.clear();
        self.parts.clear();
    }

    /// Appends one PDU. `data_crc`: the CRC32C of `data` (without padding) when the producer
    /// already computed it; otherwise the data digest is computed here.
    pub fn push(
        &mut self,
        bhs: &Bhs,
        ahs: &[u8],
        data: Bytes,
        digests: Digests,
        data_crc: Option<u32>,
    ) {
        let start = self.heads.len();
        self.heads
            .extend_from_slice(&bhs.encode(ahs.len(), data.len() as u32));
        self.heads.extend_from_slice(ahs);
        if digests.header {
            let d = digest::crc32c(&self.heads[start..]);
            self.heads.extend_from_slice(&d.to_le_bytes());
        }
        self.parts.push(Part::Head(start..self.heads.len()));
        if data.is_empty() {
            return;
        }
        let pad = iscsi_wire::padded_len(data.len() as u32) - data.len();
        let digest = digests.data.then(|| {
            let crc = data_crc.unwrap_or_else(|| digest::crc32c(&data));
            digest::crc32c_append(crc, &ZEROS[..pad]).to_le_bytes()
        });
        self.parts.push(Part::Data(data));
        if pad > 0 {
            self.parts.push(Part::Pad(pad));
        }
        if let Some(d) = digest {
            self.parts.push(Part::Digest(d));
        }
    }

    fn part_bytes<'a>(&'a self, p: &'a Part) -> &'a [u8] {
        match p {
            Part::Head(r) => &self.heads[r.clone()],
            Part::Data(b) => b,
            Part::Pad(n) => &ZEROS[..*n],
            Part::Digest(d) => d,
        }
    }

    /// Writes the whole batch (vectored, at most [`MAX_IOVECS`] slices per call).
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, w: &mut W) -> io::Result<()> {
        self.write_to_within(w, std::time::Duration::MAX).await
    }

    /// [`PduBatch::write_to`], failing with [`io::ErrorKind::TimedOut`] when the writer
    /// takes no byte for `stall` (a peer whose receive window stays shut).
    pub async fn write_to_within<W: AsyncWrite + Unpin>(
        &self,
        w: &mut W,
        stall: std::time::Duration,
    ) -> io::Result<()> {
        for chunk in self.parts.chunks(MAX_IOVECS) {
            let mut slices: Vec<IoSlice<'_>> = chunk
                .iter()
                .map(|p| IoSlice::new(self.part_bytes(p)))
                .collect();
            let mut rest: &mut [IoSlice<'_>] = &mut slices;
            while !rest.is_empty() {
                let n = match tokio::time::timeout(stall, w.write_vectored(rest)).await {
                    Ok(n) => n?,
                    Err(_) => return Err(io::ErrorKind::TimedOut.into()),
                };
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut rest, n);
            }
        }
        Ok(())
    }
}

/// Writes one PDU (login phase and other slow paths).
pub async fn write_pdu<W: AsyncWrite + Unpin>(
    w: &mut W,
    pdu: &Pdu,
    digests: Digests,
) -> io::Result<()> {
    let mut batch = PduBatch::default();
    batch.push(&pdu.bhs, &pdu.ahs, pdu.data.clone(), digests, None);
    batch.write_to(w).await
}

/// A stream whose received bytes can be taken without waiting (what a polling reader,
/// [`crate::poll::SocketPoll`], spins on).
pub trait ReadNow {
    /// Appends what has arrived to `buf` without waiting: Ok(0) at the end of the stream,
    /// `WouldBlock` when nothing has arrived.
    fn read_now(&mut self, buf: &mut BytesMut) -> io::Result<usize>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_wire::{decode_pdu, NopOut};

    fn nop(data: &'static [u8]) -> Pdu {
        Pdu::new(
            Bhs::NopOut(NopOut {
                itt: 7,
                ttt: iscsi_wire::RESERVED_TAG,
                ..Default::default()
            }),
            Bytes::from_static(data),
        )
    }

    /// The codec's own encoding (digests by the CRC engine's plain entry point).
    fn codec(pdu: &Pdu, d: Digests) -> Vec<u8> {
        let crc: iscsi_wire::CrcFn = &digest::crc32c;
        iscsi_wire::encode_pdu(pdu, d.header.then_some(crc), d.data.then_some(crc))
    }

    #[tokio::test]
    async fn batches_write_what_the_codec_encodes_and_frame_back() {
        let d = Digests {
            header: true,
            data: true,
        };
        let pdu = nop(b"hello");
        let want = codec(&pdu, d);
        let mut got = Vec::new();
        write_pdu(&mut got, &pdu, d).await.unwrap();
        assert_eq!(got, want);
        // A producer's precomputed CRC gives the same digest.
        let mut batch = PduBatch::default();
        let crc = digest::crc32c(b"hello");
        batch.push(&pdu.bhs, &[], pdu.data.clone(), d, Some(crc));
        let mut again = Vec::new();
        batch.write_to(&mut again).await.unwrap();
        assert_eq!(again, want);
        let f = complete_frame(&got, d, 1024).unwrap().unwrap();
        assert_eq!(f.total_len(), got.len());
        assert_eq!(&got[f.data_range()], b"hello");
        f.verify_data_digest(&got).unwrap();
        assert_eq!(decode_pdu(&got, d, 1024).unwrap().pdu.data, pdu.data);
        // Incomplete: no frame yet.
        assert!(complete_frame(&got[..got.len() - 1], d, 1024)
            .unwrap()
            .is_none());
    }

    #[test]
    fn corrupted_digests_are_reported() {
        let d = Digests {
            header: true,
            data: true,
        };
        let mut bytes = codec(&nop(b"abcdefg"), d);
        let f = complete_frame(&bytes, d, 1024).unwrap().unwrap();
        let at = f.data_range().start;
        bytes[at] ^= 1;
        assert!(f.verify_data_digest(&bytes).is_err());
        bytes[10] ^= 1;
        assert!(matches!(
            complete_frame(&bytes, d, 1024),
            Err(FrameError::HeaderDigest { .. })
        ));
    }

    #[test]
    fn oversize_data_is_a_layout_error_with_the_header() {
        let bytes = codec(&nop(&[0u8; 600]), Digests::default());
        match complete_frame(&bytes, Digests::default(), 512) {
            Err(FrameError::Layout { head, .. }) => assert_eq!(&head[..], &bytes[..48]),
            other => panic!("{other:?}"),
        }
    }

    /// Frames small and large, their tails read alone or with what follows, in buffers
    /// smaller than some frames: each arrives whole and in order.
    #[tokio::test]
    async fn frames_of_every_size_round_trip_through_small_buffers() {
        let d = Digests {
            header: true,
            data: true,
        };
        let sizes = [100usize, 20_000, 5, 70_000, 16_384, 3, 16_383, 40_000, 0, 1];
        let payload =
            |i: usize, n: usize| -> Vec<u8> { (0..n).map(|j| (i * 31 + j) as u8).collect() };
        let (a, b) = tokio::io::duplex(3000);
        let writer = tokio::spawn(async move {
            let mut a = a;
            for (i, &n) in sizes.iter().enumerate() {
                let mut batch = PduBatch::default();
                batch.push(&nop(b"").bhs, &[], Bytes::from(payload(i, n)), d, None);
                batch.write_to(&mut a).await.unwrap();
            }
        });
        let mut r = FrameReader::new(b, 4096);
        for (i, &n) in sizes.iter().enumerate() {
            let p = r.read_pdu(d, 1 << 20).await.unwrap();
            assert_eq!(p.pdu.data[..], payload(i, n)[..], "frame {i} of {n} bytes");
        }
        writer.await.unwrap();
        assert!(matches!(
            r.next_frame(d, 1 << 20).await,
            Err(FrameError::Eof)
        ));
    }

    #[tokio::test]
    async fn reader_and_batch_round_trip_over_a_pipe() {
        let d = Digests {
            header: true,
            data: false,
        };
        let (a, b) = tokio::io::duplex(64);
        let mut batch = PduBatch::default();
        for data in [&b""[..], b"x", b"0123456789"] {
            batch.push(&nop(b"").bhs, &[], Bytes::copy_from_slice(data), d, None);
        }
        let writer = tokio::spawn(async move {
            let mut a = a;
            batch.write_to(&mut a).await.unwrap();
        });
        let mut r = FrameReader::new(b, 16);
        for want in [&b""[..], b"x", b"0123456789"] {
            let p = r.read_pdu(d, 1024).await.unwrap();
            assert_eq!(&p.pdu.data[..], want);
        }
        writer.await.unwrap();
        assert!(matches!(r.next_frame(d, 1024).await, Err(FrameError::Eof)));
    }
}
