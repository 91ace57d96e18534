//! The target's iSER login phase on the software RNIC, against a raw initiator written
//! directly on the `rdma` API (as Linux ib_iser behaves: the iSER word 0x80 in its private
//! data, the Login Request as the first Send behind a 28-byte iSER header).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use datamover::{LoginChannel, LoginRecvError};
use datamover_iser::{accept, AcceptConfig, IserLogin};
use iscsi_wire::{Bhs, LoginResponse, Pdu, Stage};
use iser::{CmFlags, IserHeader};
use rdma::{ConnParams, ConnectRequest, Listener, Provider, QueuePair};
use rnic::Rnic;

mod common;

use common::{login_request, RawInitiator, LOGIN_TEXT};

/// Connects a raw initiator (with `private_data`) to a target that accepts with `cfg`.
async fn connect(private_data: Vec<u8>, cfg: AcceptConfig) -> (IserLogin<Rnic>, Arc<RawInitiator>) {
    let target_dev = Arc::new(Rnic::new().unwrap());
    let listener = target_dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let initiator = Arc::new(RawInitiator::new(Rnic::new().unwrap()));
    let ini = initiator.clone();
    let connecting = tokio::task::spawn_blocking(move || {
        let params = ConnParams {
            private_data,
            ird: 128,
            ord: 1,
            ..ConnParams::default()
        };
        ini.qp.connect(addr, &params).unwrap()
    });
    let req = common::next_request(listener).await;
    assert_eq!(req.peer_ird_ord(), (128, 1));
    let target_dev = datamover_iser::TargetDevice::new(target_dev).unwrap();
    let login = accept(target_dev, req, cfg).await.expect("accepted");
    let info = connecting.await.unwrap();
    // The target's iSER word follows the MPA v2 IRD/ORD word.
    let flags = CmFlags::decode(&info.peer_private_data);
    assert!(flags.no_zbva, "ZBVA is never used");
    assert_eq!(flags.no_send_invalidate, !login.send_invalidate);
    (login, initiator)
}

#[tokio::test]
async fn a_login_request_in_the_first_send_is_answered_in_a_send() {
    let (mut login, initiator) = connect(vec![0x80, 0, 0, 0], AcceptConfig::default()).await;
    assert!(
        login.send_invalidate,
        "Linux's 0x80 accepts Send with Invalidate"
    );
    assert!(!login.initiator_flags.no_send_invalidate);
    assert_eq!(
        login.ird_ord,
        (1, 16),
        "clamped to the initiator's ORD 1 and IRD 128"
    );
    initiator.send_pdu(&login_request());
    let got = login.recv().await.expect("the Login Request");
    assert!(matches!(got.pdu.bhs, Bhs::LoginRequest(ref r) if r.itt == 0x1000));
    assert_eq!(&got.pdu.data[..], LOGIN_TEXT);
    let rsp = Bhs::LoginResponse(LoginResponse {
        transit: true,
        cont: false,
        csg: Stage::Operational,
        nsg: Stage::FullFeature,
        version_max: 0,
        version_active: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 7,
        itt: 0x1000,
        stat_sn: 0,
        exp_cmd_sn: 1,
        max_cmd_sn: 64,
        status_class: 0,
        status_detail: 0,
    });
    login
        .send(&Pdu::new(rsp, Bytes::from_static(b"RDMAExtensions=Yes\0")))
        .await
        .unwrap();
    let ini = initiator.clone();
    let (header, pdu) = tokio::task::spawn_blocking(move || ini.recv_pdu())
        .await
        .unwrap();
    assert_eq!(header, IserHeader::CONTROL, "flags 0x10, no STags");
    assert!(matches!(pdu.bhs, Bhs::LoginResponse(ref r) if r.tsih == 7));
    assert_eq!(&pdu.data[..], b"RDMAExtensions=Yes\0");
}

#[tokio::test]
async fn an_initiator_without_the_iser_word_gets_plain_sends() {
    let (login, _initiator) = connect(Vec::new(), AcceptConfig::default()).await;
    assert!(login.initiator_flags.no_send_invalidate && login.initiator_flags.no_zbva);
    assert!(!login.send_invalidate);
}

#[tokio::test]
async fn malformed_sends_and_a_lost_connection_are_errors() {
    let (mut login, initiator) = connect(vec![0x80, 0, 0, 0], AcceptConfig::default()).await;
    // Shorter than the iSER header and a BHS.
    initiator.send_bytes(&[0x10; 40]);
    assert!(matches!(login.recv().await, Err(LoginRecvError::Bad(why)) if why.contains("shorter")));
    // A Hello.
    let mut hello = vec![0u8; 76];
    hello[0] = 0x20;
    initiator.send_bytes(&hello);
    assert!(matches!(login.recv().await, Err(LoginRecvError::Bad(why)) if why.contains("Hello")));
    // A control opcode with reserved flag bits set.
    let mut flags = vec![0u8; 76];
    flags[0] = 0x11;
    initiator.send_bytes(&flags);
    assert!(matches!(login.recv().await, Err(LoginRecvError::Bad(why)) if why.contains("0x11")));
    // A DataSegmentLength beyond the bytes sent.
    let mut bytes = vec![0u8; iser::send_len(&login_request())];
    iser::encode_send(&IserHeader::CONTROL, &login_request(), &mut bytes);
    bytes.truncate(100);
    initiator.send_bytes(&bytes);
    assert!(matches!(login.recv().await, Err(LoginRecvError::Bad(_))));
    // The initiator goes away: the login phase hears of it.
    initiator.qp.disconnect();
    let r = tokio::time::timeout(Duration::from_secs(10), login.recv()).await;
    assert!(matches!(r, Ok(Err(LoginRecvError::Closed))), "{r:?}");
}
