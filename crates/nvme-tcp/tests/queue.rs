//! The controller queue, one sequence per test: the IC exchange, in-capsule writes, R2T and
//! H2CData (in several R2Ts), reads cut into C2HData with and without SUCCESS, commands
//! refused with a status, data digest errors, and each fatal sequence error with its FES.

use bytes::Bytes;
use nvme_tcp::cqe::Cqe;
use nvme_tcp::decoder::{Decoder, DecoderConfig, Role};
use nvme_tcp::pdu::{encode, offset, DataHeader, Framing, IcReq, Pdu, PduHeader, TermReq};
use nvme_tcp::queue::{Action, CloseReason, ControllerQueue, QueueConfig, QueueError};
use nvme_tcp::sqe::{fabrics, nvm, SglDescriptor, Sqe};
use nvme_tcp::{Fes, Status, StatusCode};

/// The host end of a test: what it negotiated and a decoder of what the controller sends.
struct Host {
    tx: Framing,
    rx: Decoder,
}

impl Host {
    fn pdu(&self, h: PduHeader, data: &[u8]) -> Vec<u8> {
        encode(&h, &[data], &self.tx).to_vec()
    }

    /// Decodes every `Send` among `actions`; the other actions are returned.
    fn split(&mut self, actions: Vec<Action>) -> (Vec<Pdu>, Vec<Action>) {
        let mut pdus = Vec::new();
        let mut rest = Vec::new();
        for a in actions {
            match a {
                Action::Send(b) => pdus.extend(self.decode(&b)),
                other => rest.push(other),
            }
        }
        (pdus, rest)
    }

    fn decode(&mut self, mut b: &[u8]) -> Vec<Pdu> {
        let mut v = Vec::new();
        while let Some(p) = self.rx.decode(&mut b).expect("controller PDUs decode") {
            v.push(p);
        }
        v
    }
}

fn connect(config: QueueConfig, hdgst: bool, ddgst: bool) -> (ControllerQueue, Host) {
    let mut q = ControllerQueue::new(config);
    let ic = IcReq {
        pfv: 0,
        hpda: 1,
        hdgst,
        ddgst,
        maxr2t: 0,
    };
    let bytes = encode(&PduHeader::IcReq(ic), &[], &Framing::default()).to_vec();
    let actions = q.receive(&bytes);
    let mut rx = Decoder::new(DecoderConfig::new(Role::Host, 1 << 20, 0));
    let [Action::Send(b)] = &actions[..] else {
        panic!("{actions:?}")
    };
    let mut input = &b[..];
    let Some(Pdu {
        header: PduHeader::IcResp(resp),
        ..
    }) = rx.decode(&mut input).unwrap()
    else {
        panic!()
    };
    assert_eq!(resp.maxh2cdata, config.maxh2cdata);
    let mut dc = *rx.config();
    dc.framing = Framing {
        hdgst: resp.hdgst,
        ddgst: resp.ddgst,
        pda: 1,
    };
    rx.set_config(dc);
    let tx = Framing {
        hdgst: resp.hdgst,
        ddgst: resp.ddgst,
        pda: resp.cpda,
    };
    assert!(q.is_ready());
    (q, Host { tx, rx })
}

fn executed(actions: &[Action]) -> Vec<(u16, Bytes)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Execute(c) => Some((c.sqe.cid(), c.data.clone())),
            _ => None,
        })
        .collect()
}

fn fatal_of(actions: &[Action]) -> (Fes, u32) {
    match actions.last() {
        Some(Action::Close(CloseReason::Fatal(e))) => (e.fes, e.fei),
        other => panic!("expected a fatal close, got {other:?}"),
    }
}

fn write_sqe(cid: u16, len: u32) -> Sqe {
    let mut s = Sqe::rw(nvm::WRITE, cid, 1, 0, len / 512);
    s.set_sgl(SglDescriptor::transport(len));
    s
}

