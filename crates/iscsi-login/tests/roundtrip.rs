//! InitiatorLogin against TargetLogin in memory: both sides must agree on
//! every negotiated parameter.

mod common;

use common::*;
use iscsi_login::{
    AuthRequirement, ChapAlgorithm, DesiredSession, DigestPolicy, DigestPreference, InitiatorAuth,
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginError, LoginStatus, SessionType,
    TargetLimits, TargetLogin, TransportKind,
};
use proptest::prelude::*;

fn check_agreement(
    result: RunResult,
) -> (iscsi_login::SessionParams, iscsi_login::ConnectionParams) {
    let RunResult::Ok {
        outcome,
        tsih,
        initiator,
    } = result
    else {
        panic!("login failed: {result:?}");
    };
    let InitiatorStep::Complete {
        tsih: itsih,
        session,
        connection,
        target_portal_group_tag,
    } = *initiator
    else {
        unreachable!()
    };
    assert_eq!(itsih, tsih);
    let mut t = outcome.session.clone();
    let mut i = session.clone();
    // Aliases are one-way declarations; compare the negotiated values.
    t.initiator_alias = None;
    i.initiator_alias = None;
    if t.session_type == SessionType::Discovery {
        // No TargetName, so no TargetPortalGroupTag is declared.
        i.target_portal_group_tag = t.target_portal_group_tag;
    }
    assert_eq!(t, i, "session params differ");
    assert_eq!(
        outcome.connection,
        connection.mirrored(),
        "connection views do not mirror"
    );
    if outcome.session_type == SessionType::Normal {
        assert_eq!(target_portal_group_tag, Some(1));
    }
    assert!(outcome.session.first_burst_length <= outcome.session.max_burst_length);
    (outcome.session.clone(), outcome.connection)
}

fn digest_pref(i: u8) -> DigestPreference {
    [
        DigestPreference::None,
        DigestPreference::Crc32c,
        DigestPreference::PreferCrc32c,
        DigestPreference::PreferNone,
    ][i as usize % 4]
}

fn digest_policy(i: u8) -> DigestPolicy {
    [
        DigestPolicy::Never,
        DigestPolicy::Allowed,
        DigestPolicy::Required,
    ][i as usize % 3]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn both_sides_agree(
        immediate in any::<bool>(), initial_r2t in any::<bool>(),
        t_immediate in any::<bool>(), t_initial_r2t in any::<bool>(),
        mbl in 512u32..4_000_000, fbl in 512u32..4_000_000,
        t_mbl in 512u32..4_000_000, t_fbl in 512u32..4_000_000,
        i_mrdsl in 512u32..16_777_215, t_mrdsl in 512u32..16_777_215,
        mc in 1u16..16, t_mc in 1u16..16, r2t in 1u16..64, t_r2t in 1u16..64,
        t2w in 0u16..3600, t2r in 0u16..3600, tt2w in 0u16..3600, tt2r in 0u16..3600,
        hd in 0u8..4, dd in 0u8..4, thd in 0u8..3, tdd in 0u8..3,
        use_chap in 0u8..3, alg_pref in 0u8..4,
        discovery in any::<bool>(), iser in any::<bool>(), seed in any::<u64>(),
    ) {
        let (t_auth, i_auth) = match use_chap {
            0 => (AuthRequirement::None, InitiatorAuth::None),
            1 => (
                AuthRequirement::Chap { credentials: chap("user", "secret-12345"), mutual: None },
                InitiatorAuth::Chap {
                    credentials: chap("user", "secret-12345"),
                    mutual: None,
                    algorithms: vec![ChapAlgorithm::ALL[alg_pref as usize]],
                },
            ),
            _ => (
                AuthRequirement::Chap {
                    credentials: chap("user", "secret-12345"),
                    mutual: Some(chap("tgt", "target-secret-9")),
                },
                InitiatorAuth::Chap {
                    credentials: chap("user", "secret-12345"),
                    mutual: Some(chap("tgt", "target-secret-9")),
                    algorithms: vec![ChapAlgorithm::ALL[alg_pref as usize], ChapAlgorithm::Md5],
                },
            ),
        };
        let dir = if discovery {
            directory(AuthRequirement::None, t_auth)
        } else {
            directory(t_auth, AuthRequirement::None)
        };
        let limits = TargetLimits {
            max_recv_data_segment_length: t_mrdsl,
            max_burst_length: t_mbl,
            first_burst_length: t_fbl,
            immediate_data: t_immediate,
            initial_r2t: t_initial_r2t,
            max_outstanding_r2t: t_r2t,
            max_connections: t_mc,
            default_time2wait: tt2w,
            default_time2retain: tt2r,
            header_digest: digest_policy(thd),
            data_digest: digest_policy(tdd),
            iser_recv_data_segment_length: t_mrdsl,
            ..TargetLimits::default()
        };
        let transport = if iser { TransportKind::Iser } else { TransportKind::Tcp };
        let mut target = TargetLogin::new(target_config(dir, limits, transport));
        let mut cfg = InitiatorLoginConfig::new(INITIATOR, (!discovery).then(|| TARGET.to_string()));
        cfg.initiator_alias = Some("host one".into());
        cfg.auth = i_auth;
        cfg.header_digest = digest_pref(hd);
        cfg.data_digest = digest_pref(dd);
        cfg.max_recv_data_segment_length = i_mrdsl;
        cfg.transport = transport;
        cfg.session = DesiredSession {
            immediate_data: immediate,
            initial_r2t,
            max_burst_length: mbl,
            first_burst_length: fbl,
            max_connections: mc,
            max_outstanding_r2t: r2t,
            default_time2wait: t2w,
            default_time2retain: t2r,
            error_recovery_level: 0,
        };
        let mut initiator = InitiatorLogin::new(cfg);
        let result = run(&mut initiator, &mut target, seed);
        // A digest the target requires and the initiator will not use fails the login
        // (initiator error); any other digest no side can agree on is answered Reject and
        // both keep None.
        let refused = |pref: u8, policy: u8| {
            digest_policy(policy) == DigestPolicy::Required && digest_pref(pref) == DigestPreference::None
        };
        if !iser && (refused(hd, thd) || refused(dd, tdd)) {
            prop_assert!(!matches!(result, RunResult::Ok { .. }), "login with a required digest refused must fail");
            return Ok(());
        }
        let (s, c) = check_agreement(result);
        if !discovery {
            prop_assert_eq!(s.max_burst_length, mbl.min(t_mbl));
            prop_assert_eq!(s.immediate_data, immediate && t_immediate);
            prop_assert_eq!(s.initial_r2t, initial_r2t || t_initial_r2t);
            prop_assert_eq!(s.max_connections, mc.min(t_mc));
            prop_assert_eq!(s.max_outstanding_r2t, r2t.min(t_r2t));
            prop_assert_eq!(s.rdma_extensions, iser);
        } else {
            prop_assert_eq!(s.session_type, SessionType::Discovery);
            prop_assert_eq!(s.max_burst_length, 262_144);
        }
        prop_assert_eq!(s.default_time2wait, t2w.max(tt2w));
        prop_assert_eq!(s.default_time2retain, t2r.min(tt2r));
        prop_assert_eq!(s.error_recovery_level, 0);
        if !iser || discovery {
            prop_assert_eq!(c.max_send_data_segment_length, i_mrdsl);
            prop_assert_eq!(c.max_recv_data_segment_length, t_mrdsl);
        } else {
            prop_assert!(!c.header_digest && !c.data_digest);
            prop_assert_eq!(c.initiator_recv_data_segment_length, i_mrdsl);
            // The initiator offers Linux's 8192; the target declares its own limit.
            prop_assert_eq!(c.target_recv_data_segment_length, t_mrdsl);
        }
    }
}

