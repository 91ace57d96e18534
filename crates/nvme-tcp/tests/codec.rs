//! The PDU codec: layouts against hand-written bytes, round trips of every type with and
//! without digests and alignment, the streaming decoder fed in pieces, and each malformed
//! header answered with its fatal error status and field offset.

use bytes::Bytes;
use nvme_tcp::cqe::Cqe;
use nvme_tcp::decoder::{DecodeError, Decoder, DecoderConfig, Role};
use nvme_tcp::pdu::{
    encode, offset, DataHeader, Framing, IcReq, IcResp, Pdu, PduHeader, R2t, TermReq,
};
use nvme_tcp::sqe::{nvm, SglDescriptor, Sqe};
use nvme_tcp::{Fes, Status, StatusCode};
use proptest::prelude::*;

fn decoder(role: Role, framing: Framing) -> Decoder {
    let mut c = DecoderConfig::new(role, 65536, 8192);
    c.framing = framing;
    Decoder::new(c)
}

fn decode_all(d: &mut Decoder, mut bytes: &[u8]) -> Result<Vec<Pdu>, DecodeError> {
    let mut v = Vec::new();
    while let Some(p) = d.decode(&mut bytes)? {
        v.push(p);
    }
    assert!(bytes.is_empty());
    Ok(v)
}