fn read_sqe(cid: u16, len: u32) -> Sqe {
    let mut s = Sqe::rw(nvm::READ, cid, 1, 0, len / 512);
    s.set_sgl(SglDescriptor::transport(len));
    s
}

#[test]
fn ic_exchange_enables_what_both_allow() {
    let cfg = QueueConfig {
        allow_ddgst: false,
        ..QueueConfig::default()
    };
    let (q, host) = connect(cfg, true, true);
    assert_eq!(
        host.tx,
        Framing {
            hdgst: true,
            ddgst: false,
            pda: 0
        }
    );
    assert_eq!(
        q.tx_framing(),
        Framing {
            hdgst: true,
            ddgst: false,
            pda: 1
        }
    );
}

#[test]
fn icreq_with_pfv_1_is_an_unsupported_parameter() {
    let mut q = ControllerQueue::new(QueueConfig::default());
    let ic = IcReq {
        pfv: 1,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    };
    let a = q.receive(&encode(&PduHeader::IcReq(ic), &[], &Framing::default()).to_vec());
    assert_eq!(fatal_of(&a), (Fes::UnsupportedParameter, offset::PFV));
    // The TermReq carries the ICReq's header back.
    let Action::Send(b) = &a[0] else { panic!() };
    assert_eq!(b[0], 0x03);
    assert_eq!(
        u16::from_le_bytes([b[8], b[9]]),
        Fes::UnsupportedParameter as u16
    );
    assert_eq!(b.len(), 24 + 128);
    assert!(
        q.receive(&[0; 8]).is_empty(),
        "closed connections take nothing"
    );
}

#[test]
fn a_capsule_before_the_ic_exchange_is_a_sequence_error() {
    let mut q = ControllerQueue::new(QueueConfig::default());
    let b = encode(
        &PduHeader::CapsuleCmd(read_sqe(1, 512)),
        &[],
        &Framing::default(),
    )
    .to_vec();
    assert_eq!(fatal_of(&q.receive(&b)).0, Fes::PduSequenceError);
}

#[test]
fn connect_with_in_capsule_data_then_response() {
    let (mut q, mut host) = connect(QueueConfig::default(), false, true);
    let c = fabrics::Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 5000,
    };
    let data = fabrics::ConnectData {
        hostid: [7; 16],
        cntlid: fabrics::CNTLID_DYNAMIC,
        subnqn: "nqn.2026-11.org.ironsan:lun0".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
    };
    let bytes = host.pdu(PduHeader::CapsuleCmd(c.to_sqe(0)), &data.to_bytes());
    let a = q.receive(&bytes);
    let [Action::Execute(cmd)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!(fabrics::Connect::parse(&cmd.sqe), c);
    assert_eq!(fabrics::ConnectData::parse(&cmd.data).unwrap(), data);
    q.set_sq(32, false);
    let mut cqe = Cqe::new(0, Status::SUCCESS);
    cqe.dw0 = 1; // controller ID
    let resp = q.respond(cqe).unwrap().to_vec();
    let p = host.decode(&resp);
    let PduHeader::CapsuleResp(got) = p[0].header else {
        panic!()
    };
    assert_eq!((got.cid, got.dw0, got.sqhd), (0, 1, 1));
    assert_eq!(q.respond(cqe).err(), Some(QueueError::UnknownCommand(0)));
}

