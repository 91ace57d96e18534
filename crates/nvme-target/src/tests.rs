//! The controllers' commands and every refusal, on a RAM LUN.

use crate::controller::{Limits, Outcome, QueueBinding, Registry, AEN_NS_CHANGED};
use crate::io::{self, IoKind};
use crate::subsystem::{eui64, nguid, Subsystem};
use crate::DISCOVERY_NQN;
use bytes::Bytes;
use nvme_tcp::identify::{self, IdentifyController, IdentifyNamespace};
use nvme_tcp::log::{self, GetLogPage};
use nvme_tcp::sqe::fabrics::{self, reg, Connect, ConnectData, Property};
use nvme_tcp::sqe::{admin, nvm, Fuse, SglDescriptor};
use nvme_tcp::{Cqe, Sqe, StatusCode};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const SUB: &str = "nqn.2026-01.org.example:sub";
const HOST: &str = "nqn.2026-01.org.example:host";
const BLOCKS: u64 = 2048;

fn lun(read_only: bool) -> scsi::LunExport {
    let mut cfg = scsi::LunConfig::memory(BLOCKS * 512);
    cfg.read_only = read_only;
    let d = scsi::Device::new("iqn.2026-01.org.example:t", vec![(0, cfg)]).unwrap();
    d.lun_export(0).unwrap()
}

fn registry() -> (Registry, scsi::LunExport) {
    let l = lun(false);
    let mut ns = BTreeMap::new();
    ns.insert(1, l.clone());
    let s = Subsystem::new(SUB, vec![HOST.into()], false, None, ns);
    let mut r = Registry::new(vec![s], Limits::default());
    r.set_ports(SUB, vec!["127.0.0.1:4420".parse().unwrap()]);
    (r, l)
}

fn connect_cmd(qid: u16, sqsize: u16, cntlid: u16, sub: &str, host: &str) -> (Sqe, Bytes) {
    let c = Connect {
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato: 5000,
    };
    let d = ConnectData {
        hostid: [1; 16],
        cntlid,
        subnqn: sub.into(),
        hostnqn: host.into(),
    };
    (c.to_sqe(1), Bytes::from(d.to_bytes()))
}

fn done(o: Outcome) -> (Cqe, Vec<u8>) {
    match o {
        Outcome::Done { cqe, data } => (cqe, data),
        o => panic!("not done: {o:?}"),
    }
}

fn run(r: &mut Registry, q: &mut QueueBinding, sqe: Sqe) -> (Cqe, Vec<u8>) {
    done(r.execute(q, &sqe, &Bytes::new(), Instant::now()))
}

fn prop_set(r: &mut Registry, q: &mut QueueBinding, offset: u32, value: u64) -> Cqe {
    let p = Property {
        offset,
        eight_bytes: false,
        value,
    };
    run(r, q, p.to_sqe(fabrics::PROPERTY_SET, 2)).0
}

fn prop_get(r: &mut Registry, q: &mut QueueBinding, offset: u32, eight: bool) -> Cqe {
    let p = Property {
        offset,
        eight_bytes: eight,
        value: 0,
    };
    run(r, q, p.to_sqe(fabrics::PROPERTY_GET, 2)).0
}

/// An enabled admin queue of a new controller.
fn admin_queue(r: &mut Registry, sub: &str) -> QueueBinding {
    let mut q = QueueBinding::default();
    let (sqe, data) = connect_cmd(0, 31, 0xFFFF, sub, HOST);
    let (cqe, _) = done(r.execute(&mut q, &sqe, &data, Instant::now()));
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(q.cntlid, Some(cqe.dw0 as u16));
    assert!(prop_set(r, &mut q, reg::CC, 1 | (6 << 16) | (4 << 20))
        .status
        .is_success());
    q
}

fn io_queue(r: &mut Registry, cntlid: u16, qid: u16) -> QueueBinding {
    let mut q = QueueBinding::default();
    let (sqe, data) = connect_cmd(qid, 127, cntlid, SUB, HOST);
    let (cqe, _) = done(r.execute(&mut q, &sqe, &data, Instant::now()));
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!((q.qid, q.sq_entries), (qid, 128));
    q
}

fn code(c: &Cqe) -> StatusCode {
    c.status.code
}

fn identify(cns: u8, nsid: u32) -> Sqe {
    let mut s = Sqe::new(admin::IDENTIFY, 5);
    s.set_nsid(nsid);
    s.set_cdw(10, u32::from(cns));
    s.set_sgl(SglDescriptor::transport(4096));
    s
}

