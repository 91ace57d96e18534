//! Engine tests without a network: CDB in, status/sense/data out.

use std::sync::Arc;

use bytes::Bytes;

use crate::command::{Command, NexusId, Residual, Response, TaskAttr};
use crate::config::LunConfig;
use crate::device::{Device, ResetKind};
use crate::status;

const BS: usize = 512;
const BLOCKS: u64 = 2048;

fn device() -> Arc<Device> {
    let d = Device::new(
        "iqn.2024-01.test:t",
        vec![(0, LunConfig::memory(BLOCKS * BS as u64))],
    )
    .unwrap();
    d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
    d.nexus_added(NexusId(2), "iqn.init-b,i,0x2", Bytes::new());
    Arc::new(d)
}

fn cmd(nexus: u64, cdb: &[u8], data_out: &[u8], edtl: u32) -> Command {
    Command {
        nexus: NexusId(nexus),
        lun: 0,
        cdb: Bytes::copy_from_slice(cdb),
        attr: TaskAttr::Simple,
        tag: 1,
        expected_len: edtl,
        read: data_out.is_empty(),
        write: !data_out.is_empty(),
        data_out: Bytes::copy_from_slice(data_out),
        read_buffers: None,
        bidi_read_len: None,
    }
}

fn run(d: &Device, c: Command) -> Response {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(d.execute(c))
}

/// Sense decoded independently of the encoder: (key, asc, ascq, information, field pointer).
#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    key: u8,
    asc: u8,
    ascq: u8,
    info: Option<u64>,
    field: Option<(bool, u16)>,
}

fn decode(r: &Response) -> Decoded {
    assert_eq!(
        r.status,
        status::CHECK_CONDITION,
        "expected CHECK CONDITION, got {r:?}"
    );
    let s = r.sense.as_ref().expect("sense");
    match s[0] & 0x7F {
        0x70 | 0x71 => {
            assert_eq!(s[7] as usize + 8, s.len());
            let sksv = s[15] & 0x80 != 0;
            Decoded {
                key: s[2] & 0x0F,
                asc: s[12],
                ascq: s[13],
                info: (s[0] & 0x80 != 0)
                    .then(|| u32::from_be_bytes([s[3], s[4], s[5], s[6]]) as u64),
                field: sksv.then(|| (s[15] & 0x40 != 0, u16::from_be_bytes([s[16], s[17]]))),
            }
        }
        0x72 | 0x73 => {
            let mut info = None;
            let mut field = None;
            let mut at = 8;
            while at + 2 <= s.len() {
                let (t, l) = (s[at], s[at + 1] as usize);
                if t == 0 {
                    info = Some(u64::from_be_bytes(s[at + 4..at + 12].try_into().unwrap()));
                }
                if t == 2 {
                    field = Some((
                        s[at + 4] & 0x40 != 0,
                        u16::from_be_bytes([s[at + 5], s[at + 6]]),
                    ));
                }
                at += 2 + l;
            }
            Decoded {
                key: s[1] & 0x0F,
                asc: s[2],
                ascq: s[3],
                info,
                field,
            }
        }
        other => panic!("unknown sense response code {other:#x}"),
    }
}

