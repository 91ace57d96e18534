use super::*;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn decodes_the_rfc_read_command_example() {
    let raw = hex(
        "01c00000 00000000 00000000 00000000 14000000 00000400 00000014 00000018
         28000000 00000000 02000000 00000000",
    );
    let b: [u8; 48] = raw.clone().try_into().unwrap();
    let d = Bhs::decode(&b).unwrap();
    let Bhs::ScsiCommand(c) = &d.bhs else {
        panic!("not a command: {:?}", d.bhs)
    };
    assert!(c.final_ && c.read && !c.write && !c.immediate);
    assert_eq!(c.itt, 0x1400_0000);
    assert_eq!(c.expected_data_len, 0x400);
    assert_eq!(c.cmd_sn, 0x14);
    assert_eq!(c.exp_stat_sn, 0x18);
    assert_eq!(c.cdb[0], 0x28);
    assert_eq!(c.cdb[8], 0x02);
    assert_eq!((d.ahs_len, d.data_len), (0, 0));
    assert_eq!(d.bhs.encode(0, 0).to_vec(), raw);
}

#[test]
fn unknown_opcode_and_reserved_stage_are_errors() {
    let mut b = [0u8; 48];
    b[0] = 0x3b;
    assert_eq!(Bhs::decode(&b).unwrap_err(), WireError::UnknownOpcode(0x3b));
    b[0] = 0x43;
    b[1] = 0x80 | (2 << 2) | 3; // CSG 2 is reserved
    assert!(matches!(Bhs::decode(&b), Err(WireError::InvalidField(_))));
}

#[test]
fn framing_counts_padding_and_digests() {
    let mut b = [0u8; 48];
    b[0] = 0x05;
    b[4] = 2;
    b[5..8].copy_from_slice(&[0, 0, 5]);
    let l = FrameLayout::of(
        &b,
        Digests {
            header: true,
            data: true,
        },
        8192,
    )
    .unwrap();
    assert_eq!(
        (
            l.ahs_len,
            l.header_digest_len,
            l.data_len,
            l.pad_len,
            l.data_digest_len
        ),
        (8, 4, 5, 3, 4)
    );
    assert_eq!(l.total_len(), 48 + 8 + 4 + 8 + 4);
    let l = FrameLayout::of(
        &[0u8; 48],
        Digests {
            header: true,
            data: true,
        },
        8192,
    )
    .unwrap();
    assert_eq!(l.data_digest_len, 0, "no data digest without data");
    b[5..8].copy_from_slice(&[0, 0x20, 1]);
    assert_eq!(
        FrameLayout::of(&b, Digests::default(), 8192),
        Err(WireError::DataTooLong {
            len: 8193,
            limit: 8192
        })
    );
}

#[test]
fn ahs_round_trip_and_extended_cdb() {
    let cdb32: Vec<u8> = (0..32).collect();
    let ahs = vec![
        Ahs::ExtendedCdb(cdb32[16..].to_vec()),
        Ahs::BidiReadLength(4096),
    ];
    let bytes = encode_ahs(&ahs);
    assert_eq!(bytes.len() % 4, 0);
    // 16 CDB bytes + type/len/reserved = 20; bidi = 8.
    assert_eq!(bytes.len(), 20 + 8);
    assert_eq!(&bytes[0..4], &[0, 17, 1, 0]);
    let parsed = parse_ahs(&bytes).unwrap();
    assert_eq!(parsed, ahs);
    let mut cmd_cdb = [0u8; 16];
    cmd_cdb.copy_from_slice(&cdb32[..16]);
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: 1,
        lun: 0,
        itt: 1,
        expected_data_len: 0,
        cmd_sn: 1,
        exp_stat_sn: 1,
        cdb: cmd_cdb,
    };
    assert_eq!(full_cdb(&cmd, &parsed), cdb32);
    assert!(parse_ahs(&[0, 9, 1, 0, 1, 2]).is_err());
    assert!(parse_ahs(&[0, 0, 1, 0]).is_err());
    assert!(parse_ahs(&[0, 1]).is_err());
}

#[test]
fn lun_encoding() {
    assert_eq!(lun_to_wire(0), 0);
    assert_eq!(lun_to_wire(1), 0x0001_0000_0000_0000);
    assert_eq!(lun_to_wire(300), 0x412c_0000_0000_0000);
    for l in [0u16, 1, 7, 255, 256, 300, 16383] {
        assert_eq!(lun_from_wire(lun_to_wire(l)), l);
    }
}

