//! Login and text negotiation (target and initiator state machines), CHAP, full-feature
//! Text keys and SendTargets answers.
//!
//! Login inputs are a sequence of PDUs, each a 48-byte BHS followed by a record (16-bit
//! length, data segment): the harness sets the opcode and DataSegmentLength itself, so
//! the fuzzer spends its time on flags, stages and keys. A `CHAP_R=auto` item in a PDU is
//! replaced by the correct response to the challenge the other side sent last, so that
//! the fuzzer gets past authentication to the operational stage.

use std::sync::Arc;

use iscsi_login::chap::{self, ChapAlgorithm, ChapCredentials};
use iscsi_login::text;
use iscsi_login::{
    AuthRequirement, ConnectionParams, DigestPolicy, DigestPreference, ExistingSession,
    InitiatorAuth, InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginRequest,
    LoginResponse, LoginState, Portal, SessionParams, SessionType, Stage, StaticDirectory,
    StaticTarget, TargetLimits, TargetLogin, TargetLoginConfig, TextContext, TextResponder,
    TransportKind,
};
use iscsi_wire::{Bhs, BHS_LEN};

use crate::Input;

// Names and secrets are those of fuzz/make-seeds.sh, whose recorded logins are the seeds.
pub const TARGET: &str = "iqn.2026-11.org.ironsan:seeds";
pub const TARGET_CHAP: &str = "iqn.2026-11.org.ironsan:seeds-chap";
pub const INITIATOR: &str = "iqn.2026-11.org.ironsan:initiator";
const USER: &str = "alice";
const SECRET: &[u8] = b"alicesecret12";
const TARGET_USER: &str = "target1";
const TARGET_SECRET: &[u8] = b"targetsecret1";
/// Most PDUs one login input sends.
const MAX_PDUS: usize = 64;

/// Deterministic "random" bytes for challenges (xorshift).
struct Rng(u64);

impl Rng {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *b = self.0 as u8;
        }
    }
}

fn creds(user: &str, secret: &[u8]) -> ChapCredentials {
    ChapCredentials::new(user, secret.to_vec())
}

fn auth(kind: u8) -> AuthRequirement {
    match kind & 3 {
        0 => AuthRequirement::None,
        1 => AuthRequirement::Chap {
            credentials: creds(USER, SECRET),
            mutual: None,
        },
        _ => AuthRequirement::Chap {
            credentials: creds(USER, SECRET),
            mutual: Some(creds(TARGET_USER, TARGET_SECRET)),
        },
    }
}

fn portal(address: &str, tpgt: u16) -> Portal {
    Portal {
        address: address.parse().expect("a socket address"),
        tpgt,
    }
}

fn directory(target_auth: u8, discovery_auth: u8) -> StaticDirectory {
    StaticDirectory {
        targets: vec![
            StaticTarget {
                name: TARGET.into(),
                alias: Some("fuzz".into()),
                allowed_initiators: vec![],
                auth: auth(target_auth),
                portals: vec![portal("192.0.2.1:3260", 1), portal("[2001:db8::1]:3260", 1)],
            },
            StaticTarget {
                name: TARGET_CHAP.into(),
                alias: None,
                allowed_initiators: vec![],
                auth: auth(target_auth),
                portals: vec![portal("192.0.2.1:3260", 1)],
            },
            StaticTarget {
                name: "iqn.2026-11.org.ironsan:acl".into(),
                alias: None,
                allowed_initiators: vec![INITIATOR.into()],
                auth: AuthRequirement::None,
                portals: vec![portal("192.0.2.2:3261", 2)],
            },
        ],
        discovery_auth: auth(discovery_auth),
    }
}

fn transport(bit: bool) -> TransportKind {
    if bit {
        TransportKind::Iser
    } else {
        TransportKind::Tcp
    }
}

/// The last challenge one side sent: (algorithm, identifier, challenge).
type Challenge = Option<(ChapAlgorithm, u8, Vec<u8>)>;

