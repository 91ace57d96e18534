//! Reading capture files: pcap and pcapng (any byte order, any timestamp resolution, several
//! interfaces) into TCP segments. Link layers handled: Ethernet (with VLAN tags), Linux cooked
//! v1 and v2 (`tcpdump -i any`), raw IP, and BSD loopback.

use std::fs::File;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use etherparse::{LaxNetSlice, LaxSlicedPacket, TransportSlice};
use pcap_parser::pcapng::Block;
use pcap_parser::traits::PcapNGPacketBlock;
use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{create_reader, PcapBlockOwned, PcapError};

/// Link-layer header types (tcpdump LINKTYPE_ values) this reader understands.
pub mod linktype {
    pub const NULL: i32 = 0;
    pub const ETHERNET: i32 = 1;
    pub const RAW: i32 = 101;
    pub const LOOP: i32 = 108;
    pub const LINUX_SLL: i32 = 113;
    pub const IPV4: i32 = 228;
    pub const IPV6: i32 = 229;
    pub const LINUX_SLL2: i32 = 276;
}

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1-based position in the file (the number tshark shows).
    pub number: u64,
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    pub linktype: i32,
    pub data: Vec<u8>,
}

/// The TCP part of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSegment {
    pub frame: u64,
    pub ts_ns: u64,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    pub has_ack: bool,
    pub window: u16,
    /// A SYN with TCP options (as real stacks send, with at least an MSS): its window scale,
    /// if it offered one.
    pub syn_options: Option<SynOptions>,
    pub payload: Vec<u8>,
}

/// What a SYN's options say about the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynOptions {
    pub window_scale: Option<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot open capture: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a pcap or pcapng file, or a damaged one: {0}")]
    Format(String),
}

/// Reads every frame of a pcap or pcapng file.
pub fn read_frames(path: &Path) -> Result<Vec<Frame>, CaptureError> {
    read_frames_from(File::open(path)?)
}

/// The reader's buffer: large enough for one 256 KiB snaplen record (it grows nothing by
/// itself).
const READ_BUFFER: usize = 1 << 22;

/// Reads every frame from a pcap or pcapng byte stream.
pub fn read_frames_from<R: Read>(input: R) -> Result<Vec<Frame>, CaptureError> {
    FrameReader::with_buffer(input, READ_BUFFER)?.collect()
}

/// Reads every frame of a capture held in memory, with a buffer no larger than it (no block
/// can be longer than the whole capture): a small capture costs no 4 MiB buffer.
pub fn read_frames_from_bytes(bytes: &[u8]) -> Result<Vec<Frame>, CaptureError> {
    FrameReader::with_buffer(bytes, bytes.len().clamp(1 << 16, READ_BUFFER))?.collect()
}

/// The frames of a pcap or pcapng byte stream one at a time, read through a fixed buffer:
/// a capture of any size costs the buffer and the frame at hand. A truncated last record
/// (a capture cut short) ends the frames quietly; damage anywhere else is an error, after
/// which there are no more frames.
pub struct FrameReader<'a> {
    reader: Box<dyn PcapReaderIterator + 'a>,
    headers: Headers,
    done: bool,
}

/// What the header blocks read so far say about the packets that follow.
struct Headers {
    /// Per pcapng section: (linktype, units per second, offset seconds) per interface.
    interfaces: Vec<(i32, u64, i64)>,
    legacy: (i32, u64),
    /// Frames so far.
    number: u64,
    /// The byte order of the pcapng section being read (None: no section yet, or legacy pcap).
    section_big_endian: Option<bool>,
}

impl<'a> FrameReader<'a> {
    /// Reads `path` through a 4 MiB buffer.
    pub fn open(path: &Path) -> Result<FrameReader<'static>, CaptureError> {
        FrameReader::with_buffer(File::open(path)?, READ_BUFFER)
    }

    fn with_buffer<R: Read + 'a>(input: R, buffer: usize) -> Result<FrameReader<'a>, CaptureError> {
        let reader =
            create_reader(buffer, input).map_err(|e| CaptureError::Format(format!("{e:?}")))?;
        Ok(FrameReader {
            reader,
            headers: Headers {
                interfaces: Vec::new(),
                legacy: (linktype::ETHERNET, 1_000_000),
                number: 0,
                section_big_endian: None,
            },
            done: false,
        })
    }

    /// The next frame, `Ok(None)` at the end.
    fn next_frame(&mut self) -> Result<Option<Frame>, CaptureError> {
        // Each iteration consumes a block or refills; a stuck reader fails instead of looping.
        let mut stalls = 0;
        loop {
            if let Some(big_endian) = self.headers.section_big_endian {
                if let Some(len) = too_short_pcapng_block(self.reader.data(), big_endian) {
                    return Err(CaptureError::Format(format!(
                        "a pcapng block claims to be {len} bytes long, less than the 12 of a \
                         block's type and two length fields"
                    )));
                }
            }
            match self.reader.next() {
                Ok((offset, block)) => {
                    stalls = 0;
                    let frame = self.headers.frame_of(block);
                    self.reader.consume(offset);
                    if frame.is_some() {
                        return Ok(frame);
                    }
                }
                Err(PcapError::Eof) => return Ok(None),
                Err(PcapError::Incomplete(_)) => {
                    stalls += 1;
                    if stalls > 2 {
                        // A truncated last record (capture cut short): keep what was read.
                        return Ok(None);
                    }
                    self.reader
                        .refill()
                        .map_err(|e| CaptureError::Format(format!("{e:?}")))?;
                }
                Err(e) => return Err(CaptureError::Format(format!("{e:?}"))),
            }
        }
    }
}

