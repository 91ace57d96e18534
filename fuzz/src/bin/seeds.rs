//! Cuts seed inputs for every fuzz target from packet captures of real traffic.
//!
//! Usage: seeds OUT_DIR CAPTURE...
//!
//! Each capture is read as `ironsan analyze` reads it; every TCP connection is reassembled
//! and, by its first bytes, taken as iSCSI/TCP (PDUs cut with the analyzer's framer, digests
//! detected) or iWARP (MPA Request/Reply, then FPDUs; the Sends carry iSER PDUs). Seeds
//! are written in each harness's input format (see the harness docs in `src/`) to
//! OUT_DIR/<target>/<name>, named by content hash, at most a few KiB each and a bounded
//! number per target (the committed corpus stays small). The config seeds are the
//! configuration examples given as further arguments ending in `.toml`.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use analyze::capture::{read_frames, tcp_segment};
use analyze::iscsi::{DigestCheck, PduFramer};
use analyze::tcp::{Chunk, HalfStream};
use ironsan_fuzz::input::push_record;
use ironsan_fuzz::login::replace_chap_r;
use iscsi_login::text;
use iscsi_wire::{Bhs, BHS_LEN};

/// Largest seed written (bytes); larger candidates are cut or skipped.
const MAX_SEED: usize = 16 * 1024;
/// Most seeds per target from all captures together.
const MAX_PER_TARGET: usize = 60;

struct Out {
    dir: PathBuf,
    seen: HashSet<(String, u64)>,
    count: BTreeMap<String, usize>,
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

impl Out {
    fn put(&mut self, target: &str, data: &[u8]) {
        if data.is_empty() || data.len() > MAX_SEED {
            return;
        }
        let h = fnv(data);
        let n = self.count.entry(target.to_string()).or_default();
        if *n >= MAX_PER_TARGET || !self.seen.insert((target.to_string(), h)) {
            return;
        }
        *n += 1;
        let dir = self.dir.join(target);
        fs::create_dir_all(&dir).expect("create corpus dir");
        fs::write(dir.join(format!("seed-{h:016x}")), data).expect("write seed");
    }
}

/// One segment: (from the client, seq, SYN, FIN, RST, payload).
type Segment = (bool, u32, bool, bool, bool, Vec<u8>);

/// One TCP connection: the bytes each way, in order.
#[derive(Default)]
struct Conn {
    client: Option<SocketAddr>,
    server: Option<SocketAddr>,
    /// (from client, seq, syn, fin, rst, payload) per segment, in capture order.
    segments: Vec<Segment>,
    up: Vec<u8>,
    down: Vec<u8>,
}

fn reassemble(segs: &[Segment], from_client: bool) -> Vec<u8> {
    let mut h = HalfStream::default();
    let mut out = Vec::new();
    let mut add = |chunks: Vec<Chunk>| {
        for c in chunks {
            out.extend_from_slice(&c.data);
        }
    };
    for (i, (dir, seq, syn, _, _, payload)) in segs.iter().enumerate() {
        if *dir == from_client {
            add(h.push(*seq, *syn, payload, i as u64, i as u64));
        }
    }
    add(h.finish(0, 0));
    out
}

fn connections(path: &Path) -> Vec<Conn> {
    let frames = match read_frames(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return Vec::new();
        }
    };
    let mut conns: BTreeMap<(SocketAddr, SocketAddr), Conn> = BTreeMap::new();
    for f in &frames {
        let Some(s) = tcp_segment(f) else { continue };
        let key = if s.src < s.dst {
            (s.src, s.dst)
        } else {
            (s.dst, s.src)
        };
        let c = conns.entry(key).or_default();
        if c.client.is_none() {
            // The SYN's sender, or the sender of the first segment seen.
            let (cl, sv) = if s.syn && s.has_ack {
                (s.dst, s.src)
            } else {
                (s.src, s.dst)
            };
            c.client = Some(cl);
            c.server = Some(sv);
        }
        let up = Some(s.src) == c.client;
        c.segments.push((up, s.seq, s.syn, s.fin, s.rst, s.payload));
    }
    let mut out: Vec<Conn> = conns.into_values().collect();
    for c in &mut out {
        c.up = reassemble(&c.segments, true);
        c.down = reassemble(&c.segments, false);
    }
    out
}