#[test]
fn write_through_r2ts_respecting_their_length() {
    let cfg = QueueConfig {
        maxh2cdata: 4096,
        max_r2t_len: 8192,
        ..QueueConfig::default()
    };
    let (mut q, mut host) = connect(cfg, true, true);
    let payload: Vec<u8> = (0..20000u32).map(|i| i as u8).collect();
    let (pdus, rest) =
        host.split(q.receive(&host.pdu(PduHeader::CapsuleCmd(write_sqe(5, 20000)), &[])));
    assert!(rest.is_empty());
    let mut r2ts = 0;
    let mut pending = pdus;
    let mut done = None;
    for _ in 0..10 {
        let Some(Pdu {
            header: PduHeader::R2T(r2t),
            ..
        }) = pending.pop()
        else {
            break;
        };
        r2ts += 1;
        assert_eq!(r2t.cid, 5);
        assert!(r2t.length <= 8192);
        let mut at = r2t.offset;
        let end = r2t.offset + r2t.length;
        let mut actions = Vec::new();
        while at < end {
            let n = (end - at).min(4096);
            let h = DataHeader {
                cid: 5,
                ttag: r2t.ttag,
                offset: at,
                last: at + n == end,
                success: false,
            };
            actions.extend(q.receive(&host.pdu(
                PduHeader::H2CData(h),
                &payload[at as usize..(at + n) as usize],
            )));
            at += n;
        }
        let (p, rest) = host.split(actions);
        pending = p;
        if !rest.is_empty() {
            done = Some(rest);
        }
    }
    assert_eq!(r2ts, 3);
    let done = done.expect("executed");
    assert_eq!(executed(&done), vec![(5, Bytes::from(payload))]);
    let p = host.decode(&q.respond(Cqe::new(5, Status::SUCCESS)).unwrap().to_vec());
    assert!(
        matches!(p[0].header, PduHeader::CapsuleResp(c) if c.cid == 5 && c.status.is_success())
    );
}

#[test]
fn read_cut_into_c2h_data_then_response() {
    let cfg = QueueConfig {
        c2h_cut: 1000,
        ..QueueConfig::default()
    };
    let (mut q, mut host) = connect(cfg, true, true);
    let a = q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(9, 2500)), &[]));
    assert_eq!(executed(&a), vec![(9, Bytes::new())]);
    let data = vec![0x5A; 2500];
    let (a, b) = data.split_at(1200);
    assert!(matches!(
        q.respond_with_data(Cqe::new(9, Status::SUCCESS), &[&data, &data]),
        Err(QueueError::DataTooLong { .. })
    ));
    let pdus = q
        .respond_with_data(Cqe::new(9, Status::SUCCESS), &[a, b])
        .unwrap();
    let mut got = Vec::new();
    let mut decoded = Vec::new();
    for p in &pdus {
        decoded.extend(host.decode(&p.to_vec()));
    }
    let n = decoded.len();
    assert_eq!(n, 4);
    for (i, p) in decoded.iter().enumerate() {
        match p.header {
            PduHeader::C2HData(d) => {
                assert_eq!(
                    (d.cid, d.offset as usize, d.last, d.success),
                    (9, got.len(), i == 2, false)
                );
                got.extend_from_slice(&p.data);
            }
            PduHeader::CapsuleResp(c) => assert_eq!((i, c.cid), (3, 9)),
            ref h => panic!("{h:?}"),
        }
    }
    assert_eq!(got, data);
}

#[test]
fn read_ends_with_success_when_sq_flow_control_is_off() {
    let (mut q, mut host) = connect(QueueConfig::default(), false, false);
    q.set_sq(128, true);
    q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(3, 512)), &[]));
    let pdus = q
        .respond_with_data(Cqe::new(3, Status::SUCCESS), &[&[1; 512]])
        .unwrap();
    assert_eq!(pdus.len(), 1);
    let p = host.decode(&pdus[0].to_vec());
    assert!(matches!(p[0].header, PduHeader::C2HData(d) if d.last && d.success));
    // A failed read still gets its response capsule.
    q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(4, 512)), &[]));
    let err = Status::error(StatusCode::UNRECOVERED_READ_ERROR, true);
    assert_eq!(q.respond_with_data(Cqe::new(4, err), &[]).unwrap().len(), 1);
}

