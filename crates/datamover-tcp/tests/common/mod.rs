//! What the TCP datamover's tests share: the initiator end's view of the wire, with every
//! digest checked by an independent CRC32C.

// Each test file uses a part of this module.
#![allow(dead_code)]

use iscsi_wire::{decode_pdu, encode_pdu, CrcFn, Digests, Pdu, WireError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The reference byte-table CRC32C, not the hardware path the datamover uses.
pub fn reference_crc32c(bytes: &[u8]) -> u32 {
    digest::sarwate::append(0, bytes)
}

/// The PDU at the front of `buf` and the bytes it took, every digest present checked with
/// [`reference_crc32c`]; `None` while more bytes are needed. Panics on what does not decode.
pub fn decode_checked(buf: &[u8], digests: Digests) -> Option<(Pdu, usize)> {
    match decode_pdu(buf, digests, 1 << 24) {
        Ok(d) => {
            let wire = &buf[..d.consumed];
            if let Some(h) = d.header_digest {
                assert_eq!(h, reference_crc32c(&wire[..48]), "header digest");
            }
            if let Some(dd) = d.data_digest {
                let end = d.consumed - 4;
                let start = end - d.pdu.data.len().next_multiple_of(4);
                assert_eq!(dd, reference_crc32c(&wire[start..end]), "data digest");
            }
            Some((d.pdu, d.consumed))
        }
        Err(WireError::Truncated { .. }) => None,
        Err(e) => panic!("undecodable PDU from the datamover: {e}"),
    }
}

/// No digests.
pub const PLAIN: Digests = Digests {
    header: false,
    data: false,
};
/// Header and data digests.
pub const DIGESTS: Digests = Digests {
    header: true,
    data: true,
};

/// A transport under test: TCP with these digests.
pub struct Tcp(pub Digests);

/// `pdu` on the wire, its digests computed with [`reference_crc32c`].
pub fn encode(pdu: &Pdu, digests: Digests) -> Vec<u8> {
    let crc: CrcFn = &reference_crc32c;
    encode_pdu(
        pdu,
        digests.header.then_some(crc),
        digests.data.then_some(crc),
    )
}

/// The peer's end of a connection under test: PDUs out encoded by [`encode`], PDUs in
/// decoded by [`decode_checked`].
pub struct PeerSocket {
    stream: Option<TcpStream>,
    digests: Digests,
    buf: Vec<u8>,
}

impl PeerSocket {
    pub fn new(stream: TcpStream, digests: Digests) -> PeerSocket {
        PeerSocket {
            stream: Some(stream),
            digests,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, pdu: &Pdu) {
        let bytes = encode(pdu, self.digests);
        if let Some(s) = self.stream.as_mut() {
            let _ = s.write_all(&bytes).await;
        }
    }

    /// The next PDU; `Some(None)` once the connection has ended, `None` after `timeout`.
    pub async fn recv(&mut self, timeout: Duration) -> Option<Option<Pdu>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some((pdu, used)) = decode_checked(&self.buf, self.digests) {
                self.buf.drain(..used);
                return Some(Some(pdu));
            }
            let Some(stream) = self.stream.as_mut() else {
                return Some(None);
            };
            let mut chunk = vec![0u8; 256 * 1024];
            match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.stream = None;
                    return Some(None);
                }
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Drops the connection, as a network failure would.
    pub fn disconnect(&mut self) {
        self.stream = None;
    }
}