#[test]
fn connect_creates_controllers_and_io_queues_name_them() {
    let (mut r, _) = registry();
    let q = admin_queue(&mut r, SUB);
    let id = q.cntlid.unwrap();
    let q2 = admin_queue(&mut r, SUB);
    assert_ne!(q2.cntlid, Some(id));
    let io = io_queue(&mut r, id, 1);
    // The same QID twice, a QID past the queues granted, a CNTLID that is not there.
    for (qid, cntlid) in [(1, id), (17, id), (2, 999)] {
        let mut q = QueueBinding::default();
        let (sqe, data) = connect_cmd(qid, 127, cntlid, SUB, HOST);
        let (cqe, _) = done(r.execute(&mut q, &sqe, &data, Instant::now()));
        assert_eq!(code(&cqe), StatusCode::CONNECT_INVALID_PARAMETERS);
        assert_eq!(q.cntlid, None);
    }
    r.queue_closed(&io);
    let _ = io_queue(&mut r, id, 1);
    r.queue_closed(&q);
    assert!(!r.alive(id));
    assert_eq!(r.controller_count(), 1);
}

#[test]
fn bad_connects_say_which_field() {
    let (mut r, _) = registry();
    let other = "nqn.2026-01.org.example:other";
    let cases = [
        (
            connect_cmd(0, 31, 0xFFFF, other, HOST),
            StatusCode::CONNECT_INVALID_PARAMETERS,
            1,
            256,
        ),
        (
            connect_cmd(0, 31, 0xFFFF, SUB, other),
            StatusCode::CONNECT_INVALID_HOST,
            1,
            512,
        ),
        (
            connect_cmd(0, 0, 0xFFFF, SUB, HOST),
            StatusCode::CONNECT_INVALID_PARAMETERS,
            0,
            44,
        ),
        (
            connect_cmd(0, 4000, 0xFFFF, SUB, HOST),
            StatusCode::CONNECT_INVALID_PARAMETERS,
            0,
            44,
        ),
        (
            connect_cmd(0, 31, 5, SUB, HOST),
            StatusCode::CONNECT_INVALID_PARAMETERS,
            1,
            16,
        ),
        // An I/O queue before its controller is enabled.
        (
            connect_cmd(1, 31, 1, SUB, HOST),
            StatusCode::CONNECT_INVALID_PARAMETERS,
            1,
            16,
        ),
    ];
    for ((sqe, data), want, iattr, ipo) in cases {
        let mut q = QueueBinding::default();
        let (cqe, _) = done(r.execute(&mut q, &sqe, &data, Instant::now()));
        assert_eq!(code(&cqe), want);
        assert!(cqe.status.dnr);
        assert_eq!(cqe.dw0, (iattr << 16) | ipo, "{want}");
        assert_eq!(q.cntlid, None);
    }
    // Record format, data length, NQNs not NUL-terminated.
    let (mut sqe, data) = connect_cmd(0, 31, 0xFFFF, SUB, HOST);
    let mut b = *sqe.as_bytes();
    b[40] = 1;
    let bad_fmt = Sqe::from_bytes(b);
    let mut q = QueueBinding::default();
    let (cqe, _) = done(r.execute(&mut q, &bad_fmt, &data, Instant::now()));
    assert_eq!(code(&cqe), StatusCode::CONNECT_INCOMPATIBLE_FORMAT);
    let (cqe, _) = done(r.execute(&mut q, &sqe, &data.slice(..100), Instant::now()));
    assert_eq!(code(&cqe), StatusCode::SGL_LENGTH_INVALID);
    let mut raw = data.to_vec();
    raw[512..768].fill(b'a');
    let (cqe, _) = done(r.execute(&mut q, &sqe, &Bytes::from(raw.clone()), Instant::now()));
    assert_eq!(
        (code(&cqe), cqe.dw0),
        (StatusCode::CONNECT_INVALID_PARAMETERS, (1 << 16) | 512)
    );
    raw[256..512].fill(0xFF);
    let (cqe, _) = done(r.execute(&mut q, &sqe, &Bytes::from(raw), Instant::now()));
    assert_eq!(cqe.dw0, (1 << 16) | 256);
    // Commands before Connect, Connect twice.
    assert_eq!(
        code(&run(&mut r, &mut q, identify(1, 0)).0),
        StatusCode::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        code(&prop_get(&mut r, &mut q, reg::CSTS, false)),
        StatusCode::COMMAND_SEQUENCE_ERROR
    );
    let mut q = admin_queue(&mut r, SUB);
    sqe.set_cid(9);
    let (cqe, _) = done(r.execute(&mut q, &sqe, &data, Instant::now()));
    assert_eq!(code(&cqe), StatusCode::COMMAND_SEQUENCE_ERROR);
}

