//! Target login rules driven with hand-built requests, as libiscsi, open-iscsi
//! and malformed peers send them.

mod common;

use common::*;
use iscsi_login::text::{encode, encode_base64, encode_hex, parse, parse_binary};
use iscsi_login::{
    chap, AuthRequirement, ChapAlgorithm, ExistingSession, LoginRequest, LoginState, LoginStatus,
    LoginStep, SessionParams, SessionType, Stage, TargetLimits, TargetLogin, TransportKind,
};

fn req(transit: bool, csg: Stage, nsg: Stage, pairs: &[(&str, &str)]) -> LoginRequest {
    LoginRequest {
        header: iscsi_wire::LoginRequest {
            transit,
            cont: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0x12, 0x34, 0x56],
            tsih: 0,
            itt: 0x11,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        },
        data: encode(pairs),
    }
}

fn target_with(auth: AuthRequirement) -> TargetLogin {
    TargetLogin::new(target_config(
        directory(auth, AuthRequirement::None),
        TargetLimits::default(),
        TransportKind::Tcp,
    ))
}

fn step(t: &mut TargetLogin, r: &LoginRequest) -> LoginStep {
    let mut rng = TestRng(42);
    t.on_request(r, &mut |b: &mut [u8]| rng.fill(b))
}

fn reply(s: &LoginStep) -> Vec<(String, String)> {
    parse(&s.response.data).unwrap()
}

fn value<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

fn status(s: &LoginStep) -> LoginStatus {
    s.response.status()
}

const NAMES: [(&str, &str); 3] = [
    ("InitiatorName", INITIATOR),
    ("TargetName", TARGET),
    ("SessionType", "Normal"),
];

fn op_login(extra: &[(&str, &str)]) -> LoginStep {
    let mut t = target_with(AuthRequirement::None);
    let mut pairs: Vec<(&str, &str)> = NAMES.to_vec();
    pairs.extend_from_slice(extra);
    step(
        &mut t,
        &req(true, Stage::Operational, Stage::FullFeature, &pairs),
    )
}

#[test]
fn first_request_rules() {
    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[("TargetName", TARGET)],
        ),
    );
    assert_eq!(status(&s), LoginStatus::MISSING_PARAMETER);
    assert_eq!(s.state, LoginState::Failed);

    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[("InitiatorName", INITIATOR)],
        ),
    );
    assert_eq!(status(&s), LoginStatus::MISSING_PARAMETER);

    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[("InitiatorName", INITIATOR), ("TargetName", "iqn.nope")],
        ),
    );
    assert_eq!(status(&s), LoginStatus::NOT_FOUND);

    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[
                ("InitiatorName", "iqn.2024-01.org.evil:x"),
                ("TargetName", TARGET),
            ],
        ),
    );
    assert_eq!(status(&s), LoginStatus::AUTHORIZATION_FAILURE);

    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[("InitiatorName", INITIATOR), ("SessionType", "Weird")],
        ),
    );
    assert_eq!(status(&s), LoginStatus::INITIATOR_ERROR);

    // Discovery needs no TargetName and gets no TPGT.
    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[("InitiatorName", INITIATOR), ("SessionType", "Discovery")],
        ),
    );
    assert!(matches!(s.state, LoginState::Complete(_)));
    assert_eq!(value(&reply(&s), "TargetPortalGroupTag"), None);
}

#[test]
fn header_rules() {
    let bad = |f: &dyn Fn(&mut LoginRequest)| {
        let mut t = target_with(AuthRequirement::None);
        let mut r = req(true, Stage::Operational, Stage::FullFeature, &NAMES);
        f(&mut r);
        status(&step(&mut t, &r))
    };
    assert_eq!(bad(&|r| r.header.cont = true), LoginStatus::INITIATOR_ERROR); // T and C
    assert_eq!(
        bad(&|r| r.header.version_min = 1),
        LoginStatus::UNSUPPORTED_VERSION
    );
    assert_eq!(
        bad(&|r| r.header.csg = Stage::FullFeature),
        LoginStatus::INITIATOR_ERROR
    );
    assert_eq!(
        bad(&|r| r.header.nsg = Stage::Operational),
        LoginStatus::INITIATOR_ERROR
    );
    assert_eq!(
        bad(&|r| r.header.nsg = Stage::Security),
        LoginStatus::INITIATOR_ERROR
    );
    assert_eq!(
        bad(&|r| r.data = b"InitiatorName=a\0Junk\0".to_vec()),
        LoginStatus::INITIATOR_ERROR
    );
}