fn fatal(d: &mut Decoder, bytes: &[u8]) -> nvme_tcp::PduError {
    match decode_all(d, bytes) {
        Err(DecodeError::Fatal(e)) => e,
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

#[test]
fn icreq_layout_is_linuxs() {
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: false,
        maxr2t: 0,
    };
    let b = encode(
        &PduHeader::IcReq(ic),
        &[],
        &Framing {
            hdgst: true,
            ddgst: true,
            pda: 3,
        },
    )
    .to_vec();
    assert_eq!(b.len(), 128);
    // type 0, no flags even with digests negotiated, HLEN 128, PDO 0, PLEN 128.
    assert_eq!(&b[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
    assert_eq!(b[11], 1);
    assert!(b[12..].iter().all(|&x| x == 0));
}

#[test]
fn capsule_with_data_pads_to_alignment_and_digests() {
    let mut sqe = Sqe::rw(nvm::WRITE, 7, 1, 0, 1);
    sqe.set_sgl(SglDescriptor::in_capsule(5));
    let f = Framing {
        hdgst: true,
        ddgst: true,
        pda: 7,
    }; // 32-byte alignment
    let e = encode(&PduHeader::CapsuleCmd(sqe), &[b"he", b"llo"], &f);
    let b = e.to_vec();
    assert_eq!(b[1], 0x03);
    assert_eq!(b[2], 72);
    assert_eq!(b[3], 96); // 72 + 4 rounded up to 32
    assert_eq!(b.len(), 96 + 5 + 4);
    assert_eq!(
        u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize,
        b.len()
    );
    assert_eq!(&b[72..76], &digest::crc32c_le_bytes(&b[..72]));
    assert_eq!(&b[96..101], b"hello");
    assert_eq!(&b[101..], &digest::crc32c_le_bytes(b"hello"));
    assert_eq!(e.io_slices().len(), 4);
    let mut d = decoder(Role::Controller, f);
    let pdus = decode_all(&mut d, &b).unwrap();
    assert_eq!(pdus[0].header, PduHeader::CapsuleCmd(sqe));
    assert_eq!(&pdus[0].data[..], b"hello");
}

fn headers() -> Vec<(PduHeader, Vec<u8>)> {
    let d = DataHeader {
        cid: 9,
        ttag: 3,
        offset: 4096,
        last: true,
        success: false,
    };
    let mut c2h = d;
    c2h.ttag = 0;
    c2h.success = true;
    vec![
        (
            PduHeader::IcReq(IcReq {
                pfv: 0,
                hpda: 2,
                hdgst: true,
                ddgst: true,
                maxr2t: 4,
            }),
            vec![],
        ),
        (
            PduHeader::IcResp(IcResp {
                pfv: 0,
                cpda: 0,
                hdgst: false,
                ddgst: true,
                maxh2cdata: 131072,
            }),
            vec![],
        ),
        (
            PduHeader::H2CTermReq(TermReq { fes: 2, fei: 0 }),
            vec![1, 2, 3],
        ),
        (PduHeader::C2HTermReq(TermReq { fes: 1, fei: 4 }), vec![]),
        (
            PduHeader::CapsuleCmd(Sqe::rw(nvm::READ, 1, 1, 99, 8)),
            vec![],
        ),
        (
            PduHeader::CapsuleCmd(Sqe::rw(nvm::WRITE, 2, 1, 99, 1)),
            vec![0xAB; 512],
        ),
        (
            PduHeader::CapsuleResp(Cqe {
                dw0: 1,
                dw1: 2,
                sqhd: 3,
                sqid: 4,
                cid: 5,
                status: Status::error(StatusCode::LBA_OUT_OF_RANGE, true),
            }),
            vec![],
        ),
        (PduHeader::H2CData(d), vec![7; 100]),
        (PduHeader::C2HData(c2h), vec![8; 4096]),
        (
            PduHeader::R2T(R2t {
                cid: 9,
                ttag: 1,
                offset: 0,
                length: 65536,
            }),
            vec![],
        ),
    ]
}

#[test]
fn every_type_round_trips_with_every_framing() {
    for hdgst in [false, true] {
        for ddgst in [false, true] {
            for pda in [0, 1, 31] {
                let f = Framing { hdgst, ddgst, pda };
                for (h, data) in headers() {
                    let role = if h.pdu_type().is_h2c() {
                        Role::Controller
                    } else {
                        Role::Host
                    };
                    let bytes = encode(&h, &[&data], &f).to_vec();
                    // Fed one byte at a time: the decoder never buffers more than the PDU.
                    let mut d = decoder(role, f);
                    let mut got = Vec::new();
                    for i in 0..bytes.len() {
                        let mut one = &bytes[i..i + 1];
                        if let Some(p) = d.decode(&mut one).unwrap() {
                            got.push(p);
                        }
                        assert!(d.buffered() <= bytes.len());
                    }
                    assert_eq!(
                        got,
                        vec![Pdu {
                            header: h.clone(),
                            data: Bytes::from(data.clone())
                        }],
                        "{f:?}"
                    );
                }
            }
        }
    }
}

fn cmd_bytes(f: &Framing) -> Vec<u8> {
    encode(
        &PduHeader::CapsuleCmd(Sqe::rw(nvm::READ, 1, 1, 0, 1)),
        &[],
        f,
    )
    .to_vec()
}

#[test]
fn malformed_headers_name_their_fes_and_offset() {
    let f = Framing::default();
    let mut cases: Vec<(Vec<u8>, Fes, u32)> = Vec::new();
    let good = cmd_bytes(&f);
    let mut b = good.clone();
    b[0] = 0x08; // undefined type
    cases.push((b, Fes::InvalidHeaderField, 0));
    let mut b = good.clone();
    b[0] = 0x05; // CapsuleResp to a controller
    cases.push((b, Fes::InvalidHeaderField, 0));
    let mut b = good.clone();
    b[2] = 24;
    cases.push((b, Fes::InvalidHeaderField, offset::HLEN));
    let mut b = good.clone();
    b[1] = 1; // HDGSTF without header digests
    cases.push((b, Fes::InvalidHeaderField, offset::FLAGS));
    let mut b = good.clone();
    b[1] = 4; // LAST_PDU on a capsule
    cases.push((b, Fes::InvalidHeaderField, offset::FLAGS));
    let mut b = good.clone();
    b[4] = 71; // PLEN shorter than HLEN
    cases.push((b, Fes::InvalidHeaderField, offset::PLEN));
    let mut b = good.clone();
    b[4..8].copy_from_slice(&100u32.to_le_bytes());
    b[3] = 74; // PDO not aligned to 4
    cases.push((b, Fes::InvalidHeaderField, offset::PDO));
    let mut b = good.clone();
    b[4..8].copy_from_slice(&(72 + 9000u32).to_le_bytes());
    b[3] = 72; // in-capsule data over the limit: refused before buffering
    cases.push((b, Fes::R2tLimitExceeded, 0));
    let mut b = encode(
        &PduHeader::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }),
        &[],
        &f,
    )
    .to_vec();
    b[4] = 129;
    cases.push((b, Fes::InvalidHeaderField, offset::PLEN));
    for (i, (bytes, fes, fei)) in cases.into_iter().enumerate() {
        let mut d = decoder(Role::Controller, f);
        let e = fatal(&mut d, &bytes);
        assert_eq!((e.fes, e.fei), (fes, fei), "case {i}: {e}");
        assert!(!e.header.is_empty() && e.header.len() <= 128);
        // Poisoned afterwards.
        let mut more = &good[..];
        assert!(matches!(d.decode(&mut more), Err(DecodeError::Fatal(_))));
    }
}

#[test]
fn a_huge_plen_is_refused_from_the_common_header() {
    let f = Framing::default();
    let mut b = encode(
        &PduHeader::H2CData(DataHeader {
            cid: 1,
            ttag: 0,
            offset: 0,
            last: true,
            success: false,
        }),
        &[&[1; 8]],
        &f,
    )
    .to_vec();
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut d = decoder(Role::Controller, f);
    let mut first = &b[..8];
    assert!(
        matches!(d.decode(&mut first), Err(DecodeError::Fatal(e)) if e.fes == Fes::R2tLimitExceeded)
    );
}

#[test]
fn header_digest_and_datal_errors() {
    let f = Framing {
        hdgst: true,
        ddgst: false,
        pda: 0,
    };
    let mut b = cmd_bytes(&f);
    b[20] ^= 1;
    let e = fatal(&mut decoder(Role::Controller, f), &b);
    assert_eq!(e.fes, Fes::HeaderDigestError);

    let f = Framing::default();
    let mut b = encode(
        &PduHeader::H2CData(DataHeader {
            cid: 1,
            ttag: 0,
            offset: 0,
            last: true,
            success: false,
        }),
        &[&[1; 8]],
        &f,
    )
    .to_vec();
    b[16] = 9;
    let e = fatal(&mut decoder(Role::Controller, f), &b);
    assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, offset::DATAL));
}