#[test]
fn any_host_when_allowed_and_controller_limit() {
    let s = Subsystem::new(SUB, vec![], true, None, BTreeMap::new());
    let limits = Limits {
        max_controllers: 1,
        ..Limits::default()
    };
    let mut r = Registry::new(vec![s], limits);
    let _ = admin_queue(&mut r, SUB);
    let mut q = QueueBinding::default();
    let (sqe, data) = connect_cmd(0, 31, 0xFFFF, SUB, "nqn.2026-01.org.example:anyone");
    let (cqe, _) = done(r.execute(&mut q, &sqe, &data, Instant::now()));
    assert_eq!(code(&cqe), StatusCode::CONNECT_CONTROLLER_BUSY);
}

#[test]
fn properties_enable_and_shut_down() {
    let (mut r, _) = registry();
    let mut q = QueueBinding::default();
    let (sqe, data) = connect_cmd(0, 31, 0xFFFF, SUB, HOST);
    done(r.execute(&mut q, &sqe, &data, Instant::now()));
    let cap = prop_get(&mut r, &mut q, reg::CAP, true);
    let cap = u64::from(cap.dw0) | (u64::from(cap.dw1) << 32);
    assert_eq!(cap & 0xFFFF, 127);
    assert_ne!(cap & (1 << 37), 0);
    assert_eq!(prop_get(&mut r, &mut q, reg::VS, false).dw0, 0x0001_0300);
    assert_eq!(prop_get(&mut r, &mut q, reg::CSTS, false).dw0 & 1, 0);
    // Admin commands wait for CC.EN.
    assert_eq!(
        code(&run(&mut r, &mut q, identify(1, 0)).0),
        StatusCode::COMMAND_SEQUENCE_ERROR
    );
    prop_set(&mut r, &mut q, reg::CC, 1);
    assert_eq!(prop_get(&mut r, &mut q, reg::CSTS, false).dw0, 1);
    assert_eq!(prop_get(&mut r, &mut q, reg::CC, false).dw0, 1);
    prop_set(&mut r, &mut q, reg::CC, 1 | (1 << 14));
    assert_eq!(prop_get(&mut r, &mut q, reg::CSTS, false).dw0 & 0xC, 0x8);
    // Unknown registers, wrong sizes, read-only registers.
    assert_eq!(
        code(&prop_get(&mut r, &mut q, 0x40, false)),
        StatusCode::INVALID_FIELD
    );
    assert_eq!(
        code(&prop_get(&mut r, &mut q, reg::CAP, false)),
        StatusCode::INVALID_FIELD
    );
    assert_eq!(
        code(&prop_set(&mut r, &mut q, reg::CSTS, 1)),
        StatusCode::INVALID_FIELD
    );
    // Property commands belong to the admin queue; unknown FCTYPEs are refused.
    let mut io = io_queue(&mut r, q.cntlid.unwrap(), 1);
    assert_eq!(
        code(&prop_get(&mut r, &mut io, reg::CSTS, false)),
        StatusCode::INVALID_FIELD
    );
    let mut b = *Sqe::new(fabrics::OPCODE, 3).as_bytes();
    b[4] = 0x7E;
    assert_eq!(
        code(&run(&mut r, &mut q, Sqe::from_bytes(b)).0),
        StatusCode::INVALID_OPCODE
    );
    b[4] = fabrics::DISCONNECT;
    assert!(run(&mut r, &mut q, Sqe::from_bytes(b))
        .0
        .status
        .is_success());
}