fn read10(lba: u32, n: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

fn write10(lba: u32, n: u16) -> [u8; 10] {
    let mut c = read10(lba, n);
    c[0] = 0x2A;
    c
}

fn read16(lba: u64, n: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}

fn good(r: &Response) {
    assert_eq!(r.status, status::GOOD, "expected GOOD, got {r:?}");
}

#[test]
fn standard_inquiry_fields_and_truncation() {
    let d = device();
    let r = run(&d, cmd(1, &[0x12, 0, 0, 0, 255, 0], &[], 255));
    good(&r);
    let data = &r.data_in;
    assert_eq!(data[0], 0x00);
    assert_eq!(data[2], 0x06);
    assert_eq!(data[3] & 0x0F, 2);
    assert_eq!(data[4] as usize + 5, data.len());
    assert_eq!(&data[8..16], b"IRONSAN ");
    assert!(data[8..36].iter().all(|b| (0x20..0x7F).contains(b)));
    assert_eq!(r.residual, Residual::Underflow(255 - data.len() as u32));
    let r = run(&d, cmd(1, &[0x12, 0, 0, 0, 10, 0], &[], 10));
    assert_eq!(r.data_in.len(), 10);
    assert_eq!(r.residual, Residual::None);
}

#[test]
fn inquiry_page_without_evpd_is_invalid_field_byte_2() {
    let d = device();
    let r = run(&d, cmd(1, &[0x12, 0, 0x80, 0, 255, 0], &[], 255));
    assert_eq!(
        decode(&r),
        Decoded {
            key: 5,
            asc: 0x24,
            ascq: 0,
            info: None,
            field: Some((true, 2))
        }
    );
    let r = run(&d, cmd(1, &[0x12, 1, 0x42, 0, 255, 0], &[], 255));
    assert_eq!((decode(&r).asc, decode(&r).field), (0x24, Some((true, 2))));
}

#[test]
fn vpd_pages_sorted_and_identifiers_stable() {
    let d = device();
    let r = run(&d, cmd(1, &[0x12, 1, 0x00, 0, 255, 0], &[], 255));
    let pages = &r.data_in[4..];
    assert!(pages.windows(2).all(|w| w[0] < w[1]));
    assert!(pages.contains(&0x83) && pages.contains(&0xB0) && pages.contains(&0xB2));
    let r = run(&d, cmd(1, &[0x12, 1, 0x83, 0, 255, 0], &[], 255));
    let id = &r.data_in[4..];
    assert_eq!(id[1] & 0x0F, 3, "first designator is NAA");
    assert_eq!((id[1] >> 4) & 3, 0, "LU association");
    let d2 = device();
    let r2 = run(&d2, cmd(1, &[0x12, 1, 0x83, 0, 255, 0], &[], 255));
    assert_eq!(
        r.data_in, r2.data_in,
        "identifiers derive from target name + LUN"
    );
    let bl = run(&d, cmd(1, &[0x12, 1, 0xB0, 0, 255, 0], &[], 255)).data_in;
    assert_eq!(u16::from_be_bytes([bl[2], bl[3]]), 0x3C);
    assert!(
        u32::from_be_bytes(bl[20..24].try_into().unwrap()) > 0,
        "max unmap LBA count with LBPU"
    );
}

#[test]
fn read_capacity_10_and_16() {
    let d = device();
    let r = run(&d, cmd(1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8));
    assert_eq!(&r.data_in[..], &[0, 0, 0x07, 0xFF, 0, 0, 2, 0]);
    let mut c = [0u8; 16];
    c[0] = 0x9E;
    c[1] = 0x10;
    c[13] = 32;
    let r = run(&d, cmd(1, &c, &[], 32));
    assert_eq!(
        u64::from_be_bytes(r.data_in[0..8].try_into().unwrap()),
        BLOCKS - 1
    );
    assert_eq!(r.data_in[14] & 0xC0, 0xC0, "LBPME and LBPRZ");
    c[13] = 8;
    assert_eq!(run(&d, cmd(1, &c, &[], 8)).data_in.len(), 8);
}

#[test]
fn write_read_roundtrip_and_lba_out_of_range() {
    let d = device();
    let data: Vec<u8> = (0..2 * BS).map(|i| (i * 7) as u8).collect();
    good(&run(&d, cmd(1, &write10(100, 2), &data, 1024)));
    let r = run(&d, cmd(1, &read10(100, 2), &[], 1024));
    good(&r);
    assert_eq!(&r.data_in[..], &data[..]);
    for c in [read10(BLOCKS as u32 - 1, 2), read10(u32::MAX, 1)] {
        let r = run(&d, cmd(1, &c, &[], 1024));
        assert_eq!((decode(&r).key, decode(&r).asc), (5, 0x21));
    }
    for lba in [u64::MAX, 1 << 63, BLOCKS + 1] {
        let r = run(&d, cmd(1, &read16(lba, 0), &[], 0));
        assert_eq!(decode(&r).asc, 0x21, "LBA {lba:#x} with 0 blocks");
    }
    good(&run(&d, cmd(1, &read16(0, 0), &[], 0)));
}

#[test]
fn invalid_opcode_and_protect_field() {
    let d = device();
    let r = run(&d, cmd(1, &[0xC7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0));
    assert_eq!(
        (decode(&r).key, decode(&r).asc, decode(&r).ascq),
        (5, 0x20, 0)
    );
    let mut c = read10(0, 1);
    c[1] = 0x20; // RDPROTECT = 1
    let r = run(&d, cmd(1, &c, &[], 512));
    assert_eq!(
        decode(&r),
        Decoded {
            key: 5,
            asc: 0x24,
            ascq: 0,
            info: None,
            field: Some((true, 1))
        }
    );
}

#[test]
fn compare_and_write_matches_and_miscompares_with_offset() {
    let d = device();
    good(&run(&d, cmd(1, &write10(5, 1), &[0xAA; BS], 512)));
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[9] = 5;
    c[13] = 1;
    let mut buf = vec![0xAA; BS];
    buf.extend_from_slice(&[0xBB; BS]);
    good(&run(&d, cmd(1, &c, &buf, 1024)));
    assert_eq!(
        &run(&d, cmd(1, &read10(5, 1), &[], 512)).data_in[..],
        &[0xBB; BS][..]
    );
    let mut wrong = vec![0xBB; BS];
    wrong[77] = 0;
    wrong.extend_from_slice(&[0xCC; BS]);
    let r = run(&d, cmd(1, &c, &wrong, 1024));
    assert_eq!(
        decode(&r),
        Decoded {
            key: 0x0E,
            asc: 0x1D,
            ascq: 0,
            info: Some(77),
            field: None
        }
    );
    assert_eq!(
        &run(&d, cmd(1, &read10(5, 1), &[], 512)).data_in[..],
        &[0xBB; BS][..],
        "no write after miscompare"
    );
    let r = run(&d, cmd(1, &c, &buf[..BS], 512));
    assert_eq!(decode(&r).key, 5, "wrong data-out size");
}

#[test]
fn reserve6_conflict_and_release_on_nexus_loss() {
    let d = device();
    good(&run(&d, cmd(1, &[0x16, 0, 0, 0, 0, 0], &[], 0)));
    let r = run(&d, cmd(2, &read10(0, 1), &[], 512));
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    assert!(r.sense.is_none());
    good(&run(&d, cmd(2, &[0x12, 0, 0, 0, 36, 0], &[], 36)));
    good(&run(&d, cmd(2, &[0x17, 0, 0, 0, 0, 0], &[], 0))); // RELEASE by non-holder: no effect
    assert_eq!(
        run(&d, cmd(2, &read10(0, 1), &[], 512)).status,
        status::RESERVATION_CONFLICT
    );
    d.nexus_removed(NexusId(1));
    good(&run(&d, cmd(2, &read10(0, 1), &[], 512)));
}

#[test]
fn unit_attention_after_lun_reset_reported_once() {
    let d = device();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    assert!(rt.block_on(d.lun_reset(0)));
    // INQUIRY neither reports nor consumes it.
    good(&run(&d, cmd(1, &[0x12, 0, 0, 0, 36, 0], &[], 36)));
    let r = run(&d, cmd(1, &[0, 0, 0, 0, 0, 0], &[], 0));
    assert_eq!(
        (decode(&r).key, decode(&r).asc, decode(&r).ascq),
        (6, 0x29, 0x00)
    );
    good(&run(&d, cmd(1, &[0, 0, 0, 0, 0, 0], &[], 0)));
    // The other nexus gets it through REQUEST SENSE.
    let r = run(&d, cmd(2, &[0x03, 0, 0, 0, 18, 0], &[], 18));
    good(&r);
    assert_eq!(
        (r.data_in[2] & 0x0F, r.data_in[12], r.data_in[13]),
        (6, 0x29, 0x00)
    );
    good(&run(&d, cmd(2, &[0, 0, 0, 0, 0, 0], &[], 0)));
    rt.block_on(d.target_reset(ResetKind::Warm));
    assert_eq!(decode(&run(&d, cmd(2, &[0, 0, 0, 0, 0, 0], &[], 0))).key, 6);
}

#[test]
fn unit_attention_after_capacity_change() {
    let d = device();
    d.set_capacity(0, 1024).unwrap();
    let r = run(&d, cmd(1, &read10(0, 1), &[], 512));
    assert_eq!(
        (decode(&r).key, decode(&r).asc, decode(&r).ascq),
        (6, 0x2A, 0x09)
    );
    let r = run(&d, cmd(1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8));
    assert_eq!(&r.data_in[..4], &1023u32.to_be_bytes());
}

#[test]
fn d_sense_selects_descriptor_format() {
    let d = device();
    // MODE SENSE(6) control page, current values.
    let r = run(&d, cmd(1, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[], 255));
    good(&r);
    let mut page = r.data_in[4..].to_vec();
    assert_eq!(page[0] & 0x3F, 0x0A);
    page[2] |= 0x04;
    let mut param = vec![0u8, 0, 0, 0];
    param.extend_from_slice(&page);
    good(&run(
        &d,
        cmd(
            1,
            &[0x15, 0x10, 0, 0, param.len() as u8, 0],
            &param,
            param.len() as u32,
        ),
    ));
    let r = run(&d, cmd(1, &read16(u64::MAX, 1), &[], 512));
    assert_eq!(r.sense.as_ref().unwrap()[0], 0x72);
    assert_eq!(decode(&r).asc, 0x21);
}

#[test]
fn residuals_follow_spdtl_vs_edtl() {
    let d = device();
    let r = run(&d, cmd(1, &read10(0, 1), &[], 0));
    good(&r);
    assert_eq!((r.data_in.len(), r.residual), (0, Residual::Overflow(512)));
    let r = run(&d, cmd(1, &read10(0, 1), &[], 10000));
    assert_eq!(
        (r.data_in.len(), r.residual),
        (512, Residual::Underflow(10000 - 512))
    );
    let r = run(&d, cmd(1, &read10(0, 1), &[], 200));
    assert_eq!(
        (r.data_in.len(), r.residual),
        (200, Residual::Overflow(312))
    );
    // WRITE(10) of 2 blocks with only 700 bytes expected: 700 bytes written, rest untouched.
    good(&run(&d, cmd(1, &write10(10, 2), &[b'a'; 1024], 1024)));
    let r = run(&d, cmd(1, &write10(10, 2), &[b'b'; 700], 700));
    good(&r);
    assert_eq!(r.residual, Residual::Overflow(324));
    let back = run(&d, cmd(1, &read10(10, 2), &[], 1024)).data_in;
    assert!(back[..700].iter().all(|&b| b == b'b') && back[700..].iter().all(|&b| b == b'a'));
    // WRITE(10) of 1 block with 10000 bytes expected: underflow.
    let r = run(&d, cmd(1, &write10(10, 1), &[b'c'; 10000], 10000));
    assert_eq!(r.residual, Residual::Underflow(10000 - 512));
}

#[test]
fn read_only_lun_is_write_protected() {
    let mut cfg = LunConfig::memory(1 << 20);
    cfg.read_only = true;
    let d = Device::new("iqn.t", vec![(3, cfg)]).unwrap();
    let mut c = cmd(1, &write10(0, 1), &[0; BS], 512);
    c.lun = 3;
    let r = run(&d, c);
    assert_eq!((decode(&r).key, decode(&r).asc), (7, 0x27));
    let mut c = cmd(1, &[0x1A, 0, 0x3F, 0, 255, 0], &[], 255);
    c.lun = 3;
    assert_eq!(run(&d, c).data_in[2] & 0x80, 0x80, "WP bit");
    let mut c = cmd(1, &[0, 0, 0, 0, 0, 0], &[], 0);
    c.lun = 9;
    assert_eq!(
        (decode(&run(&d, c)).asc),
        0x25,
        "LOGICAL UNIT NOT SUPPORTED"
    );
}

#[test]
fn unmap_and_get_lba_status() {
    let d = device();
    good(&run(
        &d,
        cmd(1, &write10(0, 256), &[1u8; 256 * BS], 256 * BS as u32),
    ));
    let mut p = vec![0u8, 22, 0, 16, 0, 0, 0, 0];
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&256u32.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    good(&run(
        &d,
        cmd(1, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p, 24),
    ));
    let back = run(&d, cmd(1, &read10(0, 256), &[], 256 * BS as u32)).data_in;
    assert!(back.iter().all(|&b| b == 0), "LBPRZ");
    let mut c = [0u8; 16];
    c[0] = 0x9E;
    c[1] = 0x12;
    c[13] = 24;
    let r = run(&d, cmd(1, &c, &[], 24));
    good(&r);
    assert_eq!(u64::from_be_bytes(r.data_in[8..16].try_into().unwrap()), 0);
    assert_eq!(r.data_in[20] & 0x0F, 1, "deallocated");
    c[2..10].copy_from_slice(&BLOCKS.to_be_bytes());
    assert_eq!(decode(&run(&d, cmd(1, &c, &[], 24))).asc, 0x21);
}

#[test]
fn persistent_reservation_across_nexuses() {
    let d = device();
    let prout = |sa: u8, t: u8, key: u64, sa_key: u64| {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        (vec![0x5F, sa, t, 0, 0, 0, 0, 0, 24, 0], p)
    };
    let (c, p) = prout(6, 0, 0, 0xA);
    good(&run(&d, cmd(1, &c, &p, 24)));
    let (c, p) = prout(1, 3, 0xA, 0); // EXCLUSIVE ACCESS
    good(&run(&d, cmd(1, &c, &p, 24)));
    assert_eq!(
        run(&d, cmd(2, &read10(0, 1), &[], 512)).status,
        status::RESERVATION_CONFLICT
    );
    good(&run(&d, cmd(2, &[0, 0, 0, 0, 0, 0], &[], 0)));
    // READ KEYS from the other nexus.
    let r = run(&d, cmd(2, &[0x5E, 0, 0, 0, 0, 0, 0, 0, 255, 0], &[], 255));
    assert_eq!(&r.data_in[4..8], &8u32.to_be_bytes());
    assert_eq!(&r.data_in[8..16], &0xAu64.to_be_bytes());
    // Registrations survive I_T nexus loss.
    d.nexus_removed(NexusId(1));
    assert_eq!(
        run(&d, cmd(2, &read10(0, 1), &[], 512)).status,
        status::RESERVATION_CONFLICT
    );
    let r = run(&d, cmd(2, &[0x5E, 4, 0, 0, 0, 0, 0, 0, 255, 0], &[], 255));
    assert_eq!(decode(&r).asc, 0x24);
}

#[test]
fn swp_write_protects_and_verify_detects_mismatch() {
    let d = device();
    let r = run(&d, cmd(1, &[0x1A, 0x08, 0x0A, 0, 255, 0], &[], 255));
    let mut page = r.data_in[4..].to_vec();
    page[4] |= 0x08;
    let mut param = vec![0u8, 0, 0, 0];
    param.extend_from_slice(&page);
    good(&run(
        &d,
        cmd(
            1,
            &[0x15, 0x10, 0, 0, param.len() as u8, 0],
            &param,
            param.len() as u32,
        ),
    ));
    let r = run(&d, cmd(1, &write10(0, 1), &[0; BS], 512));
    assert_eq!(
        (decode(&r).key, decode(&r).asc, decode(&r).ascq),
        (7, 0x27, 0x02)
    );
    page[4] &= !0x08;
    param.truncate(4);
    param.extend_from_slice(&page);
    good(&run(
        &d,
        cmd(
            1,
            &[0x15, 0x10, 0, 0, param.len() as u8, 0],
            &param,
            param.len() as u32,
        ),
    ));
    good(&run(&d, cmd(1, &write10(0, 1), &[9; BS], 512)));
    let mut v = read10(0, 1);
    v[0] = 0x2F;
    v[1] = 0x02; // BYTCHK
    good(&run(&d, cmd(1, &v, &[9; BS], 512)));
    let mut other = [9u8; BS];
    other[300] = 1;
    let r = run(&d, cmd(1, &v, &other, 512));
    assert_eq!(
        (decode(&r).key, decode(&r).asc, decode(&r).info),
        (0x0E, 0x1D, Some(300))
    );
}

#[test]
fn report_supported_opcodes_one_command_flags() {
    let d = device();
    let r = run(
        &d,
        cmd(
            1,
            &[0xA3, 0x0C, 0x01, 0x2A, 0, 0, 0, 0, 1, 0, 0, 0],
            &[],
            256,
        ),
    );
    good(&r);
    assert_eq!(r.data_in[1] & 0x07, 3);
    assert_eq!(r.data_in[4], 0x2A);
    assert_eq!(r.data_in[5] & 0x18, 0x18, "DPO/FUA usage bits");
    // Reporting option 1 for a command with service actions is invalid.
    let r = run(
        &d,
        cmd(
            1,
            &[0xA3, 0x0C, 0x01, 0x9E, 0, 0x10, 0, 0, 1, 0, 0, 0],
            &[],
            256,
        ),
    );
    assert_eq!(decode(&r).asc, 0x24);
}

#[test]
fn concurrent_caw_is_atomic() {
    // Many COMPARE AND WRITEs racing to increment a counter block: exactly one of each
    // pair (same expected value) can win, so the final value equals the number of wins.
    let d = device();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let wins = rt.block_on(async {
        let mut handles = Vec::new();
        for i in 0..40u8 {
            let d = d.clone();
            handles.push(tokio::spawn(async move {
                let mut c = [0u8; 16];
                c[0] = 0x89;
                c[13] = 1;
                let mut buf = vec![i / 2; BS];
                buf.extend_from_slice(&vec![i / 2 + 1; BS]);
                d.execute(cmd(1, &c, &buf, 1024)).await.status == status::GOOD
            }));
        }
        let mut wins = 0;
        for h in handles {
            wins += h.await.unwrap() as u8;
        }
        wins
    });
    let back = run(&d, cmd(1, &read10(0, 1), &[], 512)).data_in;
    assert!(back.iter().all(|&b| b == back[0]));
    assert!((1..=20).contains(&wins));
}

#[test]
fn execute_future_is_send_for_spawning() {
    fn assert_send<T: Send>(_: &T) {}
    let d = device();
    {
        let fut = d.execute(cmd(1, &read10(0, 1), &[], 512));
        assert_send(&fut);
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap()
        .block_on(async move {
            let d2 = d.clone();
            tokio::spawn(async move { d2.execute(cmd(1, &read10(0, 1), &[], 512)).await })
                .await
                .unwrap()
        });
    good(&r);
}

fn caw(lba: u64, n: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = n;
    c
}

fn block_limits(d: &Device) -> Bytes {
    let r = run(d, cmd(1, &[0x12, 0x01, 0xB0, 0, 0xFF, 0], &[], 255));
    good(&r);
    assert_eq!(r.data_in[1], 0xB0);
    r.data_in
}

fn be32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn caw_length_beyond_limit_or_wrapped_to_zero_is_invalid_field_13() {
    let d = device();
    let max = block_limits(&d)[5];
    assert!(max > 0);
    // One block more than MAXIMUM COMPARE AND WRITE LENGTH.
    let n = max + 1;
    let data = vec![0u8; 2 * n as usize * BS];
    let r = run(&d, cmd(1, &caw(0, n), &data, data.len() as u32));
    assert_eq!(
        decode(&r),
        Decoded {
            key: 5,
            asc: 0x24,
            ascq: 0,
            info: None,
            field: Some((true, 13))
        }
    );
    // 256 blocks encoded in the 8-bit field read as 0, but the data-out says 256.
    let data = vec![0u8; 2 * 256 * BS];
    let r = run(&d, cmd(1, &caw(0, 0), &data, data.len() as u32));
    assert_eq!(decode(&r).field, Some((true, 13)));
    assert_eq!((decode(&r).key, decode(&r).asc), (5, 0x24));
    // A real zero-length COMPARE AND WRITE (no data-out) is GOOD.
    good(&run(&d, cmd(1, &caw(0, 0), &[], 0)));
}

fn write_atomic16(lba: u64, boundary: u16, n: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9C;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..12].copy_from_slice(&boundary.to_be_bytes());
    c[12..14].copy_from_slice(&n.to_be_bytes());
    c
}

#[test]
fn write_atomic16_within_advertised_limits_and_field_errors() {
    let d = device();
    let bl = block_limits(&d);
    let max_xfer = be32_at(&bl, 8);
    let max_atomic = be32_at(&bl, 44);
    assert!(max_atomic >= 256, "atomic limit {max_atomic}");
    assert!(max_atomic <= max_xfer);
    assert_eq!(be32_at(&bl, 48), 1, "atomic alignment");
    assert_eq!(be32_at(&bl, 52), 1, "atomic granularity");
    assert_eq!(be32_at(&bl, 60), 0, "no atomic boundaries");
    // 256 blocks at the end of the LUN, then read back.
    let lba = BLOCKS - 256;
    let data: Vec<u8> = (0..256 * BS).map(|i| (i / BS) as u8 ^ 0x5A).collect();
    good(&run(
        &d,
        cmd(1, &write_atomic16(lba, 0, 256), &data, data.len() as u32),
    ));
    let back = run(&d, cmd(1, &read16(lba, 256), &[], data.len() as u32));
    good(&back);
    assert_eq!(&back.data_in[..], &data[..]);
    // A non-zero ATOMIC BOUNDARY: byte 10 of the CDB.
    let r = run(&d, cmd(1, &write_atomic16(0, 1, 1), &[0u8; BS], BS as u32));
    assert_eq!(
        decode(&r),
        Decoded {
            key: 5,
            asc: 0x24,
            ascq: 0,
            info: None,
            field: Some((true, 10))
        }
    );
    // Beyond the LUN: LBA out of range.
    let r = run(
        &d,
        cmd(
            1,
            &write_atomic16(BLOCKS - 1, 0, 2),
            &[0u8; 2 * BS],
            2 * BS as u32,
        ),
    );
    assert_eq!((decode(&r).key, decode(&r).asc), (5, 0x21));
}

#[test]
fn transfers_of_65536_blocks_fit_the_maximum_transfer_length() {
    let blocks = 65536 + 16;
    let d = Device::new(
        "iqn.2024-01.test:t",
        vec![(0, LunConfig::memory(blocks * BS as u64))],
    )
    .unwrap();
    d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
    let max_xfer = be32_at(&block_limits(&d), 8);
    assert!(max_xfer >= 65536, "max transfer {max_xfer}");
    let data = vec![0xFFu8; 65536 * BS];
    let mut w = read16(0, 65536);
    w[0] = 0x8A;
    good(&run(&d, cmd(1, &w, &data, data.len() as u32)));
    let r = run(&d, cmd(1, &read16(0, 65536), &[], data.len() as u32));
    good(&r);
    assert!(r.data_in.iter().all(|&b| b == 0xFF));
    // One block past the advertised maximum: INVALID FIELD IN CDB at the length (byte 10).
    let r = run(&d, cmd(1, &read16(0, max_xfer + 1), &[], 0));
    assert_eq!(decode(&r).field, Some((true, 10)));
}

/// The LUN's NAA designator from its Device Identification VPD page, as an initiator
/// builds an identification CSCD descriptor from it.
fn naa_designator(d: &Device) -> Vec<u8> {
    naa_designator_of(d, 0)
}

fn naa_designator_of(d: &Device, lun: u64) -> Vec<u8> {
    let mut c = cmd(1, &[0x12, 0x01, 0x83, 0, 0xFF, 0], &[], 255);
    c.lun = lun;
    let r = run(d, c);
    good(&r);
    let page = &r.data_in[4..];
    let mut at = 0;
    while at + 4 <= page.len() {
        let len = page[at + 3] as usize;
        if page[at + 1] & 0x0F == 3 {
            return page[at..at + 4 + len].to_vec();
        }
        at += 4 + len;
    }
    panic!("no NAA designator in VPD 0x83");
}

fn cscd_ident(designator: &[u8]) -> [u8; 32] {
    let mut c = [0u8; 32];
    c[0] = 0xE4;
    c[4..4 + designator.len()].copy_from_slice(designator);
    c[29..32].copy_from_slice(&(BS as u32).to_be_bytes()[1..]);
    c
}

fn seg_b2b(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> [u8; 28] {
    let mut s = [0u8; 28];
    s[0] = 0x02;
    s[2..4].copy_from_slice(&24u16.to_be_bytes());
    s[4..6].copy_from_slice(&src.to_be_bytes());
    s[6..8].copy_from_slice(&dst.to_be_bytes());
    s[10..12].copy_from_slice(&blocks.to_be_bytes());
    s[12..20].copy_from_slice(&src_lba.to_be_bytes());
    s[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    s
}

fn xcopy_params(list_id: u8, usage: u8, cscds: &[[u8; 32]], segs: &[&[u8]]) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    let seg_len: usize = segs.iter().map(|s| s.len()).sum();
    p[2..4].copy_from_slice(&((cscds.len() * 32) as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(seg_len as u32).to_be_bytes());
    for c in cscds {
        p.extend_from_slice(c);
    }
    for s in segs {
        p.extend_from_slice(s);
    }
    p
}

fn xcopy(params: &[u8]) -> Command {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
    cmd(1, &c, params, params.len() as u32)
}

fn sense_code(r: &Response) -> (u8, u8, u8) {
    let s = decode(r);
    (s.key, s.asc, s.ascq)
}

#[test]
fn extended_copy_block_to_block_and_copy_status() {
    let d = device();
    let inq = run(&d, cmd(1, &[0x12, 0, 0, 0, 96, 0], &[], 96));
    assert_eq!(inq.data_in[5] & 0x08, 0x08, "3PC bit");
    let data: Vec<u8> = (0..16 * BS).map(|i| (i % 251) as u8).collect();
    good(&run(&d, cmd(1, &write10(10, 16), &data, data.len() as u32)));
    let tgt = cscd_ident(&naa_designator(&d));
    let seg = seg_b2b(0, 0, 16, 10, 1000);
    good(&run(&d, xcopy(&xcopy_params(7, 0, &[tgt], &[&seg]))));
    let r = run(&d, cmd(1, &read10(1000, 16), &[], data.len() as u32));
    assert_eq!(&r.data_in[..], &data[..], "copied blocks read back");
    // RECEIVE COPY RESULTS / COPY STATUS for list 7: completed, 1 segment, 8 KiB.
    let rcr = |list: u8| {
        let mut c = [0u8; 16];
        c[0] = 0x84;
        c[2] = list;
        c[10..14].copy_from_slice(&1024u32.to_be_bytes());
        cmd(1, &c, &[], 1024)
    };
    let r = run(&d, rcr(7));
    good(&r);
    assert_eq!(
        &r.data_in[..],
        &[0, 0, 0, 8, 0x01, 0, 1, 0x01, 0, 0, 0, 8][..]
    );
    // An unknown list identifier: INVALID FIELD IN CDB at byte 2.
    let r = run(&d, rcr(9));
    assert_eq!(decode(&r).field, Some((true, 2)));
    assert_eq!(sense_code(&r), (5, 0x24, 0));
    // OPERATING PARAMETERS: limits and the implemented descriptor types.
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = 0x03;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    let r = run(&d, cmd(1, &c, &[], 1024));
    good(&r);
    let op = &r.data_in;
    assert_eq!(be32_at(op, 0) as usize, op.len() - 4);
    assert_eq!(
        u16::from_be_bytes([op[8], op[9]]),
        8,
        "max CSCD descriptors"
    );
    assert_eq!(
        u16::from_be_bytes([op[10], op[11]]),
        64,
        "max segment descriptors"
    );
    assert_eq!(be32_at(op, 12), 4096, "max descriptor list length");
    assert_eq!(&op[43..], &[2, 0x02, 0xE4][..]);
}

#[test]
fn extended_copy_errors() {
    let d = device();
    let tgt = cscd_ident(&naa_designator(&d));
    let seg = seg_b2b(0, 0, 8, 0, 100);
    // Parameter list shorter than its header says.
    let p = xcopy_params(1, 0, &[tgt], &[&seg]);
    let r = run(&d, xcopy(&p[..p.len() - 1]));
    assert_eq!(sense_code(&r), (5, 0x1A, 0));
    // Nine CSCD descriptors (the limit is 8).
    let r = run(&d, xcopy(&xcopy_params(1, 0, &[tgt; 9], &[&seg])));
    assert_eq!(sense_code(&r), (5, 0x26, 0x06));
    // 65 segment descriptors (the limit is 64).
    let segs: Vec<&[u8]> = (0..65).map(|_| &seg[..]).collect();
    let r = run(&d, xcopy(&xcopy_params(1, 0, &[tgt], &segs)));
    assert_eq!(sense_code(&r), (5, 0x26, 0x08));
    // A Fibre Channel N_Port_Name CSCD descriptor (0xE0).
    let mut fc = tgt;
    fc[0] = 0xE0;
    let r = run(&d, xcopy(&xcopy_params(1, 0, &[fc], &[&seg])));
    assert_eq!(sense_code(&r), (5, 0x26, 0x07));
    // A stream-to-stream segment descriptor (0x03).
    let mut strm = seg;
    strm[0] = 0x03;
    let r = run(&d, xcopy(&xcopy_params(1, 0, &[tgt], &[&strm])));
    assert_eq!(sense_code(&r), (5, 0x26, 0x09));
    // Destination index 1 with one CSCD descriptor: unreachable copy target.
    let r = run(
        &d,
        xcopy(&xcopy_params(1, 0, &[tgt], &[&seg_b2b(0, 1, 8, 0, 100)])),
    );
    assert_eq!(sense_code(&r), (0x0A, 0x08, 0x04));
    // Destination beyond the end of the LUN.
    let r = run(
        &d,
        xcopy(&xcopy_params(
            1,
            0,
            &[tgt],
            &[&seg_b2b(0, 0, 8, 0, BLOCKS - 1)],
        )),
    );
    assert_eq!(sense_code(&r), (0x0A, 0x0D, 0x02));
    // A designator naming no LUN of this target.
    let mut other = naa_designator(&d);
    let last = other.len() - 1;
    other[last] ^= 0xFF;
    let r = run(
        &d,
        xcopy(&xcopy_params(1, 0, &[cscd_ident(&other)], &[&seg])),
    );
    assert_eq!(sense_code(&r), (0x0A, 0x0D, 0x02));
    // A zero-length parameter list is a no-op.
    good(&run(&d, xcopy(&[])));
}

fn sanitize_device(sanitize: bool) -> Arc<Device> {
    let mut cfg = LunConfig::memory(BLOCKS * BS as u64);
    cfg.sanitize = sanitize;
    let d = Device::new("iqn.2024-01.test:t", vec![(0, cfg)]).unwrap();
    d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
    Arc::new(d)
}

fn sanitize_cdb(sa: u8, param_len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x48;
    c[1] = sa;
    c[7..9].copy_from_slice(&param_len.to_be_bytes());
    c
}

/// REPORT SUPPORTED OPERATION CODES, one command with service action: SUPPORT field.
fn rsoc_support(d: &Device, opcode: u8, sa: u16) -> u8 {
    let mut c = [0u8; 12];
    c[0] = 0xA3;
    c[1] = 0x0C;
    c[2] = 0x02;
    c[3] = opcode;
    c[4..6].copy_from_slice(&sa.to_be_bytes());
    c[6..10].copy_from_slice(&64u32.to_be_bytes());
    let r = run(d, cmd(1, &c, &[], 64));
    good(&r);
    r.data_in[1] & 0x07
}

#[test]
fn sanitize_is_offered_only_when_configured() {
    let off = sanitize_device(false);
    assert_eq!(rsoc_support(&off, 0x48, 0x01), 0x01, "not supported");
    let r = run(&off, cmd(1, &sanitize_cdb(0x02, 0), &[], 0));
    assert_eq!(sense_code(&r), (5, 0x20, 0));
    let on = sanitize_device(true);
    for sa in [0x01, 0x02, 0x03, 0x1F] {
        assert_eq!(rsoc_support(&on, 0x48, sa), 0x03, "SA {sa:#x} supported");
    }
    // Block Device Characteristics: WABEREQ = WACEREQ = 01b.
    let r = run(&on, cmd(1, &[0x12, 0x01, 0xB1, 0, 0xFF, 0], &[], 255));
    assert_eq!(r.data_in[7] & 0xF0, 0x50);
}

#[test]
fn sanitize_overwrite_block_erase_and_field_errors() {
    let d = sanitize_device(true);
    good(&run(&d, cmd(1, &write10(0, 1), &[0x11; BS], BS as u32)));
    // OVERWRITE with a 4-byte pattern: every block holds the repeated pattern.
    let mut p = vec![0x01, 0, 0, 4];
    p.extend_from_slice(&[1, 2, 3, 4]);
    good(&run(&d, cmd(1, &sanitize_cdb(0x01, 8), &p, 8)));
    let r = run(&d, cmd(1, &read10(BLOCKS as u32 - 1, 1), &[], BS as u32));
    assert!(r.data_in.chunks(4).all(|c| c == [1, 2, 3, 4]));
    // OVERWRITE COUNT 0: invalid field in the parameter list, byte 0.
    let mut bad = p.clone();
    bad[0] = 0;
    let r = run(&d, cmd(1, &sanitize_cdb(0x01, 8), &bad, 8));
    assert_eq!(decode(&r).field, Some((false, 0)));
    // BLOCK ERASE with a parameter list: INVALID FIELD IN CDB at byte 7.
    let r = run(&d, cmd(1, &sanitize_cdb(0x02, 8), &[0; 8], 8));
    assert_eq!(decode(&r).field, Some((true, 7)));
    assert_eq!(sense_code(&r), (5, 0x24, 0));
    // Reserved bit 6 of byte 1 and reserved bytes 2..7.
    let r = run(&d, cmd(1, &sanitize_cdb(0x02 | 0x40, 0), &[], 0));
    assert_eq!(decode(&r).field, Some((true, 1)));
    let mut c = sanitize_cdb(0x02, 0);
    c[4] = 4;
    let r = run(&d, cmd(1, &c, &[], 0));
    assert_eq!(decode(&r).field, Some((true, 4)));
    // An unknown service action.
    let r = run(&d, cmd(1, &sanitize_cdb(0x05, 0), &[], 0));
    assert_eq!(sense_code(&r), (5, 0x24, 0));
    // BLOCK ERASE deallocates everything: zeroes, and GET LBA STATUS says deallocated.
    good(&run(&d, cmd(1, &sanitize_cdb(0x02, 0), &[], 0)));
    let r = run(&d, cmd(1, &read10(0, 1), &[], BS as u32));
    assert!(r.data_in.iter().all(|&b| b == 0));
    let mut g = [0u8; 16];
    g[0] = 0x9E;
    g[1] = 0x12;
    g[10..14].copy_from_slice(&64u32.to_be_bytes());
    let r = run(&d, cmd(1, &g, &[], 64));
    good(&r);
    assert_eq!(r.data_in[8 + 12], 1, "deallocated");
    assert_eq!(be32_at(&r.data_in, 8 + 8) as u64, BLOCKS);
}

/// A lender that counts what the backend put into its buffers, which note the CRCs of
/// their 4 KiB pieces.
#[derive(Debug, Default)]
struct CountingLender {
    /// Bytes copied and zero-filled, over all of its buffers.
    counts: Arc<std::sync::Mutex<(usize, usize)>>,
}

struct CountingBuf {
    data: Vec<u8>,
    counts: Arc<std::sync::Mutex<(usize, usize)>>,
}

impl storage::ReadBufSource for CountingLender {
    fn lend(&self, len: usize) -> Box<dyn storage::ReadBuf> {
        Box::new(CountingBuf {
            data: Vec::with_capacity(len),
            counts: self.counts.clone(),
        })
    }
}

impl storage::ReadBuf for CountingBuf {
    fn put(&mut self, src: &[u8]) {
        self.counts.lock().unwrap().0 += src.len();
        self.data.extend_from_slice(src);
    }
    fn put_zeros(&mut self, n: usize) {
        self.counts.lock().unwrap().1 += n;
        self.data.resize(self.data.len() + n, 0);
    }
    fn put_bytes(&mut self, data: Bytes) {
        self.put(&data)
    }
    fn len(&self) -> usize {
        self.data.len()
    }
    fn finish(self: Box<Self>) -> (Bytes, Option<storage::BufNote>) {
        let crcs = storage::SegmentCrcs::of(&self.data, 4096);
        let note = storage::BufNote::SegmentCrcs(Arc::new(crcs));
        (Bytes::from(self.data), Some(note))
    }
}

/// A READ with a lent buffer is read into it (the RAM backend copies written blocks and
/// zero-fills the rest straight into the buffer) and its note comes back; a READ cut short
/// by the expected length gets none (it would describe other bytes), nor one without a lender.
#[test]
fn read_fills_the_transports_buffer_when_one_is_lent() {
    let d = device();
    let data: Vec<u8> = (0..16 * BS).map(|i| (i * 7 + i / 512) as u8).collect();
    good(&run(&d, cmd(1, &write10(40, 16), &data, data.len() as u32)));
    let counting = Arc::new(CountingLender::default());
    let lender: Arc<dyn storage::ReadBufSource> = counting.clone();
    let mut c = cmd(1, &read10(38, 20), &[], 20 * BS as u32);
    c.read_buffers = Some(lender.clone());
    let r = run(&d, c);
    good(&r);
    let mut want = vec![0u8; 2 * BS];
    want.extend_from_slice(&data);
    want.extend_from_slice(&[0u8; 2 * BS]);
    assert_eq!(&r.data_in[..], &want[..]);
    let note = r.data_in_note.expect("the lent buffer's note");
    let crcs = storage::SegmentCrcs::of(&want, 4096);
    assert_eq!(note, storage::BufNote::SegmentCrcs(Arc::new(crcs)));
    // Chunks never written are zero-filled without a copy; written ones are copied once.
    let counts = *counting.counts.lock().unwrap();
    assert_eq!(counts.0 + counts.1, 20 * BS);
    assert!(counts.0 >= 16 * BS, "{counts:?}");

    let mut c = cmd(1, &read10(40, 4), &[], 3 * BS as u32);
    c.read_buffers = Some(lender);
    let r = run(&d, c);
    assert_eq!(r.data_in.len(), 3 * BS);
    assert_eq!(r.data_in_note, None, "truncated data carries no note");

    let r = run(&d, cmd(1, &read10(40, 4), &[], 4 * BS as u32));
    assert_eq!(r.data_in_note, None, "no buffer lent");
}

/// An OSD LUN beside a block LUN: INQUIRY says device type 0x11, REPORT LUNS lists both,
/// an OSD command runs bidirectionally (data-out and a retrieved attribute in one command)
/// with both residuals, block commands are refused; a block LUN refuses a bidirectional
/// command.
#[test]
fn object_lun_beside_a_block_lun() {
    let dir = std::env::temp_dir().join(format!("ironsan-scsi-osd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let osd_cfg: LunConfig = toml::from_str(&format!(
        "size = \"64MiB\"\nbackend = {{ type = \"osd\", path = \"{}\" }}",
        dir.display()
    ))
    .unwrap();
    let d = Device::new(
        "iqn.2024-01.test:t",
        vec![(0, LunConfig::memory(BLOCKS * BS as u64)), (2, osd_cfg)],
    )
    .unwrap();
    assert_eq!(d.luns(), vec![0, 2]);
    assert!(d.is_object_lun(2) && !d.is_object_lun(0));
    let on = |lun: u64, mut c: Command| {
        c.lun = lun;
        c
    };
    let inq = run(&d, on(2, cmd(1, &[0x12, 0, 0, 0, 96, 0], &[], 96)));
    assert_eq!((inq.status, inq.data_in[0]), (status::GOOD, 0x11));
    let luns = run(
        &d,
        on(
            2,
            cmd(1, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], &[], 64),
        ),
    );
    assert_eq!(luns.data_in[3], 16, "two LUNs listed");
    let rc = run(
        &d,
        on(2, cmd(1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8)),
    );
    assert_eq!(decode(&rc).asc, 0x20, "READ CAPACITY is not an OSD command");

    let osd_cmd = |r: &osd::client::Request| {
        let mut c = on(
            2,
            cmd(1, &r.cdb.encode(), &r.data_out, r.data_out.len() as u32),
        );
        if r.data_out.is_empty() {
            c.expected_len = r.data_in_len;
            c.read = r.data_in_len > 0;
        } else if r.data_in_len > 0 {
            c.read = true;
            c.bidi_read_len = Some(r.data_in_len);
        }
        run(&d, c)
    };
    assert_eq!(osd_cmd(&osd::client::create_partition(0x10000)).status, 0);
    assert_eq!(osd_cmd(&osd::client::create(0x10000, 0x10000, 1)).status, 0);
    let ids = [osd::attr::AttrId {
        page: osd::attr::page::USER_INFO,
        number: osd::attr::number::LOGICAL_LENGTH,
    }];
    let w = osd::client::write(0x10000, 0x10000, 0, &[9; 3000]).get_list(&ids, 64);
    let r = osd_cmd(&w);
    assert_eq!(r.status, status::GOOD);
    let at = w.retrieved_at().unwrap();
    let got = osd::client::parse_retrieved(&r.data_in, at).unwrap();
    assert_eq!(got[0].value.as_deref(), Some(&3000u64.to_be_bytes()[..]));
    assert_eq!(r.residual, Residual::None);
    // Filled up to the end of the retrieved list, by the list's own length (bytes 4..8).
    let list_len = u32::from_be_bytes(r.data_in[at + 4..at + 8].try_into().unwrap());
    let filled = at as u32 + 8 + list_len;
    assert!(filled < w.data_in_len);
    assert_eq!(
        r.bidi_read_residual,
        Some(Residual::Underflow(w.data_in_len - filled))
    );
    // A missing object: descriptor sense, INVALID FIELD IN CDB.
    let r = osd_cmd(&osd::client::read(0x10000, 0x99999, 0, 16));
    assert_eq!(r.status, status::CHECK_CONDITION);
    let sense = r.sense.unwrap();
    assert_eq!(
        (sense[0], sense[1] & 0xF, sense[2], sense[3]),
        (0x72, 5, 0x24, 0)
    );

    let mut bidi = cmd(1, &[0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[0; 512], 512);
    bidi.read = true;
    bidi.bidi_read_len = Some(512);
    let r = run(&d, bidi);
    assert_eq!(decode(&r).asc, 0x20);
    assert_eq!(r.bidi_read_residual, Some(Residual::Underflow(512)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lender whose buffers keep what the read asks them to keep until its data is sent
/// (its range) in `kept`, standing for a peer that does not take its read data.
#[derive(Debug, Default, Clone)]
struct StallingLender {
    kept: Arc<std::sync::Mutex<Vec<storage::Held>>>,
}

struct StallingBuf {
    data: Vec<u8>,
    lender: StallingLender,
}

impl storage::ReadBufSource for StallingLender {
    fn lend(&self, len: usize) -> Box<dyn storage::ReadBuf> {
        Box::new(StallingBuf {
            data: Vec::with_capacity(len),
            lender: self.clone(),
        })
    }
}

impl storage::ReadBuf for StallingBuf {
    fn put(&mut self, src: &[u8]) {
        self.data.extend_from_slice(src);
    }
    fn put_zeros(&mut self, n: usize) {
        self.data.resize(self.data.len() + n, 0);
    }
    fn put_bytes(&mut self, data: Bytes) {
        self.put(&data)
    }
    fn keep_until_sent(&mut self, hold: storage::Held) {
        self.lender.kept.lock().unwrap().push(hold);
    }
    fn len(&self) -> usize {
        self.data.len()
    }
    fn finish(self: Box<Self>) -> (Bytes, Option<storage::BufNote>) {
        (Bytes::from(self.data), None)
    }
}

/// LUNs 0 and 1 on RAM, nexuses 1 and 2.
fn two_lun_device() -> Arc<Device> {
    let luns = (0..2)
        .map(|l| (l, LunConfig::memory(BLOCKS * BS as u64)))
        .collect();
    let d = Device::new("iqn.2024-01.test:t", luns).unwrap();
    d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
    d.nexus_added(NexusId(2), "iqn.init-b,i,0x2", Bytes::new());
    Arc::new(d)
}

fn on_lun(lun: u64, tag: u64, attr: TaskAttr, mut c: Command) -> Command {
    c.lun = lun;
    c.tag = tag;
    c.attr = attr;
    c
}

const PROMPTLY: std::time::Duration = std::time::Duration::from_secs(1);

/// Nexus 1 reads blocks 0..8 of `lun` through `lender`, which keeps the read's range.
async fn read_left_unsent(d: &Device, lun: u64, lender: &StallingLender) {
    let mut c = on_lun(
        lun,
        100,
        TaskAttr::Simple,
        cmd(1, &read10(0, 8), &[], 8 * 512),
    );
    c.read_buffers = Some(Arc::new(lender.clone()));
    let kept_before = lender.kept.lock().unwrap().len();
    good(&tokio::time::timeout(PROMPTLY, d.execute(c)).await.unwrap());
    let kept = lender.kept.lock().unwrap().len();
    assert_eq!(kept, kept_before + 1, "the read keeps its range");
}

/// Starts `c` and checks it is still waiting a while later.
async fn start_stalled(d: &Arc<Device>, c: Command) -> tokio::task::JoinHandle<Response> {
    let d = d.clone();
    let task = tokio::spawn(async move { d.execute(c).await });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !task.is_finished(),
        "the command waits behind the unsent read"
    );
    task
}

/// Nexus 2's WRITE of one block of 0xAB at LBA 4 of `lun`.
fn write_ab(lun: u64, tag: u64) -> Command {
    on_lun(
        lun,
        tag,
        TaskAttr::Simple,
        cmd(2, &write10(4, 1), &[0xAB; BS], BS as u32),
    )
}

async fn ends_aborted(task: tokio::task::JoinHandle<Response>) {
    let r = tokio::time::timeout(PROMPTLY, task)
        .await
        .expect("the aborted task ends within 1 s")
        .unwrap();
    assert!(r.aborted, "{r:?}");
    assert_eq!(r.status, status::TASK_ABORTED);
}

/// Block 4 of `lun` as nexus 1 reads it.
async fn block4(d: &Device, lun: u64) -> Bytes {
    let c = on_lun(
        lun,
        200,
        TaskAttr::Simple,
        cmd(1, &read10(4, 1), &[], BS as u32),
    );
    let r = tokio::time::timeout(PROMPTLY, d.execute(c)).await.unwrap();
    good(&r);
    r.data_in
}

/// A WRITE waiting for a range a read keeps while its data is (never) sent ends as
/// aborted within a second of ABORT TASK, ABORT TASK SET, CLEAR TASK SET or the loss of
/// its nexus, and writes nothing.
#[tokio::test]
async fn a_write_waiting_for_an_unsent_reads_range_ends_when_aborted() {
    for how in [
        "abort task",
        "abort task set",
        "clear task set",
        "nexus loss",
    ] {
        let d = two_lun_device();
        let lender = StallingLender::default();
        read_left_unsent(&d, 0, &lender).await;
        let write = start_stalled(&d, write_ab(0, 5)).await;
        let abort = async {
            match how {
                "abort task" => assert!(d.abort_task(NexusId(2), 5).await),
                "abort task set" => assert_eq!(d.abort_task_set(NexusId(2), 0).await, 1),
                "clear task set" => assert_eq!(d.clear_task_set(0).await, 1),
                _ => d.nexus_removed(NexusId(2)),
            }
        };
        tokio::time::timeout(PROMPTLY, abort)
            .await
            .unwrap_or_else(|_| panic!("{how} returns within 1 s"));
        ends_aborted(write).await;
        assert_eq!(
            &block4(&d, 0).await[..],
            &[0u8; BS][..],
            "{how}: nothing written"
        );
    }
}

/// LUN RESET ends, as aborted, a WRITE waiting for an unsent read's range and an
/// ORDERED task queued behind it, and revokes the read's range so later writes run;
/// LUN 1, with its own unsent read and waiting WRITE, is untouched until its read's
/// data is gone.
#[tokio::test]
async fn lun_reset_frees_a_lun_stalled_by_an_unsent_read_and_no_other() {
    let d = two_lun_device();
    let lender = StallingLender::default();
    read_left_unsent(&d, 0, &lender).await;
    read_left_unsent(&d, 1, &lender).await;
    let write = start_stalled(&d, write_ab(0, 10)).await;
    let tur = on_lun(0, 11, TaskAttr::Ordered, cmd(2, &[0; 6], &[], 0));
    let ordered = start_stalled(&d, tur).await;
    let other_lun = start_stalled(&d, write_ab(1, 12)).await;

    assert!(tokio::time::timeout(PROMPTLY, d.lun_reset(0))
        .await
        .unwrap());
    ends_aborted(write).await;
    ends_aborted(ordered).await;
    // The reset's unit attention first, then the range the unsent read kept is free.
    for nexus in [1, 2] {
        let tur = on_lun(0, 13, TaskAttr::Simple, cmd(nexus, &[0; 6], &[], 0));
        let r = tokio::time::timeout(PROMPTLY, d.execute(tur))
            .await
            .unwrap();
        assert_eq!(sense_code(&r), (6, 0x29, 0));
    }
    good(
        &tokio::time::timeout(PROMPTLY, d.execute(write_ab(0, 14)))
            .await
            .unwrap(),
    );
    assert_eq!(&block4(&d, 0).await[..], &[0xAB; BS][..]);

    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !other_lun.is_finished(),
        "LUN 1 still keeps its read's range"
    );
    lender.kept.lock().unwrap().clear();
    let r = tokio::time::timeout(PROMPTLY, other_lun)
        .await
        .unwrap()
        .unwrap();
    good(&r);
    assert_eq!(&block4(&d, 1).await[..], &[0xAB; BS][..]);
}

/// A device whose LUNs 0 and 1 hold distinct patterns: LUN 0 blocks 10..26 and LUN 1
/// blocks 1000..1016 (both written by nexus 1).
fn two_luns_with_data() -> (Arc<Device>, Vec<u8>, Vec<u8>) {
    let d = two_lun_device();
    let on_lun0: Vec<u8> = (0..16 * BS).map(|i| (i % 251) as u8).collect();
    let on_lun1 = vec![0x5A; 16 * BS];
    good(&run(
        &d,
        cmd(1, &write10(10, 16), &on_lun0, on_lun0.len() as u32),
    ));
    let mut w = cmd(1, &write10(1000, 16), &on_lun1, on_lun1.len() as u32);
    w.lun = 1;
    good(&run(&d, w));
    (d, on_lun0, on_lun1)
}

/// Nexus 1's EXTENDED COPY (sent to LUN 0) of 16 blocks, list 3 held for COPY STATUS.
fn xcopy_between(d: &Device, from: u64, src_lba: u64, to: u64, dst_lba: u64) -> Response {
    let cscds = [
        cscd_ident(&naa_designator_of(d, from)),
        cscd_ident(&naa_designator_of(d, to)),
    ];
    let seg = seg_b2b(0, 1, 16, src_lba, dst_lba);
    run(d, xcopy(&xcopy_params(3, 0, &cscds, &[&seg])))
}

/// Blocks `lba..lba+16` of `lun` as `nexus` reads them.
fn sixteen_blocks(d: &Device, nexus: u64, lun: u64, lba: u32) -> Bytes {
    let mut c = cmd(nexus, &read10(lba, 16), &[], 16 * BS as u32);
    c.lun = lun;
    let r = run(d, c);
    good(&r);
    r.data_in
}

/// COPY STATUS of nexus 1's list 3: the copy manager status byte.
fn copy_status_of_list3(d: &Device) -> u8 {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[2] = 3;
    c[10..14].copy_from_slice(&64u32.to_be_bytes());
    let r = run(d, cmd(1, &c, &[], 64));
    good(&r);
    r.data_in[4]
}

/// PERSISTENT RESERVE OUT from `nexus` to `lun`: REGISTER key 0xB, then RESERVE `rtype`.
fn register_and_reserve(d: &Device, nexus: u64, lun: u64, rtype: u8) {
    for (sa, t, key, sa_key) in [(0u8, 0u8, 0u64, 0xBu64), (1, rtype, 0xB, 0)] {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        let mut c = cmd(nexus, &[0x5F, sa, t, 0, 0, 0, 0, 0, 24, 0], &p, 24);
        c.lun = lun;
        good(&run(d, c));
    }
}

/// A copy between two LUNs nobody reserved moves the data.
#[test]
fn extended_copy_between_luns_reads_back() {
    let (d, on_lun0, _) = two_luns_with_data();
    good(&xcopy_between(&d, 0, 10, 1, 1000));
    assert_eq!(&sixteen_blocks(&d, 2, 1, 1000)[..], &on_lun0[..]);
    assert_eq!(copy_status_of_list3(&d), 0x01, "completed");
}

/// Nexus 2 holds WRITE EXCLUSIVE on LUN 1: nexus 1's copy into LUN 1 is a
/// RESERVATION CONFLICT, as its WRITE there would be, and LUN 1 is unchanged; a copy
/// out of LUN 1 (a read, which WRITE EXCLUSIVE allows) still works.
#[test]
fn extended_copy_into_a_lun_another_nexus_write_reserved_conflicts() {
    let (d, on_lun0, on_lun1) = two_luns_with_data();
    register_and_reserve(&d, 2, 1, 0x01);
    let r = xcopy_between(&d, 0, 10, 1, 1000);
    assert_eq!(r.status, status::RESERVATION_CONFLICT, "{r:?}");
    assert!(r.sense.is_none());
    assert_eq!(
        &sixteen_blocks(&d, 2, 1, 1000)[..],
        &on_lun1[..],
        "unchanged"
    );
    assert_eq!(copy_status_of_list3(&d), 0x02, "failed");

    good(&xcopy_between(&d, 1, 1000, 0, 10));
    assert_eq!(&sixteen_blocks(&d, 1, 0, 10)[..], &on_lun1[..]);
    assert_ne!(on_lun0, on_lun1);
}

/// Nexus 2 holds RESERVE(6) on LUN 1, which refuses other nexuses' reads: nexus 1's
/// copy out of LUN 1 is a RESERVATION CONFLICT and its destination on LUN 0 unchanged;
/// after RELEASE(6) the same copy works.
#[test]
fn extended_copy_out_of_a_lun_another_nexus_reserved_conflicts() {
    let (d, on_lun0, on_lun1) = two_luns_with_data();
    let mut reserve = cmd(2, &[0x16, 0, 0, 0, 0, 0], &[], 0);
    reserve.lun = 1;
    good(&run(&d, reserve));
    let r = xcopy_between(&d, 1, 1000, 0, 10);
    assert_eq!(r.status, status::RESERVATION_CONFLICT, "{r:?}");
    assert_eq!(&sixteen_blocks(&d, 1, 0, 10)[..], &on_lun0[..], "unchanged");

    let mut release = cmd(2, &[0x17, 0, 0, 0, 0, 0], &[], 0);
    release.lun = 1;
    good(&run(&d, release));
    good(&xcopy_between(&d, 1, 1000, 0, 10));
    assert_eq!(&sixteen_blocks(&d, 1, 0, 10)[..], &on_lun1[..]);
}

/// A copy target whose medium is removed (or that is sanitizing) is not reachable by
/// the copy manager: CHECK CONDITION, COPY ABORTED, COPY TARGET DEVICE NOT REACHABLE,
/// and the destination is unchanged.
#[test]
fn extended_copy_from_a_lun_without_medium_is_copy_aborted() {
    let mut removable = LunConfig::memory(BLOCKS * BS as u64);
    removable.removable = true;
    let luns = vec![(0, LunConfig::memory(BLOCKS * BS as u64)), (1, removable)];
    let d = Device::new("iqn.2024-01.test:t", luns).unwrap();
    d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
    let mut w = cmd(1, &write10(1000, 16), &[0x5A; 16 * BS], 16 * BS as u32);
    w.lun = 1;
    good(&run(&d, w));
    let before = sixteen_blocks(&d, 1, 0, 10);
    assert_ne!(&before[..], &[0x5A; 16 * BS][..]);
    let mut eject = cmd(1, &[0x1B, 0, 0, 0, 0x02, 0], &[], 0);
    eject.lun = 1;
    good(&run(&d, eject));
    let r = xcopy_between(&d, 1, 1000, 0, 10);
    assert_eq!(sense_code(&r), (0x0A, 0x0D, 0x02));
    assert_eq!(sixteen_blocks(&d, 1, 0, 10), before, "unchanged");
}

mod alua;
mod backend_faults;
mod luns;
mod shared_pr;