#[test]
fn a_data_digest_error_hands_back_the_pdu_and_decoding_goes_on() {
    let f = Framing {
        hdgst: false,
        ddgst: true,
        pda: 0,
    };
    let h = PduHeader::H2CData(DataHeader {
        cid: 4,
        ttag: 1,
        offset: 0,
        last: true,
        success: false,
    });
    let mut b = encode(&h, &[&[5; 16]], &f).to_vec();
    let n = b.len();
    b[n - 5] ^= 0xFF;
    b.extend_from_slice(&cmd_bytes(&f));
    let mut d = decoder(Role::Controller, f);
    let mut input = &b[..];
    match d.decode(&mut input) {
        Err(DecodeError::DataDigest { pdu }) => assert_eq!(pdu.header, h),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(d.decode(&mut input), Ok(Some(p)) if matches!(p.header, PduHeader::CapsuleCmd(_)))
    );
}

#[test]
fn cqe_status_bits() {
    let s = Status {
        phase: true,
        code: StatusCode::COMPARE_FAILURE,
        crd: 2,
        more: true,
        dnr: true,
    };
    let v = s.to_u16();
    assert_eq!(v & 1, 1);
    assert_eq!((v >> 1) & 0xFF, 0x85);
    assert_eq!((v >> 9) & 7, 2);
    assert_eq!(Status::from_u16(v), s);
    assert_eq!(StatusCode::COMPARE_FAILURE.name(), Some("Compare Failure"));
    assert_eq!(
        StatusCode { sct: 0, sc: 0x22 }.to_string(),
        "Transient Transport Error (SCT 0x0, SC 0x22)"
    );
}

fn arb_header() -> impl Strategy<Value = (PduHeader, Vec<u8>)> {
    let data = proptest::collection::vec(any::<u8>(), 1..600);
    prop_oneof![
        (
            any::<u16>(),
            0u8..32,
            any::<bool>(),
            any::<bool>(),
            any::<u32>()
        )
            .prop_map(|(pfv, hpda, hdgst, ddgst, maxr2t)| (
                PduHeader::IcReq(IcReq {
                    pfv,
                    hpda,
                    hdgst,
                    ddgst,
                    maxr2t
                }),
                vec![]
            )),
        (
            any::<[u8; 64]>(),
            proptest::collection::vec(any::<u8>(), 0..600)
        )
            .prop_map(|(s, d)| (PduHeader::CapsuleCmd(Sqe::from_bytes(s)), d)),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            data.clone()
        )
            .prop_map(|(cid, ttag, offset, last, d)| (
                PduHeader::H2CData(DataHeader {
                    cid,
                    ttag,
                    offset,
                    last,
                    success: false
                }),
                d
            )),
        (any::<u16>(), proptest::collection::vec(any::<u8>(), 0..128))
            .prop_map(|(fes, d)| (PduHeader::H2CTermReq(TermReq { fes, fei: 7 }), d)),
    ]
}

proptest! {
    #[test]
    fn host_pdus_round_trip(
        (h, data) in arb_header(),
        hdgst in any::<bool>(), ddgst in any::<bool>(), pda in 0u8..32,
        cut in 1usize..200,
    ) {
        let f = Framing { hdgst, ddgst, pda };
        let bytes = encode(&h, &[&data], &f).to_vec();
        let mut d = decoder(Role::Controller, f);
        let mut got = Vec::new();
        for chunk in bytes.chunks(cut) {
            let mut c = chunk;
            while let Some(p) = d.decode(&mut c).unwrap() {
                got.push(p);
            }
        }
        prop_assert_eq!(got, vec![Pdu { header: h, data: Bytes::from(data) }]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), hdgst in any::<bool>(), ddgst in any::<bool>()) {
        for role in [Role::Controller, Role::Host] {
            let mut d = decoder(role, Framing { hdgst, ddgst, pda: 0 });
            let mut input = &bytes[..];
            for _ in 0..bytes.len() + 1 {
                match d.decode(&mut input) {
                    Ok(Some(_)) | Err(DecodeError::DataDigest { .. }) => {}
                    Ok(None) | Err(DecodeError::Fatal(_)) => break,
                }
            }
        }
    }
}