#[test]
fn identify_controller_namespace_lists_and_descriptors() {
    let (mut r, l) = registry();
    let mut q = admin_queue(&mut r, SUB);
    let (cqe, data) = run(&mut r, &mut q, identify(admin::CNS_CONTROLLER, 0));
    assert!(cqe.status.is_success());
    let c = IdentifyController::parse(&data).unwrap();
    assert_eq!(c.cntlid, q.cntlid.unwrap());
    assert_eq!(c.subnqn, SUB);
    assert_eq!(c.mn, "ironsan");
    assert_eq!(c.cntrltype, identify::cntrltype::IO);
    assert_eq!(c.mdts, 6);
    assert_eq!(c.maxcmd, 128);
    assert_eq!(c.ioccsz, (64 + 8192) / 16);
    assert_eq!(c.sgls, identify::SGLS_SUPPORTED | identify::SGLS_OFFSET);
    assert_eq!(
        c.oncs,
        identify::ONCS_COMPARE | identify::ONCS_DSM | identify::ONCS_WRITE_ZEROES
    );
    assert_eq!(c.fuses, 0);
    assert_eq!(c.ver, identify::VERSION_1_3);
    assert!(c.kas > 0 && c.nn >= 1);
    let (_, data) = run(&mut r, &mut q, identify(admin::CNS_NAMESPACE, 1));
    let n = IdentifyNamespace::parse(&data).unwrap();
    assert_eq!((n.nsze, n.ncap, n.lbads), (BLOCKS, BLOCKS, 9));
    assert_eq!(n.nguid, nguid(l.naa()));
    assert_eq!(n.eui64, eui64(l.naa()));
    // An inactive NSID: zeroes; the broadcast NSID: refused.
    let (cqe, data) = run(&mut r, &mut q, identify(admin::CNS_NAMESPACE, 7));
    assert!(cqe.status.is_success() && data.iter().all(|&b| b == 0));
    for nsid in [0, 0xFFFF_FFFF] {
        let (cqe, _) = run(&mut r, &mut q, identify(admin::CNS_NAMESPACE, nsid));
        assert_eq!(code(&cqe), StatusCode::INVALID_NAMESPACE);
    }
    let (_, data) = run(&mut r, &mut q, identify(admin::CNS_ACTIVE_NSIDS, 0));
    assert_eq!(&data[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let (_, data) = run(&mut r, &mut q, identify(admin::CNS_ACTIVE_NSIDS, 1));
    assert!(data.iter().all(|&b| b == 0));
    let (_, data) = run(&mut r, &mut q, identify(admin::CNS_NS_DESCRIPTORS, 1));
    let d = identify::parse_ns_descriptors(&data);
    assert_eq!(d[0], (identify::NIDT_EUI64, eui64(l.naa()).to_vec()));
    assert_eq!(d[1], (identify::NIDT_NGUID, nguid(l.naa()).to_vec()));
    let (cqe, _) = run(&mut r, &mut q, identify(admin::CNS_NS_DESCRIPTORS, 2));
    assert_eq!(code(&cqe), StatusCode::INVALID_NAMESPACE);
    let (cqe, data) = run(&mut r, &mut q, identify(0x06, 0));
    assert!(cqe.status.is_success() && data == vec![0; 4096]);
    let mut other_csi = identify(0x06, 0);
    other_csi.set_cdw(11, 2 << 24);
    assert_eq!(
        code(&run(&mut r, &mut q, other_csi).0),
        StatusCode::INVALID_FIELD
    );
    let (cqe, _) = run(&mut r, &mut q, identify(0x55, 0));
    assert_eq!(code(&cqe), StatusCode::INVALID_FIELD);
}

fn get_log(lid: u8, len: u64, offset: u64, rae: bool) -> Sqe {
    GetLogPage {
        lid,
        lsp: 0,
        rae,
        len,
        offset,
    }
    .to_sqe(6)
}

#[test]
fn log_pages() {
    let (mut r, _) = registry();
    let mut q = admin_queue(&mut r, SUB);
    let (cqe, data) = run(&mut r, &mut q, get_log(log::LID_SMART, 512, 0, false));
    assert!(cqe.status.is_success());
    assert_eq!(data.len(), 512);
    assert_eq!(data[3], 100);
    let (_, data) = run(&mut r, &mut q, get_log(log::LID_ERROR, 64, 0, false));
    assert_eq!(data, vec![0; 64]);
    let (_, data) = run(&mut r, &mut q, get_log(log::LID_CHANGED_NS, 4096, 0, false));
    assert!(data.iter().all(|&b| b == 0));
    // Past the end, misaligned, unknown, the discovery page on an I/O controller.
    for (lid, off) in [(log::LID_SMART, 1024), (log::LID_SMART, 2)] {
        let (cqe, _) = run(&mut r, &mut q, get_log(lid, 4, off, false));
        assert_eq!(code(&cqe), StatusCode::INVALID_FIELD);
    }
    for lid in [0x33, log::LID_DISCOVERY] {
        let (cqe, _) = run(&mut r, &mut q, get_log(lid, 4, 0, false));
        assert_eq!(code(&cqe), StatusCode::INVALID_LOG_PAGE);
    }
    // A part of a page from an offset.
    let (_, data) = run(&mut r, &mut q, get_log(log::LID_SMART, 8, 0, false));
    assert_eq!(data.len(), 8);
}

fn feature(set: bool, fid: u8, cdw11: u32) -> Sqe {
    let mut s = Sqe::new(
        if set {
            admin::SET_FEATURES
        } else {
            admin::GET_FEATURES
        },
        7,
    );
    s.set_cdw(10, u32::from(fid));
    s.set_cdw(11, cdw11);
    s
}

#[test]
fn features_and_keep_alive() {
    let (mut r, _) = registry();
    let mut q = admin_queue(&mut r, SUB);
    let (cqe, _) = run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_NUMBER_OF_QUEUES, 3 | (3 << 16)),
    );
    assert_eq!(cqe.dw0, 3 | (3 << 16));
    let (cqe, _) = run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_NUMBER_OF_QUEUES, 200 | (200 << 16)),
    );
    assert_eq!(cqe.dw0, 15 | (15 << 16));
    let (cqe, _) = run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_NUMBER_OF_QUEUES, 0xFFFF),
    );
    assert_eq!(code(&cqe), StatusCode::INVALID_FIELD);
    let (cqe, _) = run(
        &mut r,
        &mut q,
        feature(false, admin::FEAT_NUMBER_OF_QUEUES, 0),
    );
    assert_eq!(cqe.dw0, 15 | (15 << 16));
    run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_ASYNC_EVENT_CONFIG, 1 << 8),
    );
    assert_eq!(
        run(
            &mut r,
            &mut q,
            feature(false, admin::FEAT_ASYNC_EVENT_CONFIG, 0)
        )
        .0
        .dw0,
        1 << 8
    );
    assert_eq!(
        run(
            &mut r,
            &mut q,
            feature(false, admin::FEAT_KEEP_ALIVE_TIMER, 0)
        )
        .0
        .dw0,
        5000
    );
    run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_KEEP_ALIVE_TIMER, 1000),
    );
    assert_eq!(
        run(
            &mut r,
            &mut q,
            feature(false, admin::FEAT_KEEP_ALIVE_TIMER, 0)
        )
        .0
        .dw0,
        1000
    );
    assert_eq!(
        run(
            &mut r,
            &mut q,
            feature(false, admin::FEAT_VOLATILE_WRITE_CACHE, 0)
        )
        .0
        .dw0,
        1
    );
    let (cqe, _) = run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_VOLATILE_WRITE_CACHE, 0),
    );
    assert_eq!(code(&cqe), StatusCode::FEATURE_NOT_CHANGEABLE);
    let (cqe, _) = run(&mut r, &mut q, feature(false, 0x77, 0));
    assert_eq!(code(&cqe), StatusCode::INVALID_FIELD);
    let mut saved = feature(true, admin::FEAT_KEEP_ALIVE_TIMER, 1000);
    saved.set_cdw(10, saved.cdw(10) | (1 << 31));
    assert_eq!(
        code(&run(&mut r, &mut q, saved).0),
        StatusCode::FEATURE_NOT_SAVEABLE
    );
    // Keep Alive, then the timer: any command restarts it, silence past KATO ends it.
    let id = q.cntlid.unwrap();
    let t0 = Instant::now();
    let ka = Sqe::new(admin::KEEP_ALIVE, 8);
    assert!(done(r.execute(&mut q, &ka, &Bytes::new(), t0))
        .0
        .status
        .is_success());
    assert!(r.expire(t0 + Duration::from_millis(900)).is_empty());
    assert_eq!(r.expire(t0 + Duration::from_millis(1100)), vec![id]);
    assert!(!r.alive(id));
    assert_eq!(
        code(&run(&mut r, &mut q, ka).0),
        StatusCode::COMMAND_SEQUENCE_ERROR
    );
    // KATO 0: never expires.
    let mut q = admin_queue(&mut r, SUB);
    run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_KEEP_ALIVE_TIMER, 0),
    );
    assert!(r
        .expire(Instant::now() + Duration::from_secs(3600))
        .is_empty());
    // Abort: nothing is aborted.
    assert_eq!(run(&mut r, &mut q, Sqe::new(admin::ABORT, 9)).0.dw0, 1);
    assert_eq!(
        code(&run(&mut r, &mut q, Sqe::new(0x99, 9)).0),
        StatusCode::INVALID_OPCODE
    );
}