#[test]
fn stage_going_backwards_or_changing_ids_fails() {
    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Security,
            Stage::Operational,
            &[NAMES[0], NAMES[1], ("AuthMethod", "None")],
        ),
    );
    assert!(s.response.header.transit);
    assert_eq!(s.response.header.nsg, Stage::Operational);
    let s = step(&mut t, &req(false, Stage::Security, Stage::Security, &[]));
    assert_eq!(status(&s), LoginStatus::INITIATOR_ERROR);

    let mut t = target_with(AuthRequirement::None);
    step(
        &mut t,
        &req(
            false,
            Stage::Security,
            Stage::Security,
            &[NAMES[0], NAMES[1], ("AuthMethod", "None")],
        ),
    );
    let mut r = req(true, Stage::Security, Stage::Operational, &[]);
    r.header.isid[5] ^= 1;
    assert_eq!(status(&step(&mut t, &r)), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn target_does_not_transit_unasked_and_answers_every_key() {
    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            false,
            Stage::Operational,
            Stage::Operational,
            &[NAMES[0], NAMES[1], ("HeaderDigest", "None,CRC32C")],
        ),
    );
    assert!(!s.response.header.transit);
    let r = reply(&s);
    assert_eq!(value(&r, "HeaderDigest"), Some("None"));
    assert_eq!(value(&r, "TargetPortalGroupTag"), Some("1"));
    assert_eq!(value(&r, "TargetAlias"), Some("disk one"));
    assert_eq!(value(&r, "MaxRecvDataSegmentLength"), Some("262144"));
    let s = step(
        &mut t,
        &req(true, Stage::Operational, Stage::FullFeature, &[]),
    );
    assert!(s.response.header.transit);
    assert_eq!(s.response.header.tsih, 0, "TSIH is the runtime's to fill");
    let LoginState::Complete(o) = s.state else {
        panic!()
    };
    assert_eq!(o.session_type, SessionType::Normal);
    assert_eq!(o.identity().isid, [0x80, 0, 0, 0x12, 0x34, 0x56]);
    assert_eq!(o.connection.max_recv_data_segment_length, 262_144);
}

