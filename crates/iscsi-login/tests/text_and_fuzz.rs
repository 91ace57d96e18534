//! Full-feature Text negotiation, SendTargets (libiscsi's Simple/Invalid
//! cases), long Text responses, and never-panic properties.

mod common;

use common::*;
use iscsi_login::text::{encode, parse};
use iscsi_login::textneg::{TextContinueError, NO_TAG};
use iscsi_login::{
    negotiate_text, parse_send_targets, send_targets, AuthRequirement, ConnectionParams,
    InitiatorLogin, InitiatorLoginConfig, LoginRequest, LoginResponse, SessionParams, SessionType,
    Stage, TargetLimits, TargetLogin, TextContext, TextResponder, TransportKind,
};
use proptest::prelude::*;

fn normal_session() -> SessionParams {
    SessionParams {
        initiator_name: INITIATOR.into(),
        target_name: Some(TARGET.into()),
        ..SessionParams::default()
    }
}

fn text_request(session: &mut SessionParams, data: &[u8]) -> Vec<u8> {
    let dir = directory(AuthRequirement::None, AuthRequirement::None);
    let ctx = TextContext {
        directory: &dir,
        transport: TransportKind::Tcp,
        our_max_recv_data_segment_length: 65536,
    };
    let mut conn = ConnectionParams::default();
    let pairs = parse(data).unwrap();
    encode(&negotiate_text(&pairs, session, &mut conn, &ctx))
}

#[test]
fn libiscsi_sendtargets_simple_in_normal_session() {
    let mut s = normal_session();
    let out = text_request(&mut s, b"SendTargets=All\0");
    let targets = parse_send_targets(&out).expect("libiscsi-style parse must succeed");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0].name, TARGET);
    assert_eq!(targets[0].addresses.len(), 2);
    assert_eq!(
        out,
        b"TargetName=iqn.2024-01.org.ironsan:disk1\0TargetAddress=192.0.2.10:3260,1\0TargetAddress=[2001:db8::10]:3260,1\0".to_vec()
    );
}

#[test]
fn libiscsi_sendtargets_invalid_cases_fail_then_valid_succeeds() {
    let mut s = normal_session();
    for bad in [
        &b"SendTargetsPlease=All\0"[..],
        b"SendTargets=Alle\0",
        b"SendTargets=A\0",
        b"sENDtARGETS=aLL\0",
    ] {
        let out = text_request(&mut s, bad);
        assert!(
            parse_send_targets(&out).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        text_request(&mut s, b"SendTargetsPlease=All\0"),
        b"SendTargetsPlease=NotUnderstood\0"
    );
    assert_eq!(
        text_request(&mut s, b"SendTargets=Alle\0"),
        b"SendTargets=Reject\0"
    );
    assert_eq!(
        text_request(&mut s, b"SendTargets=A\0"),
        b"SendTargets=Reject\0"
    );
    assert!(parse_send_targets(&text_request(&mut s, b"SendTargets=All\0")).is_ok());
}

#[test]
fn sendtargets_in_discovery_lists_allowed_targets() {
    let dir = directory(AuthRequirement::None, AuthRequirement::None);
    let all = send_targets("All", &dir, SessionType::Discovery, None, INITIATOR).unwrap();
    let t = parse_send_targets(&encode(&all)).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[1].addresses[0].host, "192.0.2.11");
    assert_eq!(t[1].addresses[0].port, 3261);
    assert_eq!(t[1].addresses[0].tpgt, Some(2));
    assert_eq!(t[0].addresses[1].host, "2001:db8::10");
    // ACL hides disk1 from a stranger.
    let other = send_targets("All", &dir, SessionType::Discovery, None, "iqn.x:stranger").unwrap();
    assert_eq!(parse_send_targets(&encode(&other)).unwrap().len(), 1);
    // A named target, an unknown one, and empty in discovery.
    let one = send_targets(
        "iqn.2024-01.org.ironsan:disk2",
        &dir,
        SessionType::Discovery,
        None,
        INITIATOR,
    )
    .unwrap();
    assert_eq!(one[0].1, "iqn.2024-01.org.ironsan:disk2");
    assert!(
        send_targets("iqn.none", &dir, SessionType::Discovery, None, INITIATOR)
            .unwrap()
            .is_empty()
    );
    assert!(
        send_targets("", &dir, SessionType::Discovery, None, INITIATOR)
            .unwrap()
            .is_empty()
    );
    let cur = send_targets("", &dir, SessionType::Normal, Some(TARGET), INITIATOR).unwrap();
    assert_eq!(cur[0].1, TARGET);
    assert!(send_targets("Alle", &dir, SessionType::Discovery, None, INITIATOR).is_err());
}