#[test]
fn decode_pdu_reports_truncation_then_succeeds() {
    let pdu = Pdu::new(
        Bhs::NopIn(NopIn {
            itt: 7,
            ttt: RESERVED_TAG,
            stat_sn: 3,
            ..Default::default()
        }),
        Bytes::from_static(b"ping!"),
    );
    let crc = |b: &[u8]| b.iter().fold(0u32, |a, &x| a.rotate_left(5) ^ x as u32);
    let wire = encode_pdu(&pdu, Some(&crc), Some(&crc));
    let digests = Digests {
        header: true,
        data: true,
    };
    assert_eq!(wire.len(), 48 + 4 + 8 + 4);
    for cut in [0, 47, 48, 52, wire.len() - 1] {
        assert!(matches!(
            decode_pdu(&wire[..cut], digests, 8192),
            Err(WireError::Truncated { .. })
        ));
    }
    let d = decode_pdu(&wire, digests, 8192).unwrap();
    assert_eq!(d.consumed, wire.len());
    assert_eq!(d.pdu, pdu);
    assert_eq!(d.header_digest, Some(crc(&wire[..48])));
    assert_eq!(d.data_digest, Some(crc(&wire[52..60])));
}

#[test]
fn stat_sn_rules() {
    let target_ping = Bhs::NopIn(NopIn {
        itt: RESERVED_TAG,
        ttt: 5,
        ..Default::default()
    });
    assert!(!target_ping.advances_stat_sn());
    let answer = Bhs::NopIn(NopIn {
        itt: 5,
        ttt: RESERVED_TAG,
        ..Default::default()
    });
    assert!(answer.advances_stat_sn());
    assert!(!Bhs::R2t(R2t::default()).advances_stat_sn());
    assert!(!Bhs::DataIn(DataIn::default()).advances_stat_sn());
    assert!(Bhs::DataIn(DataIn {
        status_present: true,
        ..Default::default()
    })
    .advances_stat_sn());
}

fn stage() -> impl Strategy<Value = Stage> {
    prop_oneof![
        Just(Stage::Security),
        Just(Stage::Operational),
        Just(Stage::FullFeature)
    ]
}

prop_compose! {
    fn ids()(lun in any::<u64>(), itt in any::<u32>(), a in any::<u32>(), b in any::<u32>(),
             c in any::<u32>(), d in any::<u32>(), e in any::<u32>(), f in any::<u32>())
             -> (u64, u32, u32, u32, u32, u32, u32, u32) { (lun, itt, a, b, c, d, e, f) }
}