#[test]
fn key_offered_twice_fails() {
    let s = op_login(&[("MaxBurstLength", "8192"), ("MaxBurstLength", "8192")]);
    assert_eq!(status(&s), LoginStatus::INITIATOR_ERROR);
    let mut t = target_with(AuthRequirement::None);
    step(
        &mut t,
        &req(
            false,
            Stage::Operational,
            Stage::Operational,
            &[NAMES[0], NAMES[1], ("ImmediateData", "Yes")],
        ),
    );
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[("ImmediateData", "No")],
        ),
    );
    assert_eq!(status(&s), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn special_answers() {
    let s = op_login(&[
        ("X-com.example.Foo", "1"),
        ("NoSuchKey", "x"),
        ("MaxBurstLength", "100"),
        ("ImmediateData", "Maybe"),
        ("HeaderDigest", "MD5"),
        ("AuthMethod", "CHAP"),
        ("IFMarker", "No"),
        ("OFMarker", "Yes"),
        ("IFMarkInt", "2048~8192"),
        ("RDMAExtensions", "Yes"),
        ("InitiatorRecvDataSegmentLength", "8192"),
        ("SendTargets", "All"),
        ("TargetAlias", "spoof"),
        ("ErrorRecoveryLevel", "2"),
        ("DefaultTime2Wait", "5000"),
        ("FirstBurstLength", "4096"),
        ("MaxRecvDataSegmentLength", "16777216"),
    ]);
    assert!(matches!(s.state, LoginState::Complete(_)));
    let r = reply(&s);
    assert_eq!(value(&r, "X-com.example.Foo"), Some("NotUnderstood"));
    assert_eq!(value(&r, "NoSuchKey"), Some("NotUnderstood"));
    assert_eq!(value(&r, "MaxBurstLength"), Some("Reject"));
    assert_eq!(value(&r, "ImmediateData"), Some("Reject"));
    assert_eq!(value(&r, "HeaderDigest"), Some("Reject"));
    assert_eq!(value(&r, "AuthMethod"), Some("NotUnderstood"));
    assert_eq!(value(&r, "IFMarker"), Some("No"));
    assert_eq!(value(&r, "OFMarker"), Some("No"));
    assert_eq!(value(&r, "IFMarkInt"), Some("Irrelevant"));
    assert_eq!(value(&r, "RDMAExtensions"), Some("No"), "over TCP");
    assert_eq!(
        value(&r, "InitiatorRecvDataSegmentLength"),
        Some("Irrelevant")
    );
    assert_eq!(value(&r, "SendTargets"), Some("NotUnderstood"));
    assert_eq!(
        value(&r, "TargetAlias"),
        Some("disk one"),
        "ours, not theirs"
    );
    assert_eq!(value(&r, "ErrorRecoveryLevel"), Some("0"));
    assert_eq!(value(&r, "DefaultTime2Wait"), Some("Reject"));
    assert_eq!(value(&r, "FirstBurstLength"), Some("4096"));
    assert_eq!(value(&r, "MaxRecvDataSegmentLength"), Some("Reject"));
    let LoginState::Complete(o) = s.state else {
        panic!()
    };
    assert_eq!(
        o.session.max_burst_length, 262_144,
        "rejected keeps the default"
    );
    assert_eq!(
        o.connection.max_send_data_segment_length, 8192,
        "peer declared nothing valid"
    );
}

#[test]
fn discovery_irrelevant_keys_like_open_iscsi_expects() {
    let mut t = target_with(AuthRequirement::None);
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Discovery"),
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("DefaultTime2Wait", "2"),
                ("DefaultTime2Retain", "0"),
                ("IFMarker", "No"),
                ("OFMarker", "No"),
                ("ErrorRecoveryLevel", "0"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
                ("MaxBurstLength", "16776192"),
                ("FirstBurstLength", "262144"),
                ("MaxConnections", "1"),
                ("MaxOutstandingR2T", "1"),
                ("DataPDUInOrder", "Yes"),
                ("DataSequenceInOrder", "Yes"),
                ("MaxRecvDataSegmentLength", "32768"),
            ],
        ),
    );
    let r = reply(&s);
    for k in [
        "InitialR2T",
        "ImmediateData",
        "MaxBurstLength",
        "FirstBurstLength",
        "MaxConnections",
        "MaxOutstandingR2T",
        "DataPDUInOrder",
        "DataSequenceInOrder",
    ] {
        assert_eq!(value(&r, k), Some("Irrelevant"), "{k}");
    }
    assert_eq!(value(&r, "DefaultTime2Retain"), Some("0"));
    assert_eq!(value(&r, "HeaderDigest"), Some("None"));
    let LoginState::Complete(o) = s.state else {
        panic!()
    };
    assert_eq!(o.target_name, None);
    assert_eq!(o.connection.max_send_data_segment_length, 32768);
}

#[test]
fn iser_keys() {
    let mut t = TargetLogin::new(target_config(
        directory(AuthRequirement::None, AuthRequirement::None),
        TargetLimits {
            iser_recv_data_segment_length: 65536,
            ..TargetLimits::default()
        },
        TransportKind::Iser,
    ));
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Operational,
            Stage::FullFeature,
            &[
                NAMES[0],
                NAMES[1],
                ("RDMAExtensions", "Yes"),
                ("InitiatorRecvDataSegmentLength", "262144"),
                ("TargetRecvDataSegmentLength", "8192"),
                ("HeaderDigest", "CRC32C,None"),
                ("MaxOutstandingUnexpectedPDUs", "1"),
            ],
        ),
    );
    let r = reply(&s);
    assert_eq!(value(&r, "RDMAExtensions"), Some("Yes"));
    assert_eq!(value(&r, "InitiatorRecvDataSegmentLength"), Some("262144"));
    // The initiator's 8192 is its expectation: the target declares its own limit.
    assert_eq!(value(&r, "TargetRecvDataSegmentLength"), Some("65536"));
    assert_eq!(value(&r, "HeaderDigest"), Some("None"));
    assert_eq!(value(&r, "MaxOutstandingUnexpectedPDUs"), Some("Reject"));
    let LoginState::Complete(o) = s.state else {
        panic!()
    };
    assert!(o.session.rdma_extensions);
    assert_eq!(o.connection.target_recv_data_segment_length, 65536);
    assert_eq!(o.connection.initiator_recv_data_segment_length, 262_144);
}