#[test]
fn ffp_keys() {
    let mut s = normal_session();
    let dir = directory(AuthRequirement::None, AuthRequirement::None);
    let ctx = TextContext {
        directory: &dir,
        transport: TransportKind::Tcp,
        our_max_recv_data_segment_length: 65536,
    };
    let mut conn = ConnectionParams::default();
    let pairs = parse(b"MaxRecvDataSegmentLength=4096\0MaxBurstLength=512\0InitiatorAlias=h\0X-foo=1\0MaxRecvDataSegmentLength=1024\0").unwrap();
    let out = negotiate_text(&pairs, &mut s, &mut conn, &ctx);
    assert_eq!(
        out,
        vec![
            ("MaxRecvDataSegmentLength".to_string(), "65536".to_string()),
            ("MaxBurstLength".into(), "Reject".into()),
            ("X-foo".into(), "NotUnderstood".into()),
            ("MaxRecvDataSegmentLength".into(), "Reject".into()),
        ]
    );
    assert_eq!(conn.max_send_data_segment_length, 4096);
    assert_eq!(s.initiator_alias.as_deref(), Some("h"));
}

#[test]
fn text_responder_splits_and_checks_ttt() {
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let mut r = TextResponder::new(data.clone(), 4096, 0x55);
    let p = r.first_piece();
    assert!(p.cont && !p.final_ && p.ttt == 0x55 && p.data.len() == 4096);
    assert_eq!(
        r.on_continue(0x56, &[]),
        Err(TextContinueError::WrongTag {
            expected: 0x55,
            got: 0x56
        })
    );
    assert_eq!(r.on_continue(0x55, b"x"), Err(TextContinueError::NotEmpty));
    let mut all = p.data;
    loop {
        let p = r.on_continue(0x55, &[]).unwrap();
        all.extend_from_slice(&p.data);
        if p.final_ {
            assert!(!p.cont);
            assert_eq!(p.ttt, NO_TAG);
            break;
        }
    }
    assert_eq!(all, data);
    assert!(r.is_done());
    assert_eq!(r.on_continue(0x55, &[]), Err(TextContinueError::Finished));
    // A short answer is one final piece.
    let mut r = TextResponder::new(b"A=1\0".to_vec(), 8192, 1);
    let p = r.first_piece();
    assert!(p.final_ && !p.cont && p.ttt == NO_TAG);
}

fn arb_stage() -> impl Strategy<Value = Stage> {
    prop_oneof![
        Just(Stage::Security),
        Just(Stage::Operational),
        Just(Stage::FullFeature)
    ]
}