/// The PDUs of one direction of an iSCSI/TCP stream: (raw bytes, BHS, data, digests).
struct Pdu {
    raw: Vec<u8>,
    bhs: Bhs,
    data: Vec<u8>,
    header_digest: bool,
    data_digest: bool,
}

fn iscsi_pdus(stream: &[u8]) -> Vec<Pdu> {
    let mut framer = PduFramer::new(true);
    let chunk = Chunk {
        offset: 0,
        data: stream.to_vec(),
        ts_ns: 0,
        frame: 0,
        gap_before: 0,
    };
    framer
        .push(&chunk)
        .into_iter()
        .filter_map(|p| {
            let start = p.offset as usize;
            let raw = stream.get(start..start + p.wire_len as usize)?.to_vec();
            Some(Pdu {
                raw,
                bhs: p.bhs,
                data: p.data,
                header_digest: p.header_digest != DigestCheck::Absent,
                data_digest: p.data_digest != DigestCheck::Absent,
            })
        })
        .collect()
}

/// The PDUs of one direction of an iSER stream, from its Sends (iSER header first), and
/// its raw FPDUs.
fn iwarp_stream(stream: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let Ok(total) = iwarp::MpaFrame::frame_len(stream) else {
        return Default::default();
    };
    let Some(start) = stream.get(..total) else {
        return Default::default();
    };
    let mut fpdus = Vec::new();
    let mut sends = Vec::new();
    let mut partial: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut rest = &stream[total..];
    while let Ok(Some((range, used))) = iwarp::fpdu::decode(rest, false) {
        let ulpdu = &rest[range];
        fpdus.push(rest[..used].to_vec());
        if let Ok(iwarp::DdpHeader::Untagged(h)) = iwarp::DdpHeader::decode(ulpdu) {
            if h.opcode.is_send() {
                let m = partial.entry(h.msn).or_default();
                m.extend_from_slice(&ulpdu[iwarp::ddp::UNTAGGED_LEN..]);
                if h.last {
                    sends.push(partial.remove(&h.msn).unwrap_or_default());
                }
            }
        }
        rest = &rest[used..];
    }
    (start.to_vec(), sends, fpdus)
}

/// Replaces CHAP_R values by `auto` (the harness answers the challenge it sees).
fn auto_chap(data: &[u8]) -> Vec<u8> {
    replace_chap_r(data, |_| true, || "auto".into())
}

fn has_key(pdus: &[&Pdu], key: &str, value: Option<&str>) -> bool {
    pdus.iter().any(|p| {
        text::parse(&p.data).is_ok_and(|pairs| {
            pairs
                .iter()
                .any(|(k, v)| k == key && value.is_none_or(|x| x == v))
        })
    })
}