#[test]
fn error_recovery_level_is_the_lower_offer_and_zero_over_iser() {
    for (transport, limit, offered, want) in [
        (TransportKind::Tcp, 1, "2", "1"),
        (TransportKind::Tcp, 2, "1", "1"),
        (TransportKind::Tcp, 0, "2", "0"),
        (TransportKind::Iser, 2, "2", "0"),
    ] {
        let mut t = TargetLogin::new(target_config(
            directory(AuthRequirement::None, AuthRequirement::None),
            TargetLimits {
                error_recovery_level: limit,
                ..TargetLimits::default()
            },
            transport,
        ));
        let mut keys = vec![NAMES[0], NAMES[1], ("ErrorRecoveryLevel", offered)];
        if transport == TransportKind::Iser {
            keys.push(("RDMAExtensions", "Yes"));
        }
        let s = step(
            &mut t,
            &req(true, Stage::Operational, Stage::FullFeature, &keys),
        );
        let r = reply(&s);
        assert_eq!(
            value(&r, "ErrorRecoveryLevel"),
            Some(want),
            "{transport:?} limit {limit} offered {offered}"
        );
        let LoginState::Complete(o) = s.state else {
            panic!()
        };
        assert_eq!(o.session.error_recovery_level.to_string(), want);
    }
}

/// The session the non-leading logins below join: TSIH 7, the ISID `req` sends.
fn existing_session(chap_user: Option<&str>) -> ExistingSession {
    ExistingSession {
        params: SessionParams {
            initiator_name: INITIATOR.into(),
            target_name: Some(TARGET.into()),
            max_burst_length: 65536,
            ..SessionParams::default()
        },
        isid: [0x80, 0, 0, 0x12, 0x34, 0x56],
        chap_user: chap_user.map(str::to_string),
    }
}

fn joining_target(auth: AuthRequirement, existing: ExistingSession) -> TargetLogin {
    let mut c = target_config(
        directory(auth, AuthRequirement::None),
        TargetLimits::default(),
        TransportKind::Tcp,
    );
    c.existing_session = Some(existing);
    TargetLogin::new(c)
}

/// A request of a login joining the session with TSIH 7 on CID 1.
fn joining(mut r: LoginRequest) -> LoginRequest {
    r.header.tsih = 7;
    r.header.cid = 1;
    r
}

#[test]
fn non_leading_connection() {
    let mk = || joining_target(AuthRequirement::None, existing_session(None));
    let mut t = mk();
    let r = joining(req(
        true,
        Stage::Operational,
        Stage::FullFeature,
        &[
            NAMES[0],
            NAMES[1],
            ("MaxBurstLength", "8192"),
            ("HeaderDigest", "CRC32C"),
        ],
    ));
    let s = step(&mut t, &r);
    assert_eq!(s.response.header.tsih, 7);
    let rp = reply(&s);
    assert_eq!(value(&rp, "MaxBurstLength"), Some("Irrelevant"));
    assert_eq!(value(&rp, "HeaderDigest"), Some("CRC32C"));
    let LoginState::Complete(o) = s.state else {
        panic!()
    };
    assert!(!o.leading);
    assert_eq!(o.session.max_burst_length, 65536);
    assert!(o.connection.header_digest);

    let mut t = mk();
    let r = joining(req(
        true,
        Stage::Operational,
        Stage::FullFeature,
        &[("InitiatorName", "iqn.2024-01.org.ironsan:host2"), NAMES[1]],
    ));
    assert_eq!(
        status(&step(&mut t, &r)),
        LoginStatus::CANT_INCLUDE_IN_SESSION
    );
}

#[test]
fn joining_with_another_isid_is_session_does_not_exist() {
    // Same initiator name, target and TSIH, but another ISID: that TSIH names no
    // session of this initiator port (RFC 7143: ISID and TSIH name the session).
    let mut t = joining_target(AuthRequirement::None, existing_session(None));
    let mut r = joining(req(true, Stage::Operational, Stage::FullFeature, &NAMES));
    r.header.isid = [0x80, 0, 0, 0x12, 0x34, 0x57];
    let s = step(&mut t, &r);
    assert_eq!(status(&s), LoginStatus::SESSION_DOES_NOT_EXIST);
    assert_eq!(s.response.status().code(), 0x020a);
    assert_eq!(s.state, LoginState::Failed);
}