/// The CHAP challenge in a text segment, if it has one.
fn challenge_in(data: &[u8], previous: Challenge) -> Challenge {
    let Ok(pairs) = text::parse(data) else {
        return previous;
    };
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let (Some(i), Some(c)) = (get("CHAP_I"), get("CHAP_C")) else {
        return previous;
    };
    let alg = get("CHAP_A")
        .and_then(|a| text::parse_number(a).ok())
        .and_then(ChapAlgorithm::from_code)
        .or(previous.as_ref().map(|p| p.0))
        .unwrap_or(ChapAlgorithm::Md5);
    Some((alg, chap::parse_identifier(i)?, text::parse_binary(c).ok()?))
}

/// Replaces `CHAP_R=auto` by the right answer to `ch` with `secret`.
fn fill_chap_response(data: &[u8], ch: &Challenge, secret: &[u8]) -> Vec<u8> {
    let Some((alg, id, challenge)) = ch else {
        return data.to_vec();
    };
    replace_chap_r(
        data,
        |v| v == "auto",
        || text::encode_hex(&chap::response(*alg, *id, secret, challenge)),
    )
}

/// The text segment `data` with every `CHAP_R` value that `matches` replaced by `value()`;
/// `data` unchanged when it does not parse or has no such value. (The seeds tool writes
/// `CHAP_R=auto` with it, the harness answers it.)
pub fn replace_chap_r(
    data: &[u8],
    matches: impl Fn(&str) -> bool,
    value: impl FnOnce() -> String,
) -> Vec<u8> {
    let Ok(pairs) = text::parse(data) else {
        return data.to_vec();
    };
    if !pairs.iter().any(|(k, v)| k == "CHAP_R" && matches(v)) {
        return data.to_vec();
    }
    let value = value();
    let pairs: Vec<(String, String)> = pairs
        .into_iter()
        .map(|(k, v)| {
            if k == "CHAP_R" && matches(&v) {
                (k, value.clone())
            } else {
                (k, v)
            }
        })
        .collect();
    text::encode(&pairs)
}

/// A login PDU from the input: the BHS (opcode and length set here) and its data.
fn next_pdu<'a>(inp: &mut Input<'a>, opcode: u8) -> Option<(Bhs, &'a [u8])> {
    if inp.is_empty() {
        return None;
    }
    let mut head: [u8; BHS_LEN] = inp.array();
    let data = inp.record();
    head[0] = opcode | (head[0] & 0x40);
    head[4] = 0;
    let len = (data.len() as u32).to_be_bytes();
    head[5..8].copy_from_slice(&len[1..]);
    Some((Bhs::decode(&head).ok()?.bhs, data))
}

/// Our own text answers must be well-formed (a response not continued is whole).
fn check_own_text(data: &[u8], continued: bool, who: &str) {
    if !continued {
        if let Err(e) = text::parse(data) {
            panic!("{who} sent text it cannot parse itself: {e}");
        }
    }
}

/// The target's login state machine (`iscsi_login::TargetLogin`), fed Login Requests.
///
/// Input: an options byte (bits 0-1 target authentication: none, CHAP, mutual CHAP;
/// bits 2-3 discovery authentication; bit 4 iSER; bit 5 a connection added to an existing
/// session; bits 6-7 digest policies), then Login Request PDUs.
pub fn login_target(data: &[u8]) {
    login_target_run(data);
}