/// Seeds from the iSCSI PDUs of one connection (`iser`: they came in Sends).
fn session_seeds(out: &mut Out, up: &[Pdu], down: &[Pdu], iser: bool) {
    let is = |p: &&Pdu, op: u8| p.raw.first().is_some_and(|b| b & 0x3f == op);
    let login_up: Vec<&Pdu> = up.iter().filter(|p| is(p, 0x03)).collect();
    let login_down: Vec<&Pdu> = down.iter().filter(|p| is(p, 0x23)).collect();
    let chap = has_key(&login_up, "AuthMethod", Some("CHAP"))
        || has_key(&login_down, "AuthMethod", Some("CHAP"));
    let mutual = has_key(&login_up, "CHAP_C", None);
    let discovery = has_key(&login_up, "SessionType", Some("Discovery"));
    let auth = match (chap, mutual) {
        (false, _) => 0u8,
        (true, false) => 1,
        (true, true) => 2,
    };
    // Login, both sides.
    let records = |pdus: &[&Pdu]| {
        let mut v = Vec::new();
        for p in pdus {
            v.extend_from_slice(&p.raw[..BHS_LEN]);
            push_record(&mut v, &auto_chap(&p.data));
        }
        v
    };
    if !login_up.is_empty() {
        // Discovery sessions need the discovery authentication bits instead.
        let o = if discovery { auth << 2 } else { auth } | u8::from(iser) << 4;
        let mut s = vec![o | 0x40];
        s.extend(records(&login_up));
        out.put("login_target", &s);
        let mut s = vec![o & 0x1f];
        s.extend(records(&login_up));
        out.put("login_target", &s);
    }
    if !login_down.is_empty() {
        let o = auth | u8::from(discovery) << 2 | u8::from(iser) << 3 | 0x40;
        let mut s = vec![o];
        s.extend(records(&login_down));
        out.put("login_initiator", &s);
    }
    // CHAP: the security-stage texts after the first request, as requests and responses.
    if chap {
        for side in [&login_up[..], &login_down[..]] {
            let mut s = vec![u8::from(mutual) | u8::from(iser) << 1];
            for p in side
                .iter()
                .skip(usize::from(std::ptr::eq(side, &login_up[..])))
            {
                let (Bhs::LoginRequest(_) | Bhs::LoginResponse(_)) = p.bhs else {
                    continue;
                };
                let f = p.raw[1];
                s.push((f >> 7) | u8::from(f & 3 == 1) << 1 | ((f >> 6) & 1) << 2);
                push_record(&mut s, &auto_chap(&p.data));
            }
            out.put("chap", &s);
        }
    }
    // Text: requests to the target's negotiator, responses to the SendTargets parser.
    for p in up.iter().filter(|p| is(p, 0x04) || is(p, 0x03)) {
        let mut s = vec![u8::from(discovery) | u8::from(iser) << 1 | 0x20];
        s.extend_from_slice(&p.data);
        out.put("text_keys", &s);
    }
    for p in down.iter().filter(|p| is(p, 0x24)) {
        out.put("send_targets", &p.data);
    }
    // Framing: each kind of PDU alone, and the first PDUs of each direction together.
    if !iser {
        for pdus in [up, down] {
            let Some(first) = pdus.first() else { continue };
            let flags = u8::from(first.header_digest) | u8::from(first.data_digest) << 1;
            let mut kinds = HashSet::new();
            for p in pdus {
                if kinds.insert((p.raw[0] & 0x3f, p.raw.len() > 64)) {
                    let mut s = vec![flags];
                    s.extend_from_slice(&p.raw);
                    out.put("iscsi_pdu", &s);
                }
            }
            let mut s = vec![flags];
            for p in pdus.iter().take(12) {
                if s.len() + p.raw.len() > MAX_SEED {
                    break;
                }
                s.extend_from_slice(&p.raw);
            }
            out.put("iscsi_pdu", &s);
        }
    }
    // SCSI: the session's commands with their immediate data.
    let mut s = vec![0x02];
    for p in up {
        let Bhs::ScsiCommand(c) = &p.bhs else {
            continue;
        };
        let cdb_len = match c.cdb[0] >> 5 {
            0 => 6,
            1 | 2 => 10,
            5 => 12,
            _ => 16,
        };
        s.push(u8::from(c.read) | u8::from(c.write) << 1);
        s.push(cdb_len as u8);
        s.extend_from_slice(&c.cdb[..cdb_len]);
        let len = c.expected_data_len.min(u32::from(u16::MAX)) as u16;
        s.extend_from_slice(&len.to_be_bytes());
        push_record(&mut s, &p.data);
        if s.len() > MAX_SEED / 2 {
            break;
        }
    }
    if s.len() > 1 {
        out.put("scsi", &s);
    }
}