/// Runs a joining login through CHAP as `user` with `secret` straight to full feature
/// phase; returns the last step.
fn joining_chap_login(t: &mut TargetLogin, user: &str, secret: &str) -> LoginStep {
    let s = step(
        t,
        &joining(req(
            true,
            Stage::Security,
            Stage::FullFeature,
            &[NAMES[0], NAMES[1], NAMES[2], ("AuthMethod", "CHAP")],
        )),
    );
    assert_eq!(value(&reply(&s), "AuthMethod"), Some("CHAP"));
    let s = step(
        t,
        &joining(req(
            false,
            Stage::Security,
            Stage::FullFeature,
            &[("CHAP_A", "5")],
        )),
    );
    let mut r = joining(answer(&s, user, secret, false));
    r.header.nsg = Stage::FullFeature;
    step(t, &r)
}

#[test]
fn joining_must_authenticate_as_the_sessions_chap_user() {
    let chap_auth = || AuthRequirement::Chap {
        credentials: chap("user", "libiscsi-secret"),
        mutual: None,
    };
    // The CHAP user the session authenticated as: the connection joins.
    let mut t = joining_target(chap_auth(), existing_session(Some("user")));
    let s = joining_chap_login(&mut t, "user", "libiscsi-secret");
    assert!(s.response.status().is_success());
    assert_eq!(s.response.header.tsih, 7);
    let LoginState::Complete(o) = s.state else {
        panic!("joining login did not complete: {:?}", s.response.status())
    };
    assert_eq!(o.chap_user.as_deref(), Some("user"));

    // Authenticated, but as a user other than the session's (or the session had no CHAP):
    // authorization failure, and the connection does not join.
    for session_user in [Some("someone-else"), None] {
        let mut t = joining_target(chap_auth(), existing_session(session_user));
        let s = joining_chap_login(&mut t, "user", "libiscsi-secret");
        assert_eq!(
            status(&s),
            LoginStatus::AUTHORIZATION_FAILURE,
            "session user {session_user:?}"
        );
        assert_eq!(s.state, LoginState::Failed);
    }

    // A session authenticated with CHAP is not joined by a login without it.
    let mut t = joining_target(AuthRequirement::None, existing_session(Some("user")));
    let s = step(
        &mut t,
        &joining(req(true, Stage::Operational, Stage::FullFeature, &NAMES)),
    );
    assert_eq!(status(&s), LoginStatus::AUTHORIZATION_FAILURE);
}

#[test]
fn leading_chap_login_reports_its_user() {
    let mut t = chap_target("user");
    let s = chap_until_challenge(&mut t, "5");
    let mut r = answer(&s, "user", "libiscsi-secret", false);
    r.header.nsg = Stage::FullFeature;
    let LoginState::Complete(o) = step(&mut t, &r).state else {
        panic!("CHAP login did not complete")
    };
    assert_eq!(o.chap_user.as_deref(), Some("user"));
    let LoginState::Complete(o) = op_login(&[]).state else {
        panic!("login without CHAP did not complete")
    };
    assert_eq!(o.chap_user, None);
}

#[test]
fn first_burst_is_clamped_to_max_burst() {
    let s = op_login(&[("MaxBurstLength", "16384"), ("FirstBurstLength", "65536")]);
    let r = reply(&s);
    assert_eq!(value(&r, "FirstBurstLength"), Some("16384"));
    let s = op_login(&[("MaxBurstLength", "16384")]);
    assert_eq!(value(&reply(&s), "FirstBurstLength"), Some("16384"));
    let LoginState::Complete(o) = s.state else {
        panic!()
    };
    assert_eq!(o.session.first_burst_length, 16384);
}

#[test]
fn request_continuation_is_buffered() {
    let mut t = target_with(AuthRequirement::None);
    let full = encode(&[NAMES[0], NAMES[1], ("MaxBurstLength", "65536")]);
    let (a, b) = full.split_at(20); // splits inside a key=value pair
    let mut r1 = req(false, Stage::Operational, Stage::Operational, &[]);
    r1.header.cont = true;
    r1.data = a.to_vec();
    let s = step(&mut t, &r1);
    assert!(s.response.data.is_empty() && !s.response.header.cont && !s.response.header.transit);
    assert_eq!(s.state, LoginState::Continue);
    let mut r2 = req(true, Stage::Operational, Stage::FullFeature, &[]);
    r2.data = b.to_vec();
    let s = step(&mut t, &r2);
    assert_eq!(value(&reply(&s), "MaxBurstLength"), Some("65536"));
    assert!(matches!(s.state, LoginState::Complete(_)));
}