#[test]
fn chap_wrong_secret_is_authentication_failure() {
    for alg in [ChapAlgorithm::Md5, ChapAlgorithm::Sha256] {
        let dir = directory(
            AuthRequirement::Chap {
                credentials: chap("user", "right-secret"),
                mutual: None,
            },
            AuthRequirement::None,
        );
        let mut target = TargetLogin::new(target_config(
            dir,
            TargetLimits::default(),
            TransportKind::Tcp,
        ));
        let mut cfg = InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into()));
        cfg.auth = InitiatorAuth::Chap {
            credentials: chap("user", "wrong-secret"),
            mutual: None,
            algorithms: vec![alg],
        };
        let mut initiator = InitiatorLogin::new(cfg);
        match run(&mut initiator, &mut target, 7) {
            RunResult::TargetFailed(status, Err(e)) => {
                assert_eq!(status, LoginStatus::AUTHENTICATION_FAILURE);
                assert_eq!(
                    e.to_string(),
                    "login failed: authentication failure (status 0x0201): check the CHAP user/secret (and the mutual CHAP settings)"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn mutual_chap_wrong_target_secret_fails_on_initiator() {
    let dir = directory(
        AuthRequirement::Chap {
            credentials: chap("user", "secret-12345"),
            mutual: Some(chap("tgt", "target-secret-9")),
        },
        AuthRequirement::None,
    );
    let mut target = TargetLogin::new(target_config(
        dir,
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut cfg = InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into()));
    cfg.auth = InitiatorAuth::Chap {
        credentials: chap("user", "secret-12345"),
        mutual: Some(chap("tgt", "a-different-one")),
        algorithms: vec![ChapAlgorithm::Sha256],
    };
    let mut initiator = InitiatorLogin::new(cfg);
    match run(&mut initiator, &mut target, 9) {
        RunResult::InitiatorFailed(LoginError::MutualChapFailed(_)) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn mutual_chap_requested_but_target_has_no_mutual_secret() {
    let dir = directory(
        AuthRequirement::Chap {
            credentials: chap("user", "secret-12345"),
            mutual: None,
        },
        AuthRequirement::None,
    );
    let mut target = TargetLogin::new(target_config(
        dir,
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut cfg = InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into()));
    cfg.auth = InitiatorAuth::Chap {
        credentials: chap("user", "secret-12345"),
        mutual: Some(chap("tgt", "target-secret-9")),
        algorithms: vec![ChapAlgorithm::Md5],
    };
    let mut initiator = InitiatorLogin::new(cfg);
    match run(&mut initiator, &mut target, 11) {
        RunResult::TargetFailed(s, _) => assert_eq!(s, LoginStatus::AUTHENTICATION_FAILURE),
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_credentials_against_chap_target_fails_0201() {
    let dir = directory(
        AuthRequirement::Chap {
            credentials: chap("user", "secret-12345"),
            mutual: None,
        },
        AuthRequirement::None,
    );
    let mut target = TargetLogin::new(target_config(
        dir,
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut initiator =
        InitiatorLogin::new(InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into())));
    match run(&mut initiator, &mut target, 3) {
        RunResult::TargetFailed(s, Err(LoginError::Rejected { status, .. })) => {
            assert_eq!(s, LoginStatus::AUTHENTICATION_FAILURE);
            assert_eq!(status, s);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn discovery_chap_is_separate_from_target_chap() {
    let dir = directory(
        AuthRequirement::None,
        AuthRequirement::Chap {
            credentials: chap("disc", "discovery-secret"),
            mutual: None,
        },
    );
    // Normal session: no auth needed.
    let mut target = TargetLogin::new(target_config(
        dir.clone(),
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut i = InitiatorLogin::new(InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into())));
    check_agreement(run(&mut i, &mut target, 5));
    // Discovery without CHAP: refused.
    let mut target = TargetLogin::new(target_config(
        dir.clone(),
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut i = InitiatorLogin::new(InitiatorLoginConfig::new(INITIATOR, None));
    assert!(matches!(
        run(&mut i, &mut target, 5),
        RunResult::TargetFailed(LoginStatus::AUTHENTICATION_FAILURE, _)
    ));
    // Discovery with the discovery secret: accepted.
    let mut target = TargetLogin::new(target_config(
        dir,
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut cfg = InitiatorLoginConfig::new(INITIATOR, None);
    cfg.auth = InitiatorAuth::Chap {
        credentials: chap("disc", "discovery-secret"),
        mutual: None,
        algorithms: vec![ChapAlgorithm::Md5],
    };
    let mut i = InitiatorLogin::new(cfg);
    let (s, _) = check_agreement(run(&mut i, &mut target, 5));
    assert_eq!(s.target_name, None);
}

#[test]
fn a_special_reply_to_a_name_key_is_taken_like_lio_joining_a_session() {
    // LIO answers SessionType=NotUnderstood to a connection joining a session (TSIH set).
    let mut target = TargetLogin::new(target_config(
        directory(AuthRequirement::None, AuthRequirement::None),
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut initiator =
        InitiatorLogin::new(InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into())));
    let mut rng = TestRng(3);
    let mut req = initiator.first_request();
    for _ in 0..16 {
        let mut step = target.on_request(&req, &mut |b: &mut [u8]| rng.fill(b));
        step.response
            .data
            .extend_from_slice(b"SessionType=NotUnderstood\0");
        if matches!(step.state, iscsi_login::LoginState::Complete(_)) {
            step.response.header.tsih = 0x1234;
        }
        match initiator.on_response(&step.response, &mut |b: &mut [u8]| rng.fill(b)) {
            Ok(InitiatorStep::Send(next)) => req = next,
            Ok(InitiatorStep::Complete { .. }) => return,
            other => panic!("the login must go on: {other:?}"),
        }
    }
    panic!("login did not finish");
}

#[test]
fn a_restarted_connection_s_login_acknowledges_the_old_statuses_then_the_login_responses() {
    let mut target = TargetLogin::new(target_config(
        directory(AuthRequirement::None, AuthRequirement::None),
        TargetLimits::default(),
        TransportKind::Tcp,
    ));
    let mut cfg = InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into()));
    // The old connection's ExpStatSN (RFC 7143 §11.12.8): valid in the first request only.
    cfg.exp_stat_sn = 41;
    let mut initiator = InitiatorLogin::new(cfg);
    let mut req = initiator.first_request();
    assert_eq!(req.header.exp_stat_sn, 41);
    let mut rng = |b: &mut [u8]| b.fill(7);
    for stat_sn in 77..90 {
        let mut step = target.on_request(&req, &mut rng);
        // The target's runtime numbers its Login Responses and gives the TSIH.
        step.response.header.stat_sn = stat_sn;
        if matches!(step.state, iscsi_login::LoginState::Complete(_)) {
            step.response.header.tsih = 0x1234;
        }
        match initiator.on_response(&step.response, &mut rng) {
            Ok(InitiatorStep::Send(next)) => {
                assert_eq!(
                    next.header.exp_stat_sn,
                    stat_sn + 1,
                    "the response acknowledged"
                );
                req = next;
            }
            Ok(InitiatorStep::Complete { .. }) => return,
            other => panic!("{other:?}"),
        }
    }
    panic!("login did not finish");
}