#[test]
fn in_capsule_write_and_its_sgl_checks() {
    let (mut q, mut host) = connect(QueueConfig::default(), false, false);
    let mut s = Sqe::rw(nvm::WRITE, 1, 1, 0, 1);
    s.set_sgl(SglDescriptor::in_capsule(512));
    assert_eq!(
        executed(&q.receive(&host.pdu(PduHeader::CapsuleCmd(s), &[3; 512]))),
        vec![(1, Bytes::from(vec![3; 512]))]
    );
    let refused = |q: &mut ControllerQueue, host: &mut Host, s: Sqe, data: &[u8]| {
        let (p, rest) = host.split(q.receive(&host.pdu(PduHeader::CapsuleCmd(s), data)));
        assert!(rest.is_empty());
        match p[..] {
            [Pdu {
                header: PduHeader::CapsuleResp(c),
                ..
            }] => c.status.code,
            _ => panic!("{p:?}"),
        }
    };
    let mut s2 = s;
    s2.set_cid(2);
    s2.set_sgl(SglDescriptor::in_capsule(100));
    assert_eq!(
        refused(&mut q, &mut host, s2, &[0; 512]),
        StatusCode::SGL_LENGTH_INVALID
    );
    s2.set_sgl(SglDescriptor {
        address: 8,
        length: 512,
        id: 0x01,
    });
    assert_eq!(
        refused(&mut q, &mut host, s2, &[0; 512]),
        StatusCode::SGL_OFFSET_INVALID
    );
    s2.set_sgl(SglDescriptor {
        address: 0,
        length: 512,
        id: 0x40,
    });
    assert_eq!(
        refused(&mut q, &mut host, s2, &[]),
        StatusCode::SGL_TYPE_INVALID
    );
    s2.set_sgl(SglDescriptor::transport(64 << 20));
    assert_eq!(
        refused(&mut q, &mut host, s2, &[]),
        StatusCode::SGL_LENGTH_INVALID
    );
    assert_eq!(
        refused(&mut q, &mut host, read_sqe(3, 512), &[1; 4]),
        StatusCode::INVALID_FIELD
    );
    // A refused CID is free again.
    assert_eq!(
        executed(&q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(2, 512)), &[]))).len(),
        1
    );
}

#[test]
fn flush_and_keep_alive_carry_no_data() {
    let (mut q, host) = connect(QueueConfig::default(), false, false);
    let mut f = Sqe::new(nvm::FLUSH, 11);
    f.set_sgl(SglDescriptor::transport(0));
    assert_eq!(
        executed(&q.receive(&host.pdu(PduHeader::CapsuleCmd(f), &[]))),
        vec![(11, Bytes::new())]
    );
}

fn h2c(host: &Host, cid: u16, ttag: u16, offset: u32, len: usize, last: bool) -> Vec<u8> {
    host.pdu(
        PduHeader::H2CData(DataHeader {
            cid,
            ttag,
            offset,
            last,
            success: false,
        }),
        &vec![0; len],
    )
}

/// A write of 8192 bytes whose R2T asked for all of it; returns its TTAG.
fn pending_write(q: &mut ControllerQueue, host: &mut Host) -> u16 {
    let (p, _) = host.split(q.receive(&host.pdu(PduHeader::CapsuleCmd(write_sqe(1, 8192)), &[])));
    let [Pdu {
        header: PduHeader::R2T(r),
        ..
    }] = p[..]
    else {
        panic!()
    };
    assert_eq!((r.offset, r.length), (0, 8192));
    r.ttag
}