/// The runtime's auth throttle asks for the initiator name and whether CHAP is at stake:
/// neither is told before the first request is whole, even when it comes in two PDUs.
#[test]
fn initiator_name_and_chap_requirement_are_known_once_the_first_request_is_whole() {
    let mut t = chap_target("user");
    assert_eq!(t.initiator_name(), None);
    assert!(!t.requires_chap());
    let full = encode(&[NAMES[0], NAMES[1], ("AuthMethod", "CHAP")]);
    let (a, b) = full.split_at(20);
    let mut r1 = req(false, Stage::Security, Stage::Operational, &[]);
    r1.header.cont = true;
    r1.data = a.to_vec();
    assert_eq!(step(&mut t, &r1).state, LoginState::Continue);
    assert_eq!(t.initiator_name(), None);
    assert!(!t.requires_chap());
    let mut r2 = req(false, Stage::Security, Stage::Operational, &[]);
    r2.data = b.to_vec();
    let s = step(&mut t, &r2);
    assert_eq!(value(&reply(&s), "AuthMethod"), Some("CHAP"));
    assert_eq!(t.initiator_name(), Some(INITIATOR));
    assert!(t.requires_chap());

    let mut t = target_with(AuthRequirement::None);
    step(
        &mut t,
        &req(
            false,
            Stage::Security,
            Stage::Operational,
            &[NAMES[0], NAMES[1], ("AuthMethod", "None")],
        ),
    );
    assert_eq!(t.initiator_name(), Some(INITIATOR));
    assert!(!t.requires_chap());
}

#[test]
fn long_response_is_split_with_c_bit() {
    // 300 unknown keys with 40-byte names: the NotUnderstood answers
    // need more than one 8192-byte PDU.
    let keys: Vec<String> = (0..300)
        .map(|i| format!("X-com.example.k{i:036}"))
        .collect();
    let mut pairs: Vec<(&str, &str)> = NAMES.to_vec();
    for k in &keys {
        pairs.push((k.as_str(), "v"));
    }
    let mut t = target_with(AuthRequirement::None);
    let mut all = Vec::new();
    let mut s = step(
        &mut t,
        &req(true, Stage::Operational, Stage::FullFeature, &pairs),
    );
    let mut pieces = 1;
    while s.response.header.cont {
        assert!(!s.response.header.transit);
        assert!(s.response.data.len() <= 8192);
        assert_eq!(s.state, LoginState::Continue);
        all.extend_from_slice(&s.response.data);
        s = step(
            &mut t,
            &req(false, Stage::Operational, Stage::Operational, &[]),
        );
        pieces += 1;
    }
    all.extend_from_slice(&s.response.data);
    assert!(pieces >= 2);
    assert!(s.response.header.transit);
    assert!(matches!(s.state, LoginState::Complete(_)));
    let r = parse(&all).unwrap();
    assert_eq!(r.iter().filter(|(_, v)| v == "NotUnderstood").count(), 300);
}

/// Walks the libiscsi CHAP exchange by hand: returns the target's
/// challenge step so a test can craft the CHAP_N/CHAP_R request.
fn chap_until_challenge(t: &mut TargetLogin, chap_a: &str) -> LoginStep {
    let s = step(
        t,
        &req(
            true,
            Stage::Security,
            Stage::Operational,
            &[NAMES[0], NAMES[1], NAMES[2], ("AuthMethod", "CHAP,None")],
        ),
    );
    assert!(
        !s.response.header.transit,
        "must stay in security while CHAP runs"
    );
    assert_eq!(value(&reply(&s), "AuthMethod"), Some("CHAP"));
    step(
        t,
        &req(
            false,
            Stage::Security,
            Stage::Operational,
            &[("CHAP_A", chap_a)],
        ),
    )
}

fn chap_target(user: &str) -> TargetLogin {
    target_with(AuthRequirement::Chap {
        credentials: chap(user, "libiscsi-secret"),
        mutual: None,
    })
}