/// SCSI seeds written by hand: commands real initiators send that these captures lack.
fn scsi_extra(out: &mut Out) {
    let cmds: &[(&[u8], u16, &[u8], u8)] = &[
        (
            &[0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0],
            512,
            &[0xaa; 512],
            2,
        ), // WRITE SAME(16) UNMAP
        (&[0x41, 0, 0, 0, 0, 4, 0, 0, 2, 0], 512, &[0x55; 512], 2), // WRITE SAME(10)
        (
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            24,
            &[
                0, 22, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0,
            ],
            2,
        ), // UNMAP
        (
            &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
            1024,
            &[0; 1024],
            2,
        ), // COMPARE AND WRITE
        (&[0x2f, 0x02, 0, 0, 0, 0, 0, 0, 1, 0], 512, &[0; 512], 2), // VERIFY(10) BYTCHK
        (&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0, &[], 0),            // SYNCHRONIZE CACHE(10)
        (
            &[0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0],
            24,
            &[
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0, 0, 0, 0,
            ],
            2,
        ), // PR OUT REGISTER
        (&[0x5e, 0x00, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, &[], 1),   // PR IN READ KEYS
        (&[0x1a, 0x08, 0x3f, 0, 0xff, 0], 255, &[], 1),             // MODE SENSE(6) all pages
        (
            &[0x15, 0x10, 0, 0, 12, 0],
            12,
            &[0, 0, 0, 0, 0, 0, 0, 0, 0x0a, 0x0a, 0x04, 0],
            2,
        ), // MODE SELECT(6)
        (
            &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
            4096,
            &[],
            1,
        ), // GET LBA STATUS
        (&[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], 4096, &[], 1), // REPORT SUPPORTED OPCODES
        (&[0x12, 0x01, 0xb0, 0, 0xff, 0], 255, &[], 1),             // INQUIRY VPD Block Limits
        (&[0x1b, 0, 0, 0, 0, 0], 0, &[], 0),                        // START STOP UNIT: stop
        (
            &[0x9c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            512,
            &[0x11; 512],
            2,
        ), // WRITE ATOMIC(16)
        (
            &[0x8b, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0],
            512,
            &[0x0f; 512],
            2,
        ), // ORWRITE(16)
        (&[0x03, 0, 0, 0, 252, 0], 252, &[], 1),                    // REQUEST SENSE
        (&[0x0a, 0, 0, 1, 1, 0], 512, &[0x77; 512], 2),             // WRITE(6)
        (&[0x08, 0, 0, 1, 1, 0], 512, &[], 1),                      // READ(6)
        (&[0x28, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 1, 0], 512, &[], 1), // READ(10) out of range
    ];
    let mut all = vec![0x02];
    for (i, (cdb, len, data, rw)) in cmds.iter().enumerate() {
        let mut one = vec![0x02 | (i as u8 & 1)];
        for s in [&mut one, &mut all] {
            s.push(*rw);
            s.push(cdb.len() as u8);
            s.extend_from_slice(cdb);
            s.extend_from_slice(&len.to_be_bytes());
            push_record(s, data);
        }
        out.put("scsi", &one);
    }
    out.put("scsi", &all);
}

/// tcp_stream seeds: the segments of one connection as records (absolute sequence numbers).
fn tcp_stream_seed(c: &Conn) -> Vec<u8> {
    let conn_bit = if c.server.is_some_and(|s| s.port() == 3260) {
        0
    } else {
        0x20
    };
    let mut s = Vec::new();
    for (up, seq, syn, fin, rst, payload) in &c.segments {
        if s.len() + payload.len() + 8 > MAX_SEED {
            break;
        }
        let f = u8::from(!up)
            | u8::from(*syn) << 1
            | u8::from(*fin) << 2
            | u8::from(*rst) << 3
            | 0x10
            | conn_bit;
        s.push(f);
        s.extend_from_slice(&seq.to_be_bytes());
        push_record(&mut s, payload);
    }
    s
}

/// The first frames of a capture, rewritten as a small pcapng file.
fn small_capture(path: &Path) -> Option<Vec<u8>> {
    let frames = read_frames(path).ok()?;
    let mut w = pcap_trace::PcapngWriter::new(Vec::new()).ok()?;
    let mut size = 64;
    for f in frames
        .iter()
        .filter(|f| f.linktype == analyze::capture::linktype::ETHERNET)
    {
        size += f.data.len() + 32;
        if size > MAX_SEED {
            break;
        }
        w.write_frame(f.ts_ns, &f.data).ok()?;
    }
    Some(w.into_inner())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((dir, inputs)) = args.split_first() else {
        eprintln!("usage: seeds OUT_DIR CAPTURE... [CONFIG.toml...]");
        std::process::exit(2);
    };
    let mut out = Out {
        dir: PathBuf::from(dir),
        seen: HashSet::new(),
        count: BTreeMap::new(),
    };
    scsi_extra(&mut out);
    for seed in ironsan_fuzz::nvme_tcp::seeds() {
        out.put("nvme_tcp_pdu", &seed);
    }
    for input in inputs {
        let path = Path::new(input);
        if input.ends_with(".toml") {
            out.put("config", &fs::read(path).expect("config example"));
            continue;
        }
        // Small captures are seeds themselves: whole (pcap), and cut to their first frames.
        let raw = fs::read(path).unwrap_or_default();
        out.put("pcap", &raw);
        if let Some(small) = small_capture(path) {
            out.put("pcap", &small);
        }
        for c in connections(path) {
            out.put("tcp_stream", &tcp_stream_seed(&c));
            if c.up.starts_with(iwarp::mpa::KEY_REQUEST) {
                let (req, sends_up, fpdus_up) = iwarp_stream(&c.up);
                let (rep, sends_down, fpdus_down) = iwarp_stream(&c.down);
                for (o, frame) in [(0u8, &req), (0x08, &req), (0x02, &rep), (0x0a, &rep)] {
                    let mut s = vec![o, 0x44];
                    s.extend_from_slice(frame);
                    out.put("mpa", &s);
                }
                let crc = req.get(16).is_some_and(|f| f & 0x40 != 0);
                for fpdus in [&fpdus_up, &fpdus_down] {
                    let mut kinds = HashSet::new();
                    for f in fpdus.iter() {
                        let kind = (f.get(2).copied(), f.get(3).copied(), f.len() > 64);
                        if kinds.insert(kind) {
                            let mut s = vec![u8::from(crc)];
                            s.extend_from_slice(f);
                            out.put("ddp_rdmap", &s);
                        }
                    }
                    let mut s = vec![u8::from(crc)];
                    for f in fpdus.iter().take(8) {
                        s.extend_from_slice(f);
                    }
                    out.put("ddp_rdmap", &s);
                }
                let to_pdus = |sends: &[Vec<u8>]| -> Vec<Pdu> {
                    sends
                        .iter()
                        .filter_map(|send| {
                            let p = iser::parse_send(&bytes::Bytes::from(send.clone()), 1 << 20)
                                .ok()?;
                            Some(Pdu {
                                raw: send[iser::ISER_HEADER_LEN..].to_vec(),
                                bhs: p.pdu.bhs,
                                data: p.pdu.data.to_vec(),
                                header_digest: false,
                                data_digest: false,
                            })
                        })
                        .collect()
                };
                let up = to_pdus(&sends_up);
                let down = to_pdus(&sends_down);
                for send in sends_up.iter().chain(&sends_down) {
                    let mut s = vec![u8::from(send.len() < 1024)];
                    s.extend_from_slice(send);
                    out.put("iser", &s);
                }
                session_seeds(&mut out, &up, &down, true);
            } else {
                let up = iscsi_pdus(&c.up);
                let down = iscsi_pdus(&c.down);
                if up.is_empty() && down.is_empty() {
                    continue;
                }
                session_seeds(&mut out, &up, &down, false);
            }
        }
    }
    for (t, n) in &out.count {
        println!("{t}: {n} seeds");
    }
}
