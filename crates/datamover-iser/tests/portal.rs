//! The iSER portal on the software RNIC: one port serving iSCSI/TCP and iSER, connections
//! told apart by their first bytes; an iSER-only portal refusing iSCSI/TCP; a client that
//! stalls delaying no other login.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datamover::{Portal, TransportKind};
use datamover_iser::{AcceptConfig, IserPortal};
use iscsi_wire::{encode_pdu, Bhs};
use rdma::{ConnParams, QueuePair};
use rnic::Rnic;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;

use common::{login_request, RawInitiator};

async fn portal(also_tcp: bool) -> IserPortal {
    let dev = datamover_iser::TargetDevice::new(Arc::new(Rnic::new().unwrap())).unwrap();
    IserPortal::bind(
        "127.0.0.1:0".parse().unwrap(),
        dev,
        AcceptConfig::default(),
        also_tcp.then(datamover_tcp::login_channels),
    )
    .await
    .unwrap()
}

/// A raw iSER initiator connecting to `addr` (blocking, so on a thread of its own).
fn connect_iser(addr: SocketAddr) -> tokio::task::JoinHandle<RawInitiator> {
    tokio::task::spawn_blocking(move || {
        let ini = RawInitiator::new(Rnic::new().unwrap());
        let params = ConnParams {
            private_data: vec![0x80, 0, 0, 0],
            ird: 128,
            ord: 1,
            ..ConnParams::default()
        };
        ini.qp.connect(addr, &params).unwrap();
        ini
    })
}

async fn accept(p: &IserPortal) -> Box<dyn datamover::LoginChannel> {
    tokio::time::timeout(Duration::from_secs(10), p.accept(None))
        .await
        .expect("a connection in time")
        .expect("accepted")
}

#[tokio::test]
async fn one_port_serves_iscsi_tcp_and_iser_told_apart_by_the_first_bytes() {
    let p = portal(true).await;
    assert_eq!(p.describe(), "iSCSI/TCP and iSER (software iWARP RNIC)");
    let addr = p.local_addr();
    // iSCSI/TCP: a Login PDU first.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&encode_pdu(&login_request(), None, None))
        .await
        .unwrap();
    let mut conn = accept(&p).await;
    assert_eq!(conn.kind(), TransportKind::Tcp);
    let got = conn.recv().await.unwrap();
    assert!(matches!(got.pdu.bhs, Bhs::LoginRequest(ref r) if r.itt == 0x1000));
    // iSER: an MPA Request first, then the Login Request in a Send.
    let ini = connect_iser(addr).await.unwrap();
    let mut conn = accept(&p).await;
    assert_eq!(conn.kind(), TransportKind::Iser);
    ini.send_pdu(&login_request());
    let got = conn.recv().await.unwrap();
    assert!(matches!(got.pdu.bhs, Bhs::LoginRequest(ref r) if r.itt == 0x1000));
    assert_eq!(&got.pdu.data[..], common::LOGIN_TEXT);
}

#[tokio::test]
async fn an_iser_only_portal_closes_iscsi_tcp_and_serves_iser() {
    let p = portal(false).await;
    let addr = p.local_addr();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&encode_pdu(&login_request(), None, None))
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut byte)).await;
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "the TCP login is closed: {r:?}"
    );
    let ini = connect_iser(addr).await.unwrap();
    let mut conn = accept(&p).await;
    assert_eq!(conn.kind(), TransportKind::Iser);
    ini.send_pdu(&login_request());
    assert!(conn.recv().await.is_ok());
}

/// An iSER login accepted (and its first PDU received) within `limit`, then an iSCSI/TCP one,
/// on `p`, which serves both.
async fn iser_and_tcp_logins_accepted_within(p: &IserPortal, limit: Duration, among: &str) {
    let addr = p.local_addr();
    let started = Instant::now();
    let ini = connect_iser(addr).await.unwrap();
    let mut conn = accept(p).await;
    assert_eq!(conn.kind(), TransportKind::Iser);
    assert!(
        started.elapsed() < limit,
        "the iSER login waited {:?} {among}",
        started.elapsed()
    );
    ini.send_pdu(&login_request());
    assert!(conn.recv().await.is_ok());
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&encode_pdu(&login_request(), None, None))
        .await
        .unwrap();
    assert_eq!(accept(p).await.kind(), TransportKind::Tcp);
}

#[tokio::test]
async fn a_client_that_stalls_delays_no_other_login() {
    let p = portal(true).await;
    let addr = p.local_addr();
    // One client sends half an MPA key and stalls; another sends nothing at all.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"MPA ID R").await.unwrap();
    let _silent = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    iser_and_tcp_logins_accepted_within(&p, Duration::from_secs(3), "behind the stalled clients")
        .await;
    drop(half);
}

/// 2,000 idle connections, port probes, half an MPA key, an MPA Request trickling in a byte a
/// second: an iSER client and an iSCSI/TCP client are still accepted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_probing_and_trickling_clients_delay_no_login() {
    const IDLE: usize = 2000;
    let limit = rdma_tools::raise_nofile_limit();
    assert!(
        limit >= 2 * IDLE as u64 + 256,
        "RLIMIT_NOFILE is {limit}: this test needs {} descriptors",
        2 * IDLE + 256
    );
    let p = portal(true).await;
    let addr = p.local_addr();
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(
            tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
                .await
                .expect("an idle connection in time")
                .expect("an idle connection"),
        );
    }
    for _ in 0..10 {
        drop(TcpStream::connect(addr).await.unwrap());
    }
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"MPA ID Re").await.unwrap();
    let trickle = tokio::spawn(async move {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            return;
        };
        for b in b"MPA ID Req Frame" {
            if s.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    iser_and_tcp_logins_accepted_within(&p, Duration::from_secs(4), "among the hostile clients")
        .await;
    trickle.abort();
    drop((idle, half));
}

/// The portal for providers that listen by themselves (rdma-core's rdma_cm; here the software
/// RNIC's own listener stands in): two iSER connections accepted, each logging in on its own
/// channel, and the description names the device.
#[tokio::test]
async fn a_device_portal_accepts_iser_connections_through_the_providers_listener() {
    let dev = datamover_iser::TargetDevice::new(Arc::new(Rnic::new().unwrap())).unwrap();
    let p = datamover_iser::DevicePortal::bind(
        "127.0.0.1:0".parse().unwrap(),
        dev,
        AcceptConfig::default(),
    )
    .unwrap();
    assert_eq!(p.kind(), TransportKind::Iser);
    assert_eq!(p.describe(), "iSER on rnic (software iWARP over TCP)");
    for _ in 0..2 {
        let ini = connect_iser(p.local_addr()).await.unwrap();
        let mut conn = tokio::time::timeout(Duration::from_secs(10), p.accept(None))
            .await
            .expect("a connection in time")
            .expect("accepted");
        assert_eq!(conn.kind(), TransportKind::Iser);
        ini.send_pdu(&login_request());
        let got = conn.recv().await.unwrap();
        assert!(matches!(got.pdu.bhs, Bhs::LoginRequest(ref r) if r.itt == 0x1000));
    }
}