/// [`login_target`], telling whether the login completed (and, for the tests, whether CHAP
/// was part of it).
pub fn login_target_run(data: &[u8]) -> Option<bool> {
    let mut inp = Input::new(data);
    let o = inp.u8();
    let policy = |b: u8| match b {
        0 => DigestPolicy::Never,
        1 => DigestPolicy::Required,
        _ => DigestPolicy::Allowed,
    };
    let limits = TargetLimits {
        header_digest: policy((o >> 6) & 1),
        data_digest: policy((o >> 7) * 2),
        ..TargetLimits::default()
    };
    // The session joined has the first request's ISID (bytes 8..14 of its BHS, which follows
    // the options byte) and the CHAP user of the target's authentication, so that the
    // fuzzer gets past the checks of the joining login's ISID and user.
    let first_isid: [u8; 6] = data
        .get(9..15)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_default();
    let existing = (o & 0x20 != 0).then(|| ExistingSession {
        params: SessionParams {
            initiator_name: INITIATOR.into(),
            target_name: Some(TARGET.into()),
            ..SessionParams::default()
        },
        isid: first_isid,
        chap_user: (o & 3 != 0).then(|| USER.to_string()),
    });
    let mut target = TargetLogin::new(TargetLoginConfig {
        portal_group_tag: 1,
        existing_session: existing,
        transport: transport(o & 0x10 != 0),
        limits,
        directory: Arc::new(directory(o & 3, (o >> 2) & 3)),
    });
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut challenge: Challenge = None;
    for _ in 0..MAX_PDUS {
        let (bhs, data) = next_pdu(&mut inp, 0x03)?;
        let Bhs::LoginRequest(r) = bhs else {
            return None;
        };
        let data = fill_chap_response(data, &challenge, SECRET);
        let req = LoginRequest::from_pdu(&r, &data);
        let step = target.on_request(&req, &mut |b: &mut [u8]| rng.fill(b));
        check_own_text(&step.response.data, step.response.header.cont, "the target");
        let _ = step.response.clone().into_pdu(1, 1, 1);
        challenge = challenge_in(&step.response.data, challenge);
        match step.state {
            LoginState::Continue => {}
            LoginState::Failed => return None,
            LoginState::Complete(_) => return Some(challenge.is_some()),
        }
    }
    None
}

fn initiator_config(o: u8) -> InitiatorLoginConfig {
    let discovery = o & 4 != 0;
    let mut c = InitiatorLoginConfig::new(INITIATOR, (!discovery).then(|| TARGET.to_string()));
    c.auth = match o & 3 {
        0 => InitiatorAuth::None,
        1 => InitiatorAuth::Chap {
            credentials: creds(USER, SECRET),
            mutual: None,
            algorithms: ChapAlgorithm::ALL.to_vec(),
        },
        _ => InitiatorAuth::Chap {
            credentials: creds(USER, SECRET),
            mutual: Some(creds(TARGET_USER, TARGET_SECRET)),
            algorithms: vec![ChapAlgorithm::Sha256, ChapAlgorithm::Md5],
        },
    };
    c.transport = transport(o & 8 != 0);
    c.header_digest = match (o >> 4) & 3 {
        0 => DigestPreference::None,
        1 => DigestPreference::Crc32c,
        2 => DigestPreference::PreferCrc32c,
        _ => DigestPreference::PreferNone,
    };
    c.data_digest = c.header_digest;
    c
}

/// Runs `initiator` against responses from the input. With `copy_ids`, each response's
/// ISID, ITT and CSG are those of the request it answers (as a target's would be).
fn drive_initiator(
    initiator: &mut InitiatorLogin,
    inp: &mut Input<'_>,
    copy_ids: bool,
    secret: &[u8],
) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut req: LoginRequest = initiator.first_request();
    let mut challenge: Challenge = None;
    for _ in 0..MAX_PDUS {
        check_own_text(&req.data, req.header.cont, "the initiator");
        challenge = challenge_in(&req.data, challenge);
        let Some((bhs, data)) = next_pdu(inp, 0x23) else {
            return;
        };
        let Bhs::LoginResponse(r) = bhs else {
            return;
        };
        let data = fill_chap_response(data, &challenge, secret);
        let mut rsp = LoginResponse::from_pdu(&r, &data);
        if copy_ids {
            rsp.header.isid = req.header.isid;
            rsp.header.itt = req.header.itt;
            rsp.header.csg = req.header.csg;
        }
        match initiator.on_response(&rsp, &mut |b: &mut [u8]| rng.fill(b)) {
            Ok(InitiatorStep::Send(next)) => {
                let _ = next.clone().into_pdu();
                req = next;
            }
            Ok(InitiatorStep::Complete { .. }) | Err(_) => return,
        }
    }
}

