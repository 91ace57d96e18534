//! Terminate on the wire. The peer here is a raw TCP socket that negotiates MPA by hand and then
//! sends FPDUs built with the `iwarp` codec: an RDMA Write to an STag that does not exist, one
//! past the end of a region, one into a region without remote-write rights, an RDMA Read Request
//! for bytes outside a region, a Send with no receive posted, and an FPDU with a bad CRC. Each
//! time the RNIC must answer with one Terminate FPDU whose bytes are what RFC 5040 §4.8 (layout),
//! §7 (RDMAP codes), RFC 5041 §7 (DDP codes) and RFC 5044 (LLP codes) say, close the connection,
//! and move its QP to the error state with the posted receives flushed.
mod common;
use common::*;
use iwarp::ddp::{DdpHeader, Opcode, TaggedHeader, UntaggedHeader};
use iwarp::{fpdu, ReadRequest};
use rdma::*;
use rnic::{Mr, Rnic};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

struct Side {
    rnic: Rnic,
    qp: rnic::Qp,
    rcq: rnic::Cq,
    region: Mr,
    readonly: Mr,
    sock: TcpStream,
    crc: bool,
}

/// A raw MPA v2 initiator against an RNIC listener; the RNIC side posts one receive unless told
/// not to.
fn connect(crc: bool, post_recv: bool) -> Side {
    let rnic = Rnic::new().unwrap();
    let pd = rnic.alloc_pd().unwrap();
    let listener = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x10 | if crc { 0x40 } else { 0 }, 2, 0, 4, 0, 1, 0, 1]);
    sock.write_all(&req).unwrap();

    let scq = rnic.create_cq(16, None).unwrap();
    let rcq = rnic.create_cq(16, None).unwrap();
    let qp = rnic.create_qp(&pd, &scq, &rcq, QpCaps::default()).unwrap();
    let rbuf = rnic.reg_mr(&pd, 256, Access::LOCAL_WRITE).unwrap();
    if post_recv {
        qp.post_recv(RecvWr {
            wr_id: 42,
            sges: vec![rbuf.sge(0, 256)],
        })
        .unwrap();
    }
    let request = listener.get_request(T).unwrap().expect("MPA request");
    let params = ConnParams {
        ird: 1,
        ord: 1,
        ..Default::default()
    };
    let info = request.accept(&qp, &params).unwrap();
    assert_eq!(info.crc, crc);

    let mut reply = [0u8; 24];
    sock.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..16], b"MPA ID Rep Frame");
    assert_eq!(
        reply[16] & 0x40 != 0,
        crc,
        "Reply C bit mirrors the Request"
    );
    assert_eq!((reply[17], &reply[18..20]), (2, &[0u8, 4][..]));
    std::mem::forget(rbuf); // stays registered for the QP's lifetime
    let region = rnic
        .reg_mr(&pd, 4096, Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    let readonly = rnic.reg_mr(&pd, 4096, Access::REMOTE_READ).unwrap();
    Side {
        rnic,
        qp,
        rcq,
        region,
        readonly,
        sock,
        crc,
    }
}

fn tagged(stag: u32, to: u64) -> Vec<u8> {
    DdpHeader::Tagged(TaggedHeader {
        last: true,
        opcode: Opcode::RdmaWrite,
        stag,
        to,
    })
    .to_bytes()
}

fn untagged(opcode: Opcode, qn: u32) -> Vec<u8> {
    DdpHeader::Untagged(UntaggedHeader {
        last: true,
        opcode,
        inv_stag: 0,
        qn,
        msn: 1,
        mo: 0,
    })
    .to_bytes()
}

/// Everything the RNIC sends until it closes the connection (bounded by T).
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let deadline = Instant::now() + T;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("reading from the RNIC: {e}"),
        }
    }
    panic!("the RNIC did not close the connection");
}

/// Sends `frame`, then checks the single Terminate FPDU that comes back and the QP's state.
/// `ctrl` = the 4 Terminate Control bytes (Layer|EType, Error Code, HdrCt, reserved);
/// `rest` = the bytes after them (DDP Segment Length and the copied headers).
fn expect_terminate(mut side: Side, frame: Vec<u8>, ctrl: [u8; 4], rest: &[u8], what: &str) {
    side.sock.write_all(&frame).unwrap();
    let got = read_to_close(&mut side.sock);
    let body_len = 4 + rest.len();
    let ulpdu = 18 + body_len;
    let total = fpdu::FpduLayout::new(ulpdu).total();
    assert_eq!(
        got.len(),
        total,
        "{what}: one Terminate FPDU, then close: {got:02x?}"
    );
    assert_eq!(
        &got[..2],
        &(ulpdu as u16).to_be_bytes(),
        "{what}: ULPDU length"
    );
    // DDP: untagged, last, version 1; RDMAP: version 1, opcode 7 (Terminate).
    assert_eq!(&got[2..4], &[0x41, 0x47], "{what}: DDP/RDMAP control");
    // RsvdULP 0, QN 2 (Terminate queue), MSN 1, MO 0.
    assert_eq!(
        &got[4..20],
        &[0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0],
        "{what}: untagged header"
    );
    assert_eq!(&got[20..24], &ctrl, "{what}: Terminate Control");
    assert_eq!(&got[24..20 + body_len], rest, "{what}: Terminate headers");
    let crc_at = total - 4;
    assert!(got[20 + body_len..crc_at].iter().all(|&b| b == 0), "pad");
    let want_crc = if side.crc {
        digest_le(&got[..crc_at])
    } else {
        [0; 4]
    };
    assert_eq!(&got[crc_at..], &want_crc, "{what}: MPA CRC field");

    assert!(side.qp.wait_closed(T), "{what}: QP in error");
    let code = iwarp::TerminateCode {
        layer: ctrl[0] >> 4,
        etype: ctrl[0] & 0x0f,
        code: ctrl[1],
    };
    let err = side.qp.last_error().unwrap_or_default();
    assert!(
        err.contains(&format!("sent Terminate: {code}")),
        "{what}: {err}"
    );
    let wc = wait_wc(&side.rcq, T);
    assert_eq!((wc.wr_id, wc.status), (42, WcStatus::Flushed), "{what}");
    let mut bytes = vec![0u8; 4096];
    side.region.read_at(0, &mut bytes);
    assert!(bytes.iter().all(|&b| b == 0), "{what}: region untouched");
    side.readonly.read_at(0, &mut bytes);
    assert!(bytes.iter().all(|&b| b == 0), "{what}: region untouched");
    drop(side.rnic);
}

