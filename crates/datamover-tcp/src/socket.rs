//! A TCP socket before full feature phase, for either role: whole PDUs in and out through
//! the framer, traced when asked; then split into the halves full feature phase runs on.

use crate::frame::{self, FrameReader};
use crate::trace::Traced;
use datamover::{InPdu, LoginRecvError};
use iscsi_wire::{Digests, Pdu};
use pcap_trace::{PduTrace, Side};
use std::io;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

pub(crate) struct PduSocket {
    reader: FrameReader<Traced<TcpStream>>,
    /// Receive buffer growth per read (kept for full feature phase).
    chunk: usize,
}

impl PduSocket {
    /// Wraps a connected socket (`side`: whether this end accepted or connected); with
    /// `trace`, its bytes are recorded from now on.
    pub(crate) fn new(
        stream: TcpStream,
        trace: Option<&PduTrace>,
        side: Side,
        chunk: usize,
    ) -> PduSocket {
        PduSocket {
            reader: FrameReader::new(Traced::new(stream, trace, side), chunk),
            chunk,
        }
    }

    pub(crate) fn socket(&self) -> &TcpStream {
        self.reader.get_ref().socket()
    }

    pub(crate) async fn send(&mut self, pdu: &Pdu, digests: Digests) -> io::Result<()> {
        frame::write_pdu(self.reader.get_mut(), pdu, digests).await
    }

    pub(crate) async fn recv(
        &mut self,
        digests: Digests,
        max_data: u32,
    ) -> Result<InPdu, LoginRecvError> {
        self.reader
            .read_pdu(digests, max_data)
            .await
            .map_err(frame::login_recv_error)
    }

    /// Full feature phase: the reader (with what was received already) and the write half.
    pub(crate) fn into_split(self) -> (FrameReader<Traced<OwnedReadHalf>>, Traced<OwnedWriteHalf>) {
        let (stream, buffered) = self.reader.into_parts();
        let (r, w) = stream.into_split();
        (FrameReader::from_parts(r, buffered, self.chunk), w)
    }
}