impl Headers {
    /// The frame a block holds, after taking in what a header block says.
    fn frame_of(&mut self, block: PcapBlockOwned) -> Option<Frame> {
        match block {
            PcapBlockOwned::LegacyHeader(h) => {
                let units = if h.is_nanosecond_precision() {
                    1_000_000_000
                } else {
                    1_000_000
                };
                self.legacy = (h.network.0, units);
                None
            }
            PcapBlockOwned::Legacy(b) => {
                self.number += 1;
                let frac_ns = b.ts_usec as u64 * (1_000_000_000 / self.legacy.1);
                Some(Frame {
                    number: self.number,
                    ts_ns: b.ts_sec as u64 * 1_000_000_000 + frac_ns,
                    linktype: self.legacy.0,
                    data: b.data[..(b.caplen as usize).min(b.data.len())].to_vec(),
                })
            }
            PcapBlockOwned::NG(Block::SectionHeader(shb)) => {
                self.section_big_endian = Some(shb.big_endian());
                self.interfaces.clear();
                None
            }
            PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                let units = idb.ts_resolution().unwrap_or(1_000_000);
                self.interfaces
                    .push((idb.linktype.0, units, idb.ts_offset()));
                None
            }
            PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                self.number += 1;
                let (lt, units, off) = self
                    .interfaces
                    .get(epb.if_id as usize)
                    .copied()
                    .unwrap_or((linktype::ETHERNET, 1_000_000, 0));
                let ts = ((epb.ts_high as u64) << 32) | epb.ts_low as u64;
                Some(Frame {
                    number: self.number,
                    ts_ns: pcapng_ts_ns(ts, units, off),
                    linktype: lt,
                    data: epb.packet_data().to_vec(),
                })
            }
            PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
                self.number += 1;
                let lt = self.interfaces.first().map_or(linktype::ETHERNET, |i| i.0);
                Some(Frame {
                    number: self.number,
                    ts_ns: 0,
                    linktype: lt,
                    data: spb.packet_data().to_vec(),
                })
            }
            PcapBlockOwned::NG(_) => None,
        }
    }
}

impl Iterator for FrameReader<'_> {
    type Item = Result<Frame, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_frame().transpose();
        self.done = !matches!(next, Some(Ok(_)));
        next
    }
}

/// The length a pcapng block (other than a Section Header, which the parser checks itself)
/// at the start of `data` claims, if it is shorter than any block can be. pcap-parser 0.16
/// takes `length - 12` bytes of content without checking for a Process Information Block
/// (its minimum is 4): a shorter length overflowed (a panic with overflow checks, found by
/// the pcap fuzz target; a wrapped, huge length without).
fn too_short_pcapng_block(data: &[u8], big_endian: bool) -> Option<u32> {
    const SECTION_HEADER: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
    let head: [u8; 8] = data.get(..8)?.try_into().ok()?;
    if head[..4] == SECTION_HEADER {
        return None;
    }
    let len_bytes = [head[4], head[5], head[6], head[7]];
    let len = if big_endian {
        u32::from_be_bytes(len_bytes)
    } else {
        u32::from_le_bytes(len_bytes)
    };
    (len < 12).then_some(len)
}

/// Nanoseconds since the epoch of a pcapng timestamp of `units` per second with the
/// interface's offset in seconds. The file's values are untrusted (a resolution of one unit a
/// second, a huge offset): out-of-range times saturate instead of overflowing.
fn pcapng_ts_ns(ts: u64, units: u64, offset_secs: i64) -> u64 {
    let units = units.max(1);
    let secs = (i128::from(ts / units) + i128::from(offset_secs)).max(0) as u128;
    let frac_ns = u128::from(ts % units) * 1_000_000_000 / u128::from(units);
    (secs * 1_000_000_000 + frac_ns).min(u128::from(u64::MAX)) as u64
}