/// CRC32C as MPA sends it (init and final complement, little-endian), bit by bit: a reference
/// independent of the codec's table.
fn digest_le(b: &[u8]) -> [u8; 4] {
    let mut c = !0u32;
    for &x in b {
        c ^= x as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
    }
    (!c).to_le_bytes()
}

/// The DDP Segment Length and a copy of the offending DDP header (HdrCt M and D).
fn seg_and_header(ulpdu: usize, hdr: &[u8]) -> Vec<u8> {
    let mut v = (ulpdu as u16).to_be_bytes().to_vec();
    v.extend_from_slice(hdr);
    v
}

#[test]
fn write_to_an_invalid_stag() {
    for crc in [false, true] {
        let side = connect(crc, true);
        let stag = side.region.rkey() ^ 0x5500; // no such index
        let hdr = tagged(stag, side.region.addr());
        let frame = fpdu::encode(&hdr, &[7; 100], crc);
        // DDP layer (1), tagged buffer error (1), invalid STag (0x00); M and D.
        let rest = seg_and_header(hdr.len() + 100, &hdr);
        expect_terminate(side, frame, [0x11, 0x00, 0xc0, 0], &rest, "invalid STag");
    }
}

#[test]
fn write_out_of_bounds() {
    for crc in [false, true] {
        let side = connect(crc, true);
        let hdr = tagged(side.region.rkey(), side.region.addr() + 4000);
        let frame = fpdu::encode(&hdr, &[7; 97], crc);
        // DDP layer, tagged buffer error, base or bounds violation (0x01).
        let rest = seg_and_header(hdr.len() + 97, &hdr);
        expect_terminate(side, frame, [0x11, 0x01, 0xc0, 0], &rest, "out of bounds");
    }
}

#[test]
fn write_without_remote_write_rights() {
    let side = connect(false, true);
    let hdr = tagged(side.readonly.rkey(), side.readonly.addr());
    let frame = fpdu::encode(&hdr, &[7; 8], false);
    // RDMAP layer (0), remote protection error (1), access rights violation (0x02).
    let rest = seg_and_header(hdr.len() + 8, &hdr);
    expect_terminate(side, frame, [0x01, 0x02, 0xc0, 0], &rest, "rights");
}

#[test]
fn read_request_out_of_bounds() {
    for crc in [false, true] {
        let side = connect(crc, true);
        let rr = ReadRequest {
            sink_stag: 0x1234_5601,
            sink_to: 0x10_0000,
            size: 200,
            src_stag: side.region.rkey(),
            src_to: side.region.addr() + 4000,
        }
        .encode();
        let frame = fpdu::encode(&untagged(Opcode::ReadRequest, 1), &rr, crc);
        // RDMAP layer, remote protection error, base or bounds violation (0x01); R: the Read
        // Request header follows the (unused) DDP Segment Length.
        let mut rest = vec![0, 0];
        rest.extend_from_slice(&rr);
        expect_terminate(side, frame, [0x01, 0x01, 0x20, 0], &rest, "read bounds");
    }
}

#[test]
fn send_without_a_posted_receive() {
    let side = connect(false, false);
    let hdr = untagged(Opcode::Send, 0);
    let frame = fpdu::encode(&hdr, b"nobody listens", false);
    // DDP layer, untagged buffer error (2), invalid MSN - no buffer available (0x02).
    let rest = seg_and_header(hdr.len() + 14, &hdr);
    let mut side = side;
    side.sock.write_all(&frame).unwrap();
    let got = read_to_close(&mut side.sock);
    assert_eq!(
        got.len(),
        fpdu::FpduLayout::new(18 + 4 + rest.len()).total()
    );
    assert_eq!(&got[2..4], &[0x41, 0x47]);
    assert_eq!(&got[20..24], &[0x12, 0x02, 0xc0, 0]);
    assert_eq!(&got[24..24 + rest.len()], &rest[..]);
    assert!(side.qp.wait_closed(T));
    assert!(side
        .qp
        .last_error()
        .is_some_and(|e| e.contains("sent Terminate: DDP etype 2 code 0x02")));
}

#[test]
fn bad_mpa_crc() {
    let side = connect(true, true);
    let hdr = untagged(Opcode::Send, 0);
    let mut frame = fpdu::encode(&hdr, b"corrupted", true);
    let n = frame.len();
    frame[n - 1] ^= 0x80;
    // LLP layer (2), MPA (0), CRC error (0x02); no headers copied.
    expect_terminate(side, frame, [0x20, 0x02, 0, 0], &[0, 0], "CRC");
}