/// The initiator's login state machine (`iscsi_login::InitiatorLogin`), fed Login
/// Responses.
///
/// Input: an options byte (bits 0-1 authentication: none, CHAP, mutual CHAP; bit 2 a
/// discovery session; bit 3 iSER; bits 4-5 digest offer; bit 6 responses carry the
/// request's ISID/ITT/CSG), then Login Response PDUs.
pub fn login_initiator(data: &[u8]) {
    let mut inp = Input::new(data);
    let o = inp.u8();
    let mut initiator = InitiatorLogin::new(initiator_config(o));
    drive_initiator(&mut initiator, &mut inp, o & 0x40 != 0, TARGET_SECRET);
}

/// CHAP on both sides, in the security stage: the target requiring CHAP (mutual when
/// asked) after a fixed first request that offers it, and the initiator authenticating
/// with CHAP; plus the CHAP value parsers and the response check.
///
/// Input: an options byte (bit 0 mutual, bit 1 iSER), then records of a flag byte (bit 0
/// T, bit 1 NSG operational, bit 2 C) followed by the text data; the same records are
/// fed as requests to the target and as responses to the initiator.
pub fn chap(data: &[u8]) {
    let mut inp = Input::new(data);
    let o = inp.u8();
    let mutual = o & 1 != 0;
    let records: Vec<(u8, &[u8])> = (0..MAX_PDUS)
        .map_while(|_| (!inp.is_empty()).then(|| (inp.u8(), inp.record())))
        .collect();

    // Target side.
    let mut target = TargetLogin::new(TargetLoginConfig {
        portal_group_tag: 1,
        existing_session: None,
        transport: transport(o & 2 != 0),
        limits: TargetLimits::default(),
        directory: Arc::new(directory(1 + u8::from(mutual), 0)),
    });
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let first = LoginRequest {
        header: iscsi_wire::LoginRequest {
            transit: false,
            cont: false,
            csg: Stage::Security,
            nsg: Stage::Operational,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        },
        data: text::encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("SessionType", "Normal"),
            ("AuthMethod", "CHAP,None"),
        ]),
    };
    let step = target.on_request(&first, &mut |b: &mut [u8]| rng.fill(b));
    let mut challenge = challenge_in(&step.response.data, None);
    if step.state == LoginState::Continue {
        for &(flags, data) in &records {
            let req = LoginRequest {
                header: iscsi_wire::LoginRequest {
                    transit: flags & 1 != 0,
                    cont: flags & 4 != 0,
                    nsg: if flags & 2 != 0 {
                        Stage::Operational
                    } else {
                        Stage::FullFeature
                    },
                    ..first.header.clone()
                },
                data: fill_chap_response(data, &challenge, SECRET),
            };
            let step = target.on_request(&req, &mut |b: &mut [u8]| rng.fill(b));
            check_own_text(&step.response.data, step.response.header.cont, "the target");
            challenge = challenge_in(&step.response.data, challenge);
            if step.state != LoginState::Continue {
                break;
            }
        }
    }

    // Initiator side: the same records as the target's responses.
    let mut initiator = InitiatorLogin::new(initiator_config(if mutual { 2 } else { 1 }));
    let mut resp_bytes = Vec::new();
    for &(flags, data) in &records {
        let mut head = [0u8; BHS_LEN];
        head[1] = (flags & 1) << 7 | (flags & 4) << 4 | u8::from(flags & 2 != 0);
        resp_bytes.extend_from_slice(&head);
        crate::input::push_record(&mut resp_bytes, data);
    }
    drive_initiator(
        &mut initiator,
        &mut Input::new(&resp_bytes),
        true,
        TARGET_SECRET,
    );

    // The value parsers on every value seen.
    for &(_, data) in &records {
        let Ok(pairs) = text::parse(data) else {
            continue;
        };
        for (k, v) in &pairs {
            match k.as_str() {
                "CHAP_A" => {
                    let _ = chap::select_algorithm(v, &ChapAlgorithm::ALL);
                }
                "CHAP_I" => {
                    let _ = chap::parse_identifier(v);
                }
                "CHAP_C" | "CHAP_R" => {
                    if let Ok(b) = text::parse_binary(v) {
                        for alg in ChapAlgorithm::ALL {
                            let r = chap::response(alg, 7, SECRET, &b);
                            assert!(chap::verify(alg, 7, SECRET, &b, &r));
                            let _ = chap::verify(alg, 7, SECRET, &b, &b);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Full-feature Text negotiation on the target (`negotiate_text`) and the long-answer
/// responder that cuts its answer into PDUs, plus the key table and value parsers.
///
/// Input: an options byte (bit 0 discovery session, bit 1 iSER, bits 2-7 the initiator's
/// MaxRecvDataSegmentLength in 512-byte units), then a text data segment. Checks: the
/// answer parses; the responder's pieces put together are the answer.
pub fn text_keys(data: &[u8]) {
    let mut inp = Input::new(data);
    let o = inp.u8();
    let segment = 512 * (1 + u32::from(o >> 2));
    let raw = inp.rest();
    let Ok(pairs) = text::parse(raw) else {
        return;
    };
    let dir = directory(0, 0);
    let mut session = if o & 1 != 0 {
        SessionParams {
            session_type: SessionType::Discovery,
            initiator_name: INITIATOR.into(),
            target_name: None,
            ..SessionParams::default()
        }
    } else {
        SessionParams {
            initiator_name: INITIATOR.into(),
            target_name: Some(TARGET.into()),
            ..SessionParams::default()
        }
    };
    let mut conn = ConnectionParams::default();
    let ctx = TextContext {
        directory: &dir,
        transport: transport(o & 2 != 0),
        our_max_recv_data_segment_length: 65536,
    };
    let answer = text::encode(&iscsi_login::negotiate_text(
        &pairs,
        &mut session,
        &mut conn,
        &ctx,
    ));
    check_own_text(&answer, false, "the target");
    // The long-answer responder, continued until done.
    let ttt = 0x1000;
    let mut responder = TextResponder::new(answer.clone(), segment, ttt);
    let mut whole = Vec::new();
    let mut piece = responder.first_piece();
    for _ in 0..(answer.len() / 512 + 2) {
        assert!(piece.data.len() <= segment as usize, "piece over the limit");
        whole.extend_from_slice(&piece.data);
        if responder.is_done() {
            break;
        }
        match responder.on_continue(piece.ttt, b"") {
            Ok(p) => piece = p,
            Err(e) => panic!("the responder refused its own continuation: {e:?}"),
        }
    }
    assert!(responder.is_done(), "the responder never finished");
    assert_eq!(whole, answer, "the pieces are not the answer");

    for (k, v) in &pairs {
        let _ = iscsi_login::keys::lookup(k);
        let _ = iscsi_login::keys::is_vendor_key(k);
        let _ = iscsi_login::keys::is_special_reply(v);
        let _ = iscsi_login::keys::negotiate_list(v, &["CRC32C", "None"]);
        let _ = text::parse_number(v);
        let _ = text::parse_number_in(v, 512, 16_777_215);
        let _ = text::parse_binary(v);
        let _ = text::parse_bool(v);
        let _ = text::split_list(v);
        let _ = iscsi_login::TaskReporting::from_name(v);
    }
}

/// SendTargets answers as the initiator reads them (`ironsan discover`, `ls`): the target
/// list and each TargetAddress.
pub fn send_targets(data: &[u8]) {
    if let Ok(targets) = iscsi_login::parse_send_targets(data) {
        for t in &targets {
            for a in &t.addresses {
                assert!(!a.host.is_empty());
            }
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        for part in s.split('\0').take(256) {
            let v = part.split_once('=').map_or(part, |(_, v)| v);
            let _ = iscsi_login::TargetAddress::parse(v);
        }
    }
}