/// The IP packet inside a frame, by link type.
fn ip_payload(linktype: i32, data: &[u8]) -> Option<&[u8]> {
    match linktype {
        linktype::ETHERNET => {
            let mut at = 12;
            let mut ethertype = u16::from_be_bytes([*data.get(12)?, *data.get(13)?]);
            // 802.1Q / 802.1ad tags, at most two.
            for _ in 0..2 {
                if ethertype == 0x8100 || ethertype == 0x88a8 {
                    at += 4;
                    ethertype = u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?]);
                }
            }
            matches!(ethertype, 0x0800 | 0x86dd).then(|| data.get(at + 2..))?
        }
        linktype::LINUX_SLL => {
            let proto = u16::from_be_bytes([*data.get(14)?, *data.get(15)?]);
            matches!(proto, 0x0800 | 0x86dd).then(|| data.get(16..))?
        }
        linktype::LINUX_SLL2 => {
            let proto = u16::from_be_bytes([*data.first()?, *data.get(1)?]);
            matches!(proto, 0x0800 | 0x86dd).then(|| data.get(20..))?
        }
        linktype::NULL | linktype::LOOP => data.get(4..),
        linktype::RAW | linktype::IPV4 | linktype::IPV6 => Some(data),
        _ => None,
    }
}

/// The TCP segment in a frame, if it holds one.
fn syn_options(tcp: &etherparse::TcpSlice) -> Option<SynOptions> {
    if !tcp.syn() || tcp.options().is_empty() {
        return None;
    }
    let window_scale = tcp.options_iterator().find_map(|o| match o {
        Ok(etherparse::TcpOptionElement::WindowScale(s)) => Some(s),
        _ => None,
    });
    Some(SynOptions { window_scale })
}

