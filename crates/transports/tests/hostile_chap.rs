//! CHAP against hostile peers: `chap_algorithms` limits the CHAP_A values a login may use, and
//! an initiator name that keeps failing authentication is locked out (the configuration checks,
//! such as a mutual secret equal to the initiator's, are unit tests in `config.rs`). The Login Responses that refuse a login
//! carry 0x0201 Authentication failure.

use test_support::raw_tcp::*;

use iscsi_login::chap::{self, ChapAlgorithm};
use std::net::SocketAddr;

const USER: &str = "alice";
const SECRET: &str = "alicesecret12";
const OK: [u8; 2] = [0, 0];
const AUTHENTICATION_FAILURE: [u8; 2] = [2, 1];
const A: &str = "iqn.2026-11.org.ironsan.test:a";

/// Starts a target whose one target requires CHAP (user [`USER`], secret [`SECRET`]), with
/// `extra` top-level configuration.
async fn start_chap_target(extra: &str) -> SocketAddr {
    let chap = format!("chap = {{ user = \"{USER}\", secret = \"{SECRET}\" }}");
    start_target_with(extra, &chap, "size = \"64MiB\"\nbackend = \"memory\"").await
}

/// Logs in as `initiator` (ISID ending in `isid_tail`) with CHAP: AuthMethod=CHAP, then
/// CHAP_A=`chap_a`, then user [`USER`]'s response to the target's challenge computed with
/// `secret`, then the operational stage to full feature phase. Returns the status (class,
/// detail) of the Login Response that refused the login, or of the final one, and the conn.
async fn chap_login(
    addr: SocketAddr,
    initiator: &str,
    isid_tail: u8,
    chap_a: &str,
    secret: &str,
) -> ([u8; 2], RawConn) {
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = isid_tail;
    let first = [
        ("InitiatorName", initiator),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
        ("AuthMethod", "CHAP"),
    ];
    let r = c.login_request(0, 1, true, &key_values(&first)).await;
    assert_eq!(r.opcode(), 0x23, "login response");
    if login_status(&r) != OK {
        return (login_status(&r), c);
    }
    assert_eq!(parse_keys(&r.data)["AuthMethod"], "CHAP");
    c.took_login_response(&r);
    let r = c
        .login_request(0, 1, false, &key_values(&[("CHAP_A", chap_a)]))
        .await;
    if login_status(&r) != OK {
        return (login_status(&r), c);
    }
    c.took_login_response(&r);
    let keys = parse_keys(&r.data);
    let alg =
        ChapAlgorithm::from_code(keys["CHAP_A"].parse().expect("CHAP_A")).expect("a known CHAP_A");
    let id: u8 = keys["CHAP_I"].parse().expect("CHAP_I");
    let challenge = iscsi_login::text::parse_binary(&keys["CHAP_C"]).expect("CHAP_C");
    let response = chap::response(alg, id, secret.as_bytes(), &challenge);
    let answer = key_values(&[
        ("CHAP_N", USER),
        ("CHAP_R", &iscsi_login::text::encode_hex(&response)),
    ]);
    let r = c.login_request(0, 1, true, &answer).await;
    if login_status(&r) != OK {
        return (login_status(&r), c);
    }
    c.took_login_response(&r);
    (c.operational_stage(&plain_keys()).await, c)
}

/// With `chap_algorithms = ["sha-256"]` an initiator offering only MD5 is refused with
/// 0x0201 and its connection closed; one offering SHA-256 (after MD5) logs in with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_algorithms_refuse_an_initiator_offering_only_md5() {
    let addr = start_chap_target("chap_algorithms = [\"sha-256\"]").await;
    let (s, mut c) = chap_login(addr, A, 1, "5", SECRET).await;
    assert_eq!(
        s, AUTHENTICATION_FAILURE,
        "CHAP_A=5 with only SHA-256 allowed"
    );
    assert!(
        c.closed_by_target(0).await,
        "the refused connection is closed"
    );
    let (s, mut c) = chap_login(addr, A, 2, "5,7", SECRET).await;
    assert_eq!(s, OK, "CHAP_A=5,7 logs in with SHA-256");
    roundtrip(&mut c, 0, 8, 1).await;
}

/// Left out, `chap_algorithms` keeps MD5 (the one RFC 7143 requires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_is_accepted_by_default() {
    let addr = start_chap_target("").await;
    let (s, mut c) = chap_login(addr, A, 1, "5", SECRET).await;
    assert_eq!(s, OK);
    roundtrip(&mut c, 0, 8, 2).await;
}

const B: &str = "iqn.2026-11.org.ironsan.test:b";

/// Six logins of one initiator name with a wrong secret are each refused with 0x0201; the
/// seventh, with the right secret, is refused too (the name is locked out after five failures
/// within a minute), while another initiator name from the same address (loopback: 5 of the
/// 20 failures that lock out an address; the sixth is refused before it is counted) still logs in and moves data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_chap_logins_lock_the_initiator_name_out() {
    let addr = start_chap_target("").await;
    for i in 0..6 {
        let (s, mut c) = chap_login(addr, A, 1, "5", "wrongsecret12").await;
        assert_eq!(s, AUTHENTICATION_FAILURE, "bad secret, login {}", i + 1);
        assert!(c.closed_by_target(0).await, "login {} closed", i + 1);
    }
    let (s, mut c) = chap_login(addr, A, 1, "5", SECRET).await;
    assert_eq!(
        s, AUTHENTICATION_FAILURE,
        "the right secret, but locked out"
    );
    assert!(
        c.closed_by_target(0).await,
        "the locked-out login is closed"
    );
    let (s, mut c) = chap_login(addr, B, 2, "5", SECRET).await;
    assert_eq!(s, OK, "another initiator name from the same address");
    roundtrip(&mut c, 0, 8, 3).await;
}