fn arb_request() -> impl Strategy<Value = LoginRequest> {
    (
        any::<bool>(),
        any::<bool>(),
        arb_stage(),
        arb_stage(),
        0u8..3,
        0u8..2,
        any::<u16>(),
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec(
                prop_oneof![
                    Just("InitiatorName=iqn.2024-01.org.ironsan:host1\0".to_string()),
                    Just(format!("TargetName={TARGET}\0")),
                    Just("AuthMethod=CHAP,None\0".to_string()),
                    Just("CHAP_A=5\0".to_string()),
                    Just("CHAP_N=user\0".to_string()),
                    Just("CHAP_R=0x00\0".to_string()),
                    Just("CHAP_I=1\0".to_string()),
                    Just("CHAP_C=0b\0".to_string()),
                    Just("SessionType=Discovery\0".to_string()),
                    Just("MaxBurstLength=0x\0".to_string()),
                    "[A-Za-z_]{1,12}=[A-Za-z0-9,~]{0,8}\0",
                ],
                0..8
            )
            .prop_map(|v| v.concat().into_bytes()),
        ],
    )
        .prop_map(
            |(transit, cont, csg, nsg, vmax, vmin, tsih, data)| LoginRequest {
                header: iscsi_wire::LoginRequest {
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max: vmax,
                    version_min: vmin,
                    isid: [0x80, 0, 0, 0, 0, 1],
                    tsih: tsih % 3,
                    itt: 1,
                    cid: 0,
                    cmd_sn: 1,
                    exp_stat_sn: 0,
                },
                data,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn text_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        if let Ok(pairs) = parse(&data) {
            // Whatever parses re-encodes to something that parses the same.
            prop_assert_eq!(parse(&encode(&pairs)).unwrap(), pairs);
        }
        let _ = parse_send_targets(&data);
    }

    #[test]
    fn target_never_panics(reqs in proptest::collection::vec(arb_request(), 1..8), chap_on in any::<bool>()) {
        let auth = if chap_on {
            AuthRequirement::Chap { credentials: chap("user", "s"), mutual: Some(chap("t", "m")) }
        } else {
            AuthRequirement::None
        };
        let mut t = TargetLogin::new(target_config(directory(auth, AuthRequirement::None), TargetLimits::default(), TransportKind::Tcp));
        let mut rng = TestRng(5);
        for r in &reqs {
            let s = t.on_request(r, &mut |b: &mut [u8]| rng.fill(b));
            prop_assert!(s.response.data.len() <= 8192);
            prop_assert!(!(s.response.header.transit && s.response.header.cont));
            if s.response.header.transit {
                prop_assert!(r.header.transit, "target transited unasked");
            }
        }
    }

    #[test]
    fn initiator_never_panics(
        resps in proptest::collection::vec((any::<bool>(), any::<bool>(), arb_stage(), arb_stage(), any::<u8>(), any::<u8>(), proptest::collection::vec(any::<u8>(), 0..200)), 1..6),
        discovery in any::<bool>(),
    ) {
        let mut cfg = InitiatorLoginConfig::new(INITIATOR, (!discovery).then(|| TARGET.to_string()));
        cfg.auth = iscsi_login::InitiatorAuth::Chap { credentials: chap("u", "s"), mutual: Some(chap("t", "m")), algorithms: vec![] };
        let mut i = InitiatorLogin::new(cfg);
        let first = i.first_request();
        let mut rng = TestRng(3);
        for (transit, cont, csg, nsg, class, detail, data) in resps {
            let resp = LoginResponse {
                header: iscsi_wire::LoginResponse {
                    transit, cont, csg, nsg, version_max: 0, version_active: 0,
                    isid: first.header.isid, tsih: 1, itt: first.header.itt, stat_sn: 0,
                    exp_cmd_sn: 0, max_cmd_sn: 0, status_class: class % 4, status_detail: detail,
                },
                data,
            };
            if i.on_response(&resp, &mut |b: &mut [u8]| rng.fill(b)).is_err() {
                break;
            }
        }
    }

    #[test]
    fn login_error_display_is_one_line(class in 1u8..4, detail in any::<u8>()) {
        let e = iscsi_login::LoginError::Rejected { status: iscsi_login::LoginStatus::new(class, detail), target_address: None };
        let s = e.to_string();
        prop_assert!(s.starts_with("login failed: "));
        prop_assert!(!s.contains('\n'));
    }
}

/// A target may leave unanswered a Boolean key whose result our offer decides (RFC 7143
/// 6.2.1; Linux LIO omits ImmediateData=No and InitialR2T=Yes): the result is our offer, not
/// the key's default.
#[test]
fn unanswered_booleans_decided_by_the_offer_take_the_offer() {
    for (immediate, initial_r2t) in [(false, true), (true, false), (false, false)] {
        let mut cfg = InitiatorLoginConfig::new(INITIATOR, Some(TARGET.to_string()));
        cfg.session.immediate_data = immediate;
        cfg.session.initial_r2t = initial_r2t;
        let mut i = InitiatorLogin::new(cfg);
        let first = i.first_request();
        let offered = String::from_utf8_lossy(&first.data).into_owned();
        assert!(offered.contains(&format!(
            "ImmediateData={}",
            if immediate { "Yes" } else { "No" }
        )));
        // The target answers everything else, and neither of the two keys.
        let mut answer = b"MaxBurstLength=262144\0FirstBurstLength=65536\0MaxConnections=1\0\
MaxOutstandingR2T=1\0DataPDUInOrder=Yes\0DataSequenceInOrder=Yes\0DefaultTime2Wait=2\0\
DefaultTime2Retain=20\0ErrorRecoveryLevel=0\0IFMarker=No\0OFMarker=No\0HeaderDigest=None\0\
DataDigest=None\0MaxRecvDataSegmentLength=8192\0"
            .to_vec();
        if !initial_r2t {
            answer.extend_from_slice(b"InitialR2T=No\0");
        }
        if immediate {
            answer.extend_from_slice(b"ImmediateData=Yes\0");
        }
        let resp = LoginResponse {
            header: iscsi_wire::LoginResponse {
                transit: true,
                cont: false,
                csg: Stage::Operational,
                nsg: Stage::FullFeature,
                version_max: 0,
                version_active: 0,
                isid: first.header.isid,
                tsih: 1,
                itt: first.header.itt,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
                status_class: 0,
                status_detail: 0,
            },
            data: answer,
        };
        let mut rng = TestRng(1);
        match i
            .on_response(&resp, &mut |b: &mut [u8]| rng.fill(b))
            .expect("login completes")
        {
            iscsi_login::InitiatorStep::Complete { session, .. } => {
                assert_eq!(session.immediate_data, immediate, "ImmediateData");
                assert_eq!(session.initial_r2t, initial_r2t, "InitialR2T");
            }
            other => panic!("not complete: {other:?}"),
        }
    }
}