fn answer(s: &LoginStep, user: &str, secret: &str, encode_b64: bool) -> LoginRequest {
    let r = reply(s);
    let alg = ChapAlgorithm::from_code(value(&r, "CHAP_A").unwrap().parse().unwrap()).unwrap();
    let id: u8 = value(&r, "CHAP_I").unwrap().parse().unwrap();
    let c = value(&r, "CHAP_C").unwrap();
    assert!(c.starts_with("0x"), "libiscsi only parses hex challenges");
    let challenge = parse_binary(c).unwrap();
    assert!(challenge.len() >= 16);
    let resp = chap::response(alg, id, secret.as_bytes(), &challenge);
    let rv = if encode_b64 {
        encode_base64(&resp)
    } else {
        encode_hex(&resp)
    };
    req(
        true,
        Stage::Security,
        Stage::Operational,
        &[("CHAP_N", user), ("CHAP_R", &rv)],
    )
}

#[test]
fn libiscsi_chap_simple_and_invalid() {
    // CHAP_A=5,6,7,8: the target picks the first it supports.
    let mut t = chap_target("user");
    let s = chap_until_challenge(&mut t, "5,6,7,8");
    assert_eq!(value(&reply(&s), "CHAP_A"), Some("5"));
    let s = step(&mut t, &answer(&s, "user", "libiscsi-secret", false));
    assert!(s.response.header.transit && s.response.status().is_success());
    assert_eq!(s.response.header.nsg, Stage::Operational);

    // SHA-256 when preferred.
    let mut t = chap_target("user");
    let s = chap_until_challenge(&mut t, "7,5");
    assert_eq!(value(&reply(&s), "CHAP_A"), Some("7"));
    assert!(
        step(&mut t, &answer(&s, "user", "libiscsi-secret", false))
            .response
            .header
            .transit
    );

    for bad in ["56", "", "0x5", "9"] {
        let mut t = chap_target("user");
        let s = chap_until_challenge(&mut t, bad);
        assert_eq!(
            status(&s),
            LoginStatus::AUTHENTICATION_FAILURE,
            "CHAP_A={bad}"
        );
    }

    // Target restricted to SHA-256 refuses an MD5-only initiator.
    let mut t = TargetLogin::new(target_config(
        directory(
            AuthRequirement::Chap {
                credentials: chap("user", "s"),
                mutual: None,
            },
            AuthRequirement::None,
        ),
        TargetLimits {
            chap_algorithms: vec![ChapAlgorithm::Sha256],
            ..TargetLimits::default()
        },
        TransportKind::Tcp,
    ));
    assert_eq!(
        status(&chap_until_challenge(&mut t, "5")),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

#[test]
fn libiscsi_chap_base64_and_oversize() {
    let mut t = chap_target("user");
    let s = chap_until_challenge(&mut t, "5");
    let s = step(&mut t, &answer(&s, "user", "libiscsi-secret", true));
    assert!(s.response.header.transit && s.response.status().is_success());

    let mut t = chap_target("user");
    let s = chap_until_challenge(&mut t, "5");
    let mut r = answer(&s, "user", "libiscsi-secret", true);
    let text = String::from_utf8(r.data.clone()).unwrap();
    r.data = text
        .replace("CHAP_R=0b", "CHAP_R=0bb3ZlcnNpemUK")
        .into_bytes();
    assert_eq!(
        status(&step(&mut t, &r)),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

#[test]
fn libiscsi_hex_and_base64_user_names_compare_literally() {
    for user in ["0x1234abcd", "0XDEADBEEF", "0bdXNlcg==", "0Buser"] {
        let mut t = chap_target(user);
        let s = chap_until_challenge(&mut t, "5");
        let s = step(&mut t, &answer(&s, user, "libiscsi-secret", false));
        assert!(s.response.status().is_success(), "{user}");
    }
    // A hex-looking name must not match its decoded form.
    let mut t = chap_target("0x75736572");
    let s = chap_until_challenge(&mut t, "5");
    let s = step(&mut t, &answer(&s, "user", "libiscsi-secret", false));
    assert_eq!(status(&s), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn chap_failures_are_0201() {
    // Wrong secret, wrong user, garbage response, missing response.
    type Case = Box<dyn Fn(&LoginStep) -> LoginRequest>;
    let cases: Vec<Case> = vec![
        Box::new(|s| answer(s, "user", "wrong", false)),
        Box::new(|s| answer(s, "other", "libiscsi-secret", false)),
        Box::new(|_| {
            req(
                true,
                Stage::Security,
                Stage::Operational,
                &[("CHAP_N", "user"), ("CHAP_R", "0xzz")],
            )
        }),
        Box::new(|_| {
            req(
                true,
                Stage::Security,
                Stage::Operational,
                &[("CHAP_N", "user")],
            )
        }),
        Box::new(|_| req(true, Stage::Security, Stage::Operational, &[])),
    ];
    for (i, case) in cases.iter().enumerate() {
        let mut t = chap_target("user");
        let s = chap_until_challenge(&mut t, "5");
        let s = step(&mut t, &case(&s));
        assert_eq!(status(&s), LoginStatus::AUTHENTICATION_FAILURE, "case {i}");
        assert_eq!(s.state, LoginState::Failed);
    }
    // Skipping authentication.
    let mut t = chap_target("user");
    let s = step(
        &mut t,
        &req(true, Stage::Operational, Stage::FullFeature, &NAMES),
    );
    assert_eq!(status(&s), LoginStatus::AUTHENTICATION_FAILURE);
    let mut t = chap_target("user");
    let s = step(
        &mut t,
        &req(
            true,
            Stage::Security,
            Stage::Operational,
            &[NAMES[0], NAMES[1], ("AuthMethod", "None")],
        ),
    );
    assert_eq!(status(&s), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn mutual_chap_reflection_is_refused() {
    let mut t = target_with(AuthRequirement::Chap {
        credentials: chap("user", "libiscsi-secret"),
        mutual: Some(chap("tgt", "target-secret")),
    });
    let s = chap_until_challenge(&mut t, "5");
    let our_challenge = value(&reply(&s), "CHAP_C").unwrap().to_string();
    let mut r = answer(&s, "user", "libiscsi-secret", false);
    let mut pairs = parse(&r.data).unwrap();
    pairs.push(("CHAP_I".into(), "1".into()));
    pairs.push(("CHAP_C".into(), our_challenge));
    r.data = encode(&pairs);
    assert_eq!(
        status(&step(&mut t, &r)),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

#[test]
fn mutual_chap_answer_is_correct() {
    let mut t = target_with(AuthRequirement::Chap {
        credentials: chap("user", "libiscsi-secret"),
        mutual: Some(chap("tgt", "target-secret")),
    });
    let s = chap_until_challenge(&mut t, "7");
    let mut r = answer(&s, "user", "libiscsi-secret", false);
    let mut pairs = parse(&r.data).unwrap();
    pairs.push(("CHAP_I".into(), "77".into()));
    pairs.push((
        "CHAP_C".into(),
        "0b".to_string() + "AAECAwQFBgcICQoLDA0ODw==",
    ));
    r.data = encode(&pairs);
    let s = step(&mut t, &r);
    assert!(s.response.header.transit);
    let rp = reply(&s);
    assert_eq!(value(&rp, "CHAP_N"), Some("tgt"));
    let got = parse_binary(value(&rp, "CHAP_R").unwrap()).unwrap();
    let want = chap::response(
        ChapAlgorithm::Sha256,
        77,
        b"target-secret",
        &(0u8..16).collect::<Vec<_>>(),
    );
    assert_eq!(got, want);
}

/// A digest the target requires: offered (in any order) it is chosen; refused or never
/// offered, the login ends with an initiator error instead of an unprotected connection.
#[test]
fn required_digest_refused_fails_the_login() {
    let required = |offers: &[(&str, &str)]| {
        let limits = TargetLimits {
            header_digest: iscsi_login::DigestPolicy::Required,
            ..TargetLimits::default()
        };
        let mut t = TargetLogin::new(target_config(
            directory(AuthRequirement::None, AuthRequirement::None),
            limits,
            TransportKind::Tcp,
        ));
        let mut pairs: Vec<(&str, &str)> = NAMES.to_vec();
        pairs.extend_from_slice(offers);
        step(
            &mut t,
            &req(true, Stage::Operational, Stage::FullFeature, &pairs),
        )
    };
    let s = required(&[("HeaderDigest", "None,CRC32C")]);
    assert_eq!(value(&reply(&s), "HeaderDigest"), Some("CRC32C"));
    assert!(matches!(s.state, LoginState::Complete(_)));
    for offers in [&[("HeaderDigest", "None")][..], &[]] {
        let s = required(offers);
        assert_eq!(status(&s), LoginStatus::INITIATOR_ERROR, "{offers:?}");
        assert!(matches!(s.state, LoginState::Failed));
    }
}
