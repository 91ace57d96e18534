//! Shared by the initiator's integration tests: an ironsan target started in-process.

use std::net::SocketAddr;

use bytes::Bytes;
use iscsi_wire::{Bhs, LoginRequest, LoginResponse, Pdu, Stage};

/// `n` bytes of a xorshift sequence from `seed`: data that differs between writes.
#[allow(dead_code)] // not every test file uses it
pub fn random_bytes(n: usize, seed: u64) -> Bytes {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// What the raw iSER targets of these tests answer a Login Request with: straight from the
/// operational stage to full feature phase, in iSER mode, with the keys LIO answers (its
/// sequence numbers are stamped by the caller).
#[allow(dead_code)] // only the raw-target tests use it
pub fn iser_login_response(r: &LoginRequest) -> Pdu {
    let rsp = Bhs::LoginResponse(LoginResponse {
        transit: true,
        cont: false,
        csg: Stage::Operational,
        nsg: Stage::FullFeature,
        version_max: 0,
        version_active: 0,
        isid: r.isid,
        tsih: 1,
        itt: r.itt,
        stat_sn: 0,
        exp_cmd_sn: 0,
        max_cmd_sn: 0,
        status_class: 0,
        status_detail: 0,
    });
    let keys: &[u8] = b"RDMAExtensions=Yes\0TargetRecvDataSegmentLength=8192\0\
        InitialR2T=Yes\0ImmediateData=Yes\0MaxBurstLength=262144\0FirstBurstLength=8192\0\
        MaxConnections=1\0ErrorRecoveryLevel=0\0DataPDUInOrder=Yes\0DataSequenceInOrder=Yes\0";
    Pdu::new(rsp, Bytes::from_static(keys))
}

/// A raw target's Send of `pdu`, stamped with its numbers (a window of 64 commands from
/// `exp_cmd_sn`; `stat_sn` advances past a PDU that takes one): the iSER header and the PDU.
#[allow(dead_code)] // only the raw-target tests use it
pub fn raw_target_send(mut pdu: Pdu, stat_sn: &mut u32, exp_cmd_sn: u32) -> Vec<u8> {
    pdu.bhs
        .set_target_sns(*stat_sn, exp_cmd_sn, exp_cmd_sn.wrapping_add(63));
    if pdu.bhs.advances_stat_sn() {
        *stat_sn = stat_sn.wrapping_add(1);
    }
    let mut send = vec![0u8; iser::send_len(&pdu)];
    iser::encode_send(&iser::IserHeader::CONTROL, &pdu, &mut send);
    send
}

/// Binds the target described by `config` (TOML, portals on 127.0.0.1:0), serves it in the
/// background and returns its address. IRONSAN_LOG=debug shows both sides' logs when a test
/// fails.
pub async fn start_target(config: &str) -> SocketAddr {
    if let Ok(f) = std::env::var("IRONSAN_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let config = iscsi_target::Config::parse(config, "test.toml").expect("config");
    let bound = transports::bind_target(config).await.expect("bind");
    let addr = bound.local_addrs()[0];
    tokio::spawn(bound.serve());
    addr
}