#[test]
fn async_events_wait_for_a_namespace_change() {
    let (mut r, l) = registry();
    let mut q = admin_queue(&mut r, SUB);
    let id = q.cntlid.unwrap();
    run(
        &mut r,
        &mut q,
        feature(true, admin::FEAT_ASYNC_EVENT_CONFIG, 1 << 8),
    );
    for cid in 0..4 {
        let o = r.execute(
            &mut q,
            &Sqe::new(admin::ASYNC_EVENT_REQUEST, 100 + cid),
            &Bytes::new(),
            Instant::now(),
        );
        assert!(matches!(o, Outcome::Held));
    }
    let (cqe, _) = run(&mut r, &mut q, Sqe::new(admin::ASYNC_EVENT_REQUEST, 104));
    assert_eq!(code(&cqe), StatusCode::AER_LIMIT_EXCEEDED);
    assert!(r.take_events(id).is_empty());
    let mut ns = BTreeMap::new();
    ns.insert(1, l.clone());
    ns.insert(2, lun(true));
    assert!(r.set_namespaces(SUB, ns.clone()));
    assert!(!r.set_namespaces("nqn.nothing:here", ns.clone()));
    let ev = r.take_events(id);
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].cid, ev[0].dw0), (100, AEN_NS_CHANGED));
    // Masked until the log is read: another change adds to the list, no second event.
    ns.remove(&2);
    r.set_namespaces(SUB, ns);
    assert!(r.take_events(id).is_empty());
    let (_, data) = run(&mut r, &mut q, get_log(log::LID_CHANGED_NS, 4096, 0, true));
    assert_eq!(&data[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    let (_, data) = run(&mut r, &mut q, get_log(log::LID_CHANGED_NS, 4096, 0, false));
    assert_eq!(&data[..4], &[2, 0, 0, 0]);
    let (_, data) = run(&mut r, &mut q, get_log(log::LID_CHANGED_NS, 4096, 0, false));
    assert!(data.iter().all(|&b| b == 0));
    let mut ns = BTreeMap::new();
    ns.insert(3, l);
    r.set_namespaces(SUB, ns);
    assert_eq!(r.take_events(id)[0].cid, 101);
}

#[test]
fn discovery_controller_lists_allowed_subsystems() {
    let (r, _) = registry();
    let hidden = Subsystem::new(
        "nqn.2026-01.org.example:hidden",
        vec!["nqn.x:y".into()],
        false,
        None,
        BTreeMap::new(),
    );
    let open = Subsystem::new(
        "nqn.2026-01.org.example:open",
        vec![],
        true,
        None,
        BTreeMap::new(),
    );
    let mut r2 = Registry::new(
        vec![r.subsystems()[0].clone(), hidden, open],
        Limits::default(),
    );
    r2.set_ports(
        "nqn.2026-01.org.example:open",
        vec![
            "[::1]:4421".parse().unwrap(),
            "127.0.0.1:4420".parse().unwrap(),
        ],
    );
    let mut q = admin_queue(&mut r2, DISCOVERY_NQN);
    let (_, data) = run(&mut r2, &mut q, identify(admin::CNS_CONTROLLER, 0));
    let c = IdentifyController::parse(&data).unwrap();
    assert_eq!(
        (c.cntrltype, c.subnqn.as_str(), c.nn),
        (identify::cntrltype::DISCOVERY, DISCOVERY_NQN, 0)
    );
    let (cqe, _) = run(&mut r2, &mut q, identify(admin::CNS_NAMESPACE, 1));
    assert_eq!(code(&cqe), StatusCode::INVALID_FIELD);
    let (_, head) = run(&mut r2, &mut q, get_log(log::LID_DISCOVERY, 1024, 0, false));
    assert_eq!(head[8], 3);
    let (_, data) = run(
        &mut r2,
        &mut q,
        get_log(log::LID_DISCOVERY, 4 * 1024, 0, false),
    );
    let (_, entries) = log::parse_discovery_page(&data).unwrap();
    let names: Vec<(&str, &str, &str, u8)> = entries
        .iter()
        .map(|e| {
            (
                e.subnqn.as_str(),
                e.traddr.as_str(),
                e.trsvcid.as_str(),
                e.adrfam,
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            (SUB, "127.0.0.1", "4420", log::ADRFAM_IPV4),
            (
                "nqn.2026-01.org.example:open",
                "::1",
                "4421",
                log::ADRFAM_IPV6
            ),
            (
                "nqn.2026-01.org.example:open",
                "127.0.0.1",
                "4420",
                log::ADRFAM_IPV4
            ),
        ]
    );
    assert_eq!(entries[0].portid, entries[2].portid);
    assert_eq!(entries[0].trtype, log::TRTYPE_TCP);
    // A discovery controller has no I/O queues, SMART page, or NVM commands.
    let mut io = QueueBinding::default();
    let (sqe, data) = connect_cmd(1, 31, q.cntlid.unwrap(), DISCOVERY_NQN, HOST);
    let (cqe, _) = done(r2.execute(&mut io, &sqe, &data, Instant::now()));
    assert_eq!(code(&cqe), StatusCode::CONNECT_INVALID_PARAMETERS);
    let (cqe, _) = run(&mut r2, &mut q, get_log(log::LID_SMART, 512, 0, false));
    assert_eq!(code(&cqe), StatusCode::INVALID_LOG_PAGE);
    let (cqe, _) = run(
        &mut r2,
        &mut q,
        feature(false, admin::FEAT_NUMBER_OF_QUEUES, 0),
    );
    assert_eq!(code(&cqe), StatusCode::INVALID_FIELD);
    drop(r);
}

fn rw(op: u8, slba: u64, blocks: u32) -> Sqe {
    let mut s = Sqe::rw(op, 11, 1, slba, blocks);
    s.set_sgl(SglDescriptor::transport(blocks * 512));
    s
}

fn io_setup() -> (Registry, QueueBinding, scsi::LunExport) {
    let (mut r, l) = registry();
    let q = admin_queue(&mut r, SUB);
    let io = io_queue(&mut r, q.cntlid.unwrap(), 1);
    (r, io, l)
}

fn io_op(
    r: &mut Registry,
    q: &mut QueueBinding,
    sqe: Sqe,
    data: &[u8],
) -> Result<IoKind, StatusCode> {
    match r.execute(q, &sqe, &Bytes::copy_from_slice(data), Instant::now()) {
        Outcome::Io(op) => Ok(op.kind),
        Outcome::Done { cqe, .. } => Err(cqe.status.code),
        Outcome::Held => panic!("held"),
    }
}

#[test]
fn nvm_commands_map_to_the_backend() {
    let (mut r, mut q, _) = io_setup();
    assert_eq!(
        io_op(&mut r, &mut q, rw(nvm::READ, 2, 4), &[]),
        Ok(IoKind::Read {
            offset: 1024,
            len: 2048
        })
    );
    let w = io_op(&mut r, &mut q, rw(nvm::WRITE, 0, 1), &[7; 512]).unwrap();
    assert!(matches!(
        w,
        IoKind::Write {
            offset: 0,
            fua: false,
            ..
        }
    ));
    assert!(matches!(
        io_op(&mut r, &mut q, rw(nvm::COMPARE, 0, 1), &[7; 512]),
        Ok(IoKind::Compare { .. })
    ));
    assert_eq!(
        io_op(&mut r, &mut q, Sqe::rw(nvm::FLUSH, 1, 1, 0, 1), &[]),
        Ok(IoKind::Flush)
    );
    let mut all = Sqe::new(nvm::FLUSH, 1);
    all.set_nsid(0xFFFF_FFFF);
    assert_eq!(io_op(&mut r, &mut q, all, &[]), Ok(IoKind::Flush));
    let mut wz = Sqe::rw(nvm::WRITE_ZEROES, 1, 1, 8, 8);
    assert!(matches!(
        io_op(&mut r, &mut q, wz, &[]),
        Ok(IoKind::WriteZeroes {
            offset: 4096,
            len: 4096,
            ..
        })
    ));
    wz.set_cdw(12, wz.cdw(12) | (1 << 25));
    assert!(matches!(
        io_op(&mut r, &mut q, wz, &[]),
        Ok(IoKind::WriteZeroes {
            deallocate: true,
            ..
        })
    ));
    let mut dsm = Sqe::new(nvm::DATASET_MANAGEMENT, 1);
    dsm.set_nsid(1);
    dsm.set_cdw(10, 1);
    dsm.set_cdw(11, nvm::DSM_DEALLOCATE);
    let mut ranges = vec![0u8; 32];
    ranges[4] = 8; // 8 blocks from LBA 16
    ranges[8] = 16;
    ranges[20] = 0; // an empty range is skipped
    assert_eq!(
        io_op(&mut r, &mut q, dsm, &ranges),
        Ok(IoKind::Deallocate(vec![(8192, 4096)]))
    );
    dsm.set_cdw(11, 0);
    assert_eq!(io_op(&mut r, &mut q, dsm, &ranges), Ok(IoKind::Nothing));
}

#[test]
fn nvm_commands_refused_with_their_status() {
    let (mut r, mut q, _) = io_setup();
    let cases: Vec<(Sqe, Vec<u8>, StatusCode)> = vec![
        (
            rw(nvm::READ, BLOCKS - 1, 2),
            vec![],
            StatusCode::LBA_OUT_OF_RANGE,
        ),
        (
            rw(nvm::READ, u64::MAX, 2),
            vec![],
            StatusCode::LBA_OUT_OF_RANGE,
        ),
        (
            Sqe::rw(nvm::WRITE_ZEROES, 1, 1, BLOCKS, 1),
            vec![],
            StatusCode::LBA_OUT_OF_RANGE,
        ),
        (
            {
                let mut s = rw(nvm::READ, 0, 2);
                s.set_sgl(SglDescriptor::transport(512));
                s
            },
            vec![],
            StatusCode::SGL_LENGTH_INVALID,
        ),
        (
            rw(nvm::WRITE, 0, 2),
            vec![0; 512],
            StatusCode::SGL_LENGTH_INVALID,
        ),
        (
            {
                let mut s = rw(nvm::READ, 0, 1);
                s.set_nsid(9);
                s
            },
            vec![],
            StatusCode::INVALID_NAMESPACE,
        ),
        (
            {
                let mut s = rw(nvm::COMPARE, 0, 1);
                s.set_fuse(Fuse::First);
                s
            },
            vec![0; 512],
            StatusCode::INVALID_FIELD,
        ),
        (
            Sqe::rw(0x7C, 1, 1, 0, 1),
            vec![],
            StatusCode::INVALID_OPCODE,
        ),
        (
            {
                let mut s = Sqe::new(nvm::DATASET_MANAGEMENT, 1);
                s.set_nsid(1);
                s.set_cdw(10, 3);
                s
            },
            vec![0; 32],
            StatusCode::SGL_LENGTH_INVALID,
        ),
        (
            {
                let mut s = Sqe::new(nvm::DATASET_MANAGEMENT, 1);
                s.set_nsid(1);
                s.set_cdw(11, nvm::DSM_DEALLOCATE);
                s
            },
            {
                let mut d = vec![0u8; 16];
                d[4] = 1;
                d[8..16].copy_from_slice(&BLOCKS.to_le_bytes());
                d
            },
            StatusCode::LBA_OUT_OF_RANGE,
        ),
    ];
    for (sqe, data, want) in cases {
        assert_eq!(io_op(&mut r, &mut q, sqe, &data), Err(want), "{sqe:?}");
    }
    // A read-only LUN refuses writes.
    let mut ns = BTreeMap::new();
    ns.insert(1, lun(true));
    r.set_namespaces(SUB, ns);
    assert_eq!(
        io_op(&mut r, &mut q, rw(nvm::WRITE, 0, 1), &[0; 512]),
        Err(StatusCode::NAMESPACE_WRITE_PROTECTED)
    );
    assert!(io_op(&mut r, &mut q, rw(nvm::READ, 0, 1), &[]).is_ok());
}

#[tokio::test]
async fn io_runs_on_the_lun() {
    let (mut r, mut q, l) = io_setup();
    let mut go = |sqe: Sqe, data: &[u8]| match r.execute(
        &mut q,
        &sqe,
        &Bytes::copy_from_slice(data),
        Instant::now(),
    ) {
        Outcome::Io(op) => op,
        o => panic!("{o:?}"),
    };
    let pattern: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
    assert_eq!(io::run(go(rw(nvm::WRITE, 4, 2), &pattern)).await, Ok(None));
    let got = io::run(go(rw(nvm::READ, 4, 2), &[]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], &pattern[..]);
    // The LUN's own backend sees it: iSCSI serves the same bytes.
    assert_eq!(
        &l.backend().read_at(2048, 1024).await.unwrap()[..],
        &pattern[..]
    );
    assert_eq!(
        io::run(go(rw(nvm::COMPARE, 4, 2), &pattern)).await,
        Ok(None)
    );
    assert_eq!(
        io::run(go(rw(nvm::COMPARE, 4, 2), &[0; 1024])).await,
        Err(StatusCode::COMPARE_FAILURE)
    );
    assert_eq!(
        io::run(go(Sqe::rw(nvm::WRITE_ZEROES, 1, 1, 4, 1), &[])).await,
        Ok(None)
    );
    let got = io::run(go(rw(nvm::READ, 4, 2), &[]))
        .await
        .unwrap()
        .unwrap();
    assert!(got[..512].iter().all(|&b| b == 0));
    assert_eq!(&got[512..], &pattern[512..]);
    let mut dsm = Sqe::new(nvm::DATASET_MANAGEMENT, 1);
    dsm.set_nsid(1);
    dsm.set_cdw(11, nvm::DSM_DEALLOCATE);
    let mut range = [0u8; 16];
    range[4] = 1;
    range[8] = 5;
    assert_eq!(io::run(go(dsm, &range)).await, Ok(None));
    let got = io::run(go(rw(nvm::READ, 5, 1), &[]))
        .await
        .unwrap()
        .unwrap();
    assert!(got.iter().all(|&b| b == 0));
    assert_eq!(
        io::run(go(Sqe::rw(nvm::FLUSH, 1, 1, 0, 1), &[])).await,
        Ok(None)
    );
}

/// Arbitrary commands on every kind of queue never panic.
#[test]
fn arbitrary_commands_never_panic() {
    let (mut r, mut io, _) = io_setup();
    let mut admin = admin_queue(&mut r, SUB);
    let mut disc = admin_queue(&mut r, DISCOVERY_NQN);
    let mut fresh = QueueBinding::default();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let opcodes = [0u8, 1, 2, 5, 6, 8, 9, 0x0A, 0x0C, 0x18, 0x7F, 0xFF];
    for i in 0..20_000 {
        let mut b = [0u8; 64];
        for c in b.chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        b[0] = opcodes[i % opcodes.len()];
        if i % 3 == 0 {
            b[4..8].copy_from_slice(&1u32.to_le_bytes());
            b[44..48].copy_from_slice(&((next() % 8) as u32).to_le_bytes());
        }
        if b[0] == 0x7F && b[4] == fabrics::CONNECT {
            b[4] = fabrics::PROPERTY_GET;
        }
        let sqe = Sqe::from_bytes(b);
        let len = (next() % 2048) as usize;
        let data = Bytes::from(vec![(next() & 0xFF) as u8; len]);
        for q in [&mut io, &mut admin, &mut disc, &mut fresh] {
            let _ = r.execute(q, &sqe, &data, Instant::now());
        }
    }
    assert!(r.alive(admin.cntlid.unwrap()) || r.controller_count() < 3);
}