#[test]
fn h2c_data_sequence_errors() {
    type Case = fn(&Host, u16) -> Vec<u8>;
    let cases: [(Case, Fes, u32); 7] = [
        (
            |h, t| h2c(h, 2, t, 0, 512, false),
            Fes::InvalidHeaderField,
            offset::CCCID,
        ),
        (
            |h, t| h2c(h, 1, t ^ 1, 0, 512, false),
            Fes::InvalidHeaderField,
            offset::TTAG,
        ),
        (
            |h, t| h2c(h, 1, t, 512, 512, false),
            Fes::PduSequenceError,
            0,
        ),
        (|h, t| h2c(h, 1, t, 8000, 512, true), Fes::DataOutOfRange, 0),
        (|h, t| h2c(h, 1, t, 0, 512, true), Fes::PduSequenceError, 0),
        (
            |h, t| h2c(h, 1, t, 0, 8192, false),
            Fes::PduSequenceError,
            0,
        ),
        (
            |h, t| h2c(h, 1, t, 0, 70000, false),
            Fes::R2tLimitExceeded,
            0,
        ),
    ];
    for (i, (make, fes, fei)) in cases.into_iter().enumerate() {
        let cfg = QueueConfig {
            maxh2cdata: 65536,
            ..QueueConfig::default()
        };
        let (mut q, mut host) = connect(cfg, false, false);
        let ttag = pending_write(&mut q, &mut host);
        let a = q.receive(&make(&host, ttag));
        assert_eq!(fatal_of(&a), (fes, fei), "case {i}");
        let (p, _) = host.split(a);
        assert!(
            matches!(p[0].header, PduHeader::C2HTermReq(t) if t.fes == fes as u16 && t.fei == fei)
        );
        assert_eq!(q.outstanding(), 0);
    }
}

#[test]
fn h2c_data_for_a_read_and_duplicate_cids_are_fatal() {
    let (mut q, host) = connect(QueueConfig::default(), false, false);
    q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(1, 512)), &[]));
    assert_eq!(
        fatal_of(&q.receive(&h2c(&host, 1, 0, 0, 512, true))).0,
        Fes::PduSequenceError
    );
    let (mut q, host) = connect(QueueConfig::default(), false, false);
    q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(1, 512)), &[]));
    let a = q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(1, 512)), &[]));
    assert_eq!(fatal_of(&a), (Fes::InvalidHeaderField, offset::CAPSULE_CID));
}

#[test]
fn more_commands_than_the_queue_holds_is_fatal() {
    let (mut q, host) = connect(QueueConfig::default(), false, false);
    q.set_sq(2, false);
    for cid in 0..2 {
        assert_eq!(
            executed(&q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(cid, 512)), &[]))).len(),
            1
        );
    }
    assert_eq!(
        fatal_of(&q.receive(&host.pdu(PduHeader::CapsuleCmd(read_sqe(2, 512)), &[]))).0,
        Fes::PduSequenceError
    );
}

#[test]
fn a_data_digest_error_fails_only_its_command() {
    let (mut q, mut host) = connect(QueueConfig::default(), false, true);
    let ttag = pending_write(&mut q, &mut host);
    let mut first = h2c(&host, 1, ttag, 0, 4096, false);
    let n = first.len();
    first[n - 1] ^= 1;
    assert!(q.receive(&first).is_empty());
    let (p, rest) = host.split(q.receive(&h2c(&host, 1, ttag, 4096, 4096, true)));
    assert!(rest.is_empty());
    assert!(
        matches!(p[0].header, PduHeader::CapsuleResp(c) if c.cid == 1 && c.status.code == StatusCode::TRANSIENT_TRANSPORT_ERROR)
    );
    assert_eq!(q.outstanding(), 0);
    // A capsule whose in-capsule data fails its digest is answered the same way.
    let mut s = Sqe::rw(nvm::WRITE, 2, 1, 0, 1);
    s.set_sgl(SglDescriptor::in_capsule(512));
    let mut b = host.pdu(PduHeader::CapsuleCmd(s), &[9; 512]);
    let n = b.len();
    b[n - 1] ^= 1;
    let (p, _) = host.split(q.receive(&b));
    assert!(
        matches!(p[0].header, PduHeader::CapsuleResp(c) if c.cid == 2 && !c.status.is_success())
    );
    assert!(q.is_ready());
}