fn any_bhs() -> impl Strategy<Value = Bhs> {
    (
        0u8..18,
        ids(),
        any::<[bool; 6]>(),
        any::<u8>(),
        any::<[u8; 16]>(),
        stage(),
        stage(),
        any::<[u8; 6]>(),
        any::<u16>(),
    )
        .prop_map(
            |(which, (lun, itt, a, b, c, d, e, f), fl, byte, cdb, s1, s2, isid, short)| match which
            {
                0 => Bhs::NopOut(NopOut {
                    immediate: fl[0],
                    lun,
                    itt,
                    ttt: a,
                    cmd_sn: b,
                    exp_stat_sn: c,
                }),
                1 => Bhs::ScsiCommand(ScsiCommand {
                    immediate: fl[0],
                    final_: fl[1],
                    read: fl[2],
                    write: fl[3],
                    attr: byte & 7,
                    lun,
                    itt,
                    expected_data_len: a,
                    cmd_sn: b,
                    exp_stat_sn: c,
                    cdb,
                }),
                2 => Bhs::TaskMgmtRequest(TaskMgmtRequest {
                    immediate: fl[0],
                    function: byte & 0x7f,
                    lun,
                    itt,
                    ref_task_tag: a,
                    cmd_sn: b,
                    exp_stat_sn: c,
                    ref_cmd_sn: d,
                    exp_data_sn: e,
                }),
                3 => Bhs::LoginRequest(LoginRequest {
                    transit: fl[0],
                    cont: fl[1],
                    csg: s1,
                    nsg: if fl[0] { s2 } else { Stage::Security },
                    version_max: cdb[0],
                    version_min: cdb[1],
                    isid,
                    tsih: short,
                    itt,
                    cid: (a >> 16) as u16,
                    cmd_sn: b,
                    exp_stat_sn: c,
                }),
                4 => Bhs::TextRequest(TextRequest {
                    immediate: fl[0],
                    final_: fl[1],
                    cont: fl[2],
                    lun,
                    itt,
                    ttt: a,
                    cmd_sn: b,
                    exp_stat_sn: c,
                }),
                5 => Bhs::DataOut(DataOut {
                    final_: fl[0],
                    lun,
                    itt,
                    ttt: a,
                    exp_stat_sn: b,
                    data_sn: c,
                    buffer_offset: d,
                }),
                6 => Bhs::LogoutRequest(LogoutRequest {
                    immediate: fl[0],
                    reason: byte & 0x7f,
                    itt,
                    cid: short,
                    cmd_sn: b,
                    exp_stat_sn: c,
                }),
                7 => Bhs::SnackRequest(SnackRequest {
                    snack_type: byte & 0x0f,
                    lun,
                    itt,
                    ttt: a,
                    exp_stat_sn: b,
                    beg_run: c,
                    run_length: d,
                }),
                8 => Bhs::NopIn(NopIn {
                    lun,
                    itt,
                    ttt: a,
                    stat_sn: b,
                    exp_cmd_sn: c,
                    max_cmd_sn: d,
                }),
                9 => Bhs::ScsiResponse(ScsiResponse {
                    bidi_overflow: fl[0],
                    bidi_underflow: fl[1],
                    overflow: fl[2],
                    underflow: fl[3],
                    response: byte,
                    status: cdb[0],
                    itt,
                    snack_tag: a,
                    stat_sn: b,
                    exp_cmd_sn: c,
                    max_cmd_sn: d,
                    exp_data_sn: e,
                    bidi_read_residual: f,
                    residual: a ^ b,
                }),
                10 => Bhs::TaskMgmtResponse(TaskMgmtResponse {
                    response: byte,
                    itt,
                    stat_sn: a,
                    exp_cmd_sn: b,
                    max_cmd_sn: c,
                }),
                11 => Bhs::LoginResponse(LoginResponse {
                    transit: fl[0],
                    cont: fl[1],
                    csg: s1,
                    nsg: if fl[0] { s2 } else { Stage::Security },
                    version_max: cdb[0],
                    version_active: cdb[1],
                    isid,
                    tsih: short,
                    itt,
                    stat_sn: a,
                    exp_cmd_sn: b,
                    max_cmd_sn: c,
                    status_class: cdb[2],
                    status_detail: cdb[3],
                }),
                12 => Bhs::TextResponse(TextResponse {
                    final_: fl[0],
                    cont: fl[1],
                    lun,
                    itt,
                    ttt: a,
                    stat_sn: b,
                    exp_cmd_sn: c,
                    max_cmd_sn: d,
                }),
                13 => Bhs::DataIn(DataIn {
                    final_: fl[0],
                    ack: fl[1],
                    overflow: fl[2],
                    underflow: fl[3],
                    status_present: fl[4],
                    status: byte,
                    lun,
                    itt,
                    ttt: a,
                    stat_sn: b,
                    exp_cmd_sn: c,
                    max_cmd_sn: d,
                    data_sn: e,
                    buffer_offset: f,
                    residual: a ^ f,
                }),
                14 => Bhs::LogoutResponse(LogoutResponse {
                    response: byte,
                    itt,
                    stat_sn: a,
                    exp_cmd_sn: b,
                    max_cmd_sn: c,
                    time2wait: short,
                    time2retain: (d >> 16) as u16,
                }),
                15 => Bhs::R2t(R2t {
                    lun,
                    itt,
                    ttt: a,
                    stat_sn: b,
                    exp_cmd_sn: c,
                    max_cmd_sn: d,
                    r2t_sn: e,
                    buffer_offset: f,
                    desired_len: a ^ c,
                }),
                16 => Bhs::AsyncMessage(AsyncMessage {
                    lun,
                    stat_sn: a,
                    exp_cmd_sn: b,
                    max_cmd_sn: c,
                    event: byte,
                    vcode: cdb[0],
                    param1: short,
                    param2: (d >> 16) as u16,
                    param3: d as u16,
                }),
                _ => Bhs::Reject(Reject {
                    reason: byte,
                    stat_sn: a,
                    exp_cmd_sn: b,
                    max_cmd_sn: c,
                    data_sn: d,
                }),
            },
        )
}

proptest! {
    #[test]
    fn every_opcode_round_trips(bhs in any_bhs(), ahs_words in 0usize..4, data_len in 0u32..(1 << 24)) {
        let bytes = bhs.encode(ahs_words * 4, data_len);
        let d = Bhs::decode(&bytes).unwrap();
        prop_assert_eq!(&d.bhs, &bhs);
        prop_assert_eq!(d.ahs_len, ahs_words * 4);
        prop_assert_eq!(d.data_len, data_len);
        prop_assert_eq!(Bhs::decode(&bytes).unwrap().bhs.encode(ahs_words * 4, data_len), bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..300), hd: bool, dd: bool) {
        let digests = Digests { header: hd, data: dd };
        let _ = decode_pdu(&buf, digests, 8192);
        if buf.len() >= 48 {
            let head: [u8; 48] = buf[..48].try_into().unwrap();
            let _ = Bhs::decode(&head);
            let _ = FrameLayout::of(&head, digests, 1 << 24);
        }
        let _ = parse_ahs(&buf);
    }
}