pub fn tcp_segment(frame: &Frame) -> Option<TcpSegment> {
    let ip = ip_payload(frame.linktype, &frame.data)?;
    let packet = LaxSlicedPacket::from_ip(ip).ok()?;
    let (src_ip, dst_ip): (IpAddr, IpAddr) = match packet.net.as_ref()? {
        LaxNetSlice::Ipv4(v4) => (
            v4.header().source_addr().into(),
            v4.header().destination_addr().into(),
        ),
        LaxNetSlice::Ipv6(v6) => (
            v6.header().source_addr().into(),
            v6.header().destination_addr().into(),
        ),
    };
    let Some(TransportSlice::Tcp(tcp)) = packet.transport.as_ref() else {
        return None;
    };
    // A frame cut by a snap length (tcpdump -s, `--trace-snap`) still says in its IP header
    // how long its payload was: the bytes not captured are read as zeros, so the stream keeps
    // its length and the PDUs after them their place (their headers were kept).
    let declared = match packet.net.as_ref()? {
        LaxNetSlice::Ipv4(v4) => {
            let h = v4.header();
            usize::from(h.total_len()).saturating_sub(h.slice().len())
        }
        LaxNetSlice::Ipv6(v6) => {
            usize::from(v6.header().payload_length()).saturating_sub(v6.extensions().slice().len())
        }
    }
    .saturating_sub(tcp.header_len());
    let mut payload = tcp.payload().to_vec();
    if declared > payload.len() {
        payload.resize(declared, 0);
    }
    Some(TcpSegment {
        frame: frame.number,
        ts_ns: frame.ts_ns,
        src: SocketAddr::new(src_ip, tcp.source_port()),
        dst: SocketAddr::new(dst_ip, tcp.destination_port()),
        seq: tcp.sequence_number(),
        ack: tcp.acknowledgment_number(),
        syn: tcp.syn(),
        fin: tcp.fin(),
        rst: tcp.rst(),
        has_ack: tcp.ack(),
        window: tcp.window_size(),
        syn_options: syn_options(tcp),
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap_legacy(linktype: u32, nanos: bool, records: &[(u32, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        let magic: u32 = if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 };
        out.extend_from_slice(&magic.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&65535u32.to_le_bytes());
        out.extend_from_slice(&linktype.to_le_bytes());
        for (s, f, d) in records {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&f.to_le_bytes());
            out.extend_from_slice(&(d.len() as u32).to_le_bytes());
            out.extend_from_slice(&(d.len() as u32).to_le_bytes());
            out.extend_from_slice(d);
        }
        out
    }

    fn eth_frame(payload: &[u8]) -> Vec<u8> {
        pcap_trace::build_frame(
            "10.1.1.1:40000".parse().unwrap(),
            "10.1.1.2:3260".parse().unwrap(),
            100,
            200,
            0x18,
            payload,
        )
    }

    #[test]
    fn legacy_pcap_ethernet_microseconds() {
        let file = pcap_legacy(1, false, &[(5, 250_000, eth_frame(b"abc"))]);
        let frames = read_frames_from(&file[..]).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].ts_ns, 5_250_000_000);
        let seg = tcp_segment(&frames[0]).unwrap();
        assert_eq!(seg.src, "10.1.1.1:40000".parse().unwrap());
        assert_eq!(seg.dst.port(), 3260);
        assert_eq!((seg.seq, seg.ack), (100, 200));
        assert_eq!(seg.payload, b"abc");
    }

    #[test]
    fn linux_cooked_v1_and_v2() {
        let eth = eth_frame(b"xyz");
        let ip = &eth[14..];
        let mut sll = vec![0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(ip);
        let mut sll2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        sll2.extend_from_slice(ip);
        for (lt, data) in [(113, sll), (276, sll2)] {
            let file = pcap_legacy(lt, true, &[(1, 7, data)]);
            let frames = read_frames_from(&file[..]).unwrap();
            assert_eq!(frames[0].ts_ns, 1_000_000_007);
            assert_eq!(tcp_segment(&frames[0]).unwrap().payload, b"xyz");
        }
    }

    #[test]
    fn pcapng_from_the_trace_writer() {
        let mut w = pcap_trace::PcapngWriter::new(Vec::new()).unwrap();
        w.write_frame(1_700_000_000_123_456_789, &eth_frame(b"hello"))
            .unwrap();
        let file = w.into_inner();
        let frames = read_frames_from(&file[..]).unwrap();
        assert_eq!(frames[0].ts_ns, 1_700_000_000_123_456_789);
        assert_eq!(tcp_segment(&frames[0]).unwrap().payload, b"hello");
    }

    #[test]
    fn a_capture_in_memory_reads_the_same_with_a_buffer_its_size() {
        let mut w = pcap_trace::PcapngWriter::new(Vec::new()).unwrap();
        // Records below and above the smallest buffer (64 KiB).
        for (i, len) in [10usize, 70_000, 200_000, 3].into_iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
            w.write_frame(1_000 + i as u64, &eth_frame(&payload))
                .unwrap();
        }
        let file = w.into_inner();
        let streamed = read_frames_from(&file[..]).unwrap();
        let in_memory = read_frames_from_bytes(&file).unwrap();
        assert_eq!(in_memory.len(), 4);
        for (a, b) in streamed.iter().zip(&in_memory) {
            assert_eq!((a.number, a.ts_ns, &a.data), (b.number, b.ts_ns, &b.data));
        }
        assert!(read_frames_from_bytes(b"").is_err());
        let cut = &file[..file.len() - 5];
        assert_eq!(
            read_frames_from(cut).map(|f| f.len()).ok(),
            read_frames_from_bytes(cut).map(|f| f.len()).ok(),
            "a truncated capture reads the same way"
        );
    }

    #[test]
    fn a_pcapng_block_shorter_than_12_bytes_is_an_error_not_a_panic() {
        let mut w = pcap_trace::PcapngWriter::new(Vec::new()).unwrap();
        w.write_frame(1_000, &eth_frame(b"first")).unwrap();
        let good = w.into_inner();
        for big_endian in [false, true] {
            for len in [4u32, 8, 11] {
                let mut file = if big_endian {
                    be_section_header()
                } else {
                    good.clone()
                };
                // A Process Information Block (type 0x80000001, 4-byte minimum in
                // pcap-parser) that claims fewer bytes than any block has.
                let to_bytes = |v: u32| {
                    if big_endian {
                        v.to_be_bytes()
                    } else {
                        v.to_le_bytes()
                    }
                };
                file.extend_from_slice(&to_bytes(0x8000_0001));
                file.extend_from_slice(&to_bytes(len));
                file.extend_from_slice(&[0xff; 12]);
                let err = read_frames_from_bytes(&file).expect_err("a damaged block");
                assert!(
                    err.to_string().contains(&format!("{len} bytes long")),
                    "{err}"
                );
                assert!(read_frames_from(&file[..]).is_err());
            }
        }
        // The regression input the fuzzer found.
        let found = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/regressions/pcap/pcapng-process-information-block-too-short"
        ))
        .unwrap();
        assert!(read_frames_from_bytes(&found).is_err());
    }

    /// A big-endian pcapng Section Header, nothing after it.
    fn be_section_header() -> Vec<u8> {
        let mut out = vec![0x0a, 0x0d, 0x0d, 0x0a];
        out.extend_from_slice(&28u32.to_be_bytes());
        out.extend_from_slice(&0x1a2b_3c4du32.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&(-1i64).to_be_bytes());
        out.extend_from_slice(&28u32.to_be_bytes());
        out
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(read_frames_from(&b"this is not a capture file at all"[..]).is_err());
        assert!(read_frames_from(&b""[..]).is_err());
    }
}