#[test]
fn the_host_terminating_closes_without_an_answer() {
    let (mut q, host) = connect(QueueConfig::default(), false, false);
    let t = TermReq { fes: 2, fei: 0 };
    let a = q.receive(&host.pdu(PduHeader::H2CTermReq(t), &[1; 24]));
    assert_eq!(a, vec![Action::Close(CloseReason::HostTerminated(t))]);
    assert!(!q.is_ready());
}

#[test]
fn pdus_split_anywhere_give_the_same_actions() {
    let (mut whole, host) = connect(QueueConfig::default(), true, true);
    let (mut bytewise, _) = connect(QueueConfig::default(), true, true);
    let mut s = Sqe::rw(nvm::WRITE, 1, 1, 0, 1);
    s.set_sgl(SglDescriptor::in_capsule(512));
    let mut stream = host.pdu(PduHeader::CapsuleCmd(s), &[3; 512]);
    stream.extend(host.pdu(PduHeader::CapsuleCmd(read_sqe(2, 4096)), &[]));
    let a = whole.receive(&stream);
    let b: Vec<Action> = stream
        .iter()
        .flat_map(|x| bytewise.receive(std::slice::from_ref(x)))
        .collect();
    assert_eq!(a, b);
    assert_eq!(executed(&a).len(), 2);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    /// Host PDUs near the valid ones: commands of each direction with either SGL, H2CData
    /// with small CIDs, TTAGs and offsets.
    fn host_pdu() -> impl Strategy<Value = (PduHeader, Vec<u8>)> {
        prop_oneof![
            (
                0u16..4,
                prop_oneof![Just(nvm::READ), Just(nvm::WRITE), Just(nvm::FLUSH)],
                0u32..3,
                any::<bool>()
            )
                .prop_map(|(cid, op, blocks, inline)| {
                    let mut s = Sqe::rw(op, cid, 1, 0, blocks.max(1));
                    let len = blocks * 512;
                    let data = if inline && op == nvm::WRITE {
                        vec![1; len as usize]
                    } else {
                        vec![]
                    };
                    s.set_sgl(if inline {
                        SglDescriptor::in_capsule(len)
                    } else {
                        SglDescriptor::transport(len)
                    });
                    (PduHeader::CapsuleCmd(s), data)
                }),
            (0u16..4, 0u16..3, 0u32..3, 1usize..3, any::<bool>()).prop_map(
                |(cid, ttag, at, n, last)| {
                    let d = DataHeader {
                        cid,
                        ttag,
                        offset: at * 512,
                        last,
                        success: false,
                    };
                    (PduHeader::H2CData(d), vec![2; n * 512])
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn any_host_sequence_is_answered_with_well_formed_pdus(
            pdus in proptest::collection::vec(host_pdu(), 0..24),
            answer in any::<u32>(),
        ) {
            let (mut q, mut host) = connect(QueueConfig { max_r2t_len: 512, ..QueueConfig::default() }, true, true);
            q.set_sq(3, false);
            for (h, data) in pdus {
                let actions = q.receive(&host.pdu(h, &data));
                let closed = actions.iter().any(|a| matches!(a, Action::Close(_)));
                let (_sent, rest) = host.split(actions);
                prop_assert!(q.outstanding() <= 3);
                for a in rest {
                    if let Action::Execute(c) = a {
                        let cid = c.sqe.cid();
                        if answer & (1 << (cid % 32)) != 0 {
                            let len = c.sqe.sgl().length as usize;
                            let data = vec![0; len];
                            for p in q.respond_with_data(Cqe::new(cid, Status::SUCCESS), &[&data]).unwrap_or_default() {
                                host.decode(&p.to_vec());
                            }
                            if c.sqe.opcode() != nvm::READ {
                                let _ = q.respond(Cqe::new(cid, Status::SUCCESS)).map(|p| host.decode(&p.to_vec()));
                            }
                        }
                    }
                }
                if closed {
                    prop_assert!(!q.is_ready());
                    break;
                }
            }
        }
    }
}
