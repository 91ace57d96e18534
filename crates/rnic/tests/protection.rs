//! Protection over the wire, property-tested: a peer names random STags (real, stale, made up),
//! offsets (inside, straddling and outside regions) and lengths against regions with random
//! protection domains and rights. An access the STag table must allow lands exactly where named;
//! any other is answered with a Terminate carrying the code RFC 5040/5041 give for the first
//! failed check, both QPs go to the error state with their receives flushed, and no byte of any
//! region changes.
mod common;
use common::*;
use proptest::prelude::*;
use rdma::*;
use rnic::{AccessError, Mr, Rnic};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
struct RegionSpec {
    other_pd: bool,
    len: usize,
    access: u8,
    invalidated: bool,
}

#[derive(Debug, Clone)]
enum Target {
    /// A region's current STag, at `delta` bytes from its base.
    Real { region: usize, delta: i64 },
    /// A region's STag with a different key byte (a stale or guessed STag).
    WrongKey { region: usize, key: u8 },
    /// Anything.
    Random { stag: u32, to: u64 },
}

fn region_spec() -> impl Strategy<Value = RegionSpec> {
    (
        any::<bool>(),
        1usize..5000,
        0u8..8,
        proptest::bool::weighted(0.15),
    )
        .prop_map(|(other_pd, len, access, invalidated)| RegionSpec {
            other_pd: other_pd && len % 3 == 0,
            len,
            access,
            invalidated,
        })
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        6 => (0usize..8, -80i64..5100).prop_map(|(region, delta)| Target::Real { region, delta }),
        1 => (0usize..8, 1u8..=255).prop_map(|(region, key)| Target::WrongKey { region, key }),
        1 => (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| Target::Random { stag, to }),
    ]
}

struct Region {
    mr: Mr,
    in_qp_pd: bool,
    content: Vec<u8>,
}

/// The checks RFC 5040 §6/§7 and RFC 5041 §7 require before a tagged access touches memory, in
/// the order the STag table applies them, written out independently of it.
fn model(
    regions: &[Region],
    stag: u32,
    to: u64,
    len: u64,
    need: Access,
) -> std::result::Result<(usize, usize), AccessError> {
    let (i, r) = regions
        .iter()
        .enumerate()
        .find(|(_, r)| r.mr.rkey() == stag && r.mr.is_valid())
        .ok_or(AccessError::InvalidStag)?;
    if !r.in_qp_pd {
        return Err(AccessError::WrongPd);
    }
    if !r.mr.access().contains(need) {
        return Err(AccessError::Rights);
    }
    let start = to.checked_sub(r.mr.addr()).ok_or(AccessError::Bounds)?;
    if start
        .checked_add(len)
        .is_none_or(|end| end > r.mr.len() as u64)
    {
        return Err(AccessError::Bounds);
    }
    Ok((i, start as usize))
}

fn snapshot(mr: &Mr) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v);
    v
}

fn one_access(specs: Vec<RegionSpec>, target: Target, len: usize, write: bool, crc: bool) {
    let a = Rnic::new().unwrap();
    let b = Rnic::new().unwrap();
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let pdx = b.alloc_pd().unwrap();
    let mut regions: Vec<Region> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let content = pattern(i as u64 + 7, s.len);
            let pd = if s.other_pd { &pdx } else { &pdb };
            let mr = mr_with(&b, pd, &content, Access(s.access));
            if s.invalidated {
                mr.invalidate();
            }
            Region {
                mr,
                in_qp_pd: !s.other_pd,
                content,
            }
        })
        .collect();
    // The passive side's receive buffer is a region too: remote access to it must fail (rights).
    regions.push(Region {
        mr: b.reg_mr(&pdb, 64, Access::LOCAL_WRITE).unwrap(),
        in_qp_pd: true,
        content: vec![0; 64],
    });
    let rx = regions.len() - 1;
    let a_rx = a.reg_mr(&pda, 64, Access::LOCAL_WRITE).unwrap();

    let (stag, to) = match target {
        Target::Real { region, delta } => {
            let mr = &regions[region % specs.len()].mr;
            (mr.rkey(), mr.addr().wrapping_add_signed(delta))
        }
        Target::WrongKey { region, key } => {
            let s = regions[region % specs.len()].mr.rkey();
            (s ^ key as u32, regions[region % specs.len()].mr.addr())
        }
        Target::Random { stag, to } => (stag, to),
    };
    let need = if write {
        Access::REMOTE_WRITE
    } else {
        Access::REMOTE_READ
    };
    let expected = model(&regions, stag, to, len as u64, need);

    let params = ConnParams {
        crc,
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, eb) = pair(&a, &pda, &b, &pdb, params, |qa, qb| {
        qb.post_recv(RecvWr {
            wr_id: 100,
            sges: vec![regions[rx].mr.sge(0, 64)],
        })
        .unwrap();
        qa.post_recv(RecvWr {
            wr_id: 200,
            sges: vec![a_rx.sge(0, 64)],
        })
        .unwrap();
    });
    let data = pattern(99, len);
    let src = mr_with(&a, &pda, &data, Access::NONE);
    let sink = a.reg_mr(&pda, len, Access::LOCAL_WRITE).unwrap();
    let op = if write {
        SendOp::RdmaWrite {
            remote_addr: to,
            rkey: stag,
        }
    } else {
        SendOp::RdmaRead {
            remote_addr: to,
            rkey: stag,
        }
    };
    ea.qp
        .post_send(SendWr {
            wr_id: 1,
            op,
            sges: vec![if write {
                src.sge(0, len)
            } else {
                sink.sge(0, len)
            }],
            signaled: true,
        })
        .unwrap();
    // A Send behind it: delivered only if the access was accepted (and, for a Write, placed).
    let note = mr_with(&a, &pda, b"after", Access::NONE);
    ea.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sges: vec![note.sge(0, 5)],
            signaled: true,
        })
        .unwrap();

    match expected {
        Ok((i, off)) => {
            let wc = wait_wc(&eb.rcq, T);
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (100, WcStatus::Success, 5)
            );
            let mut sends = [wait_wc(&ea.scq, T), wait_wc(&ea.scq, T)];
            sends.sort_by_key(|w| w.wr_id);
            assert!(
                sends.iter().all(|w| w.status == WcStatus::Success),
                "{sends:?}"
            );
            if write {
                regions[i].content[off..off + len].copy_from_slice(&data);
            } else {
                assert_eq!(snapshot(&sink), regions[i].content[off..off + len]);
            }
            regions[rx].content[..5].copy_from_slice(b"after");
            assert!(ea.qp.state() == QpState::Rts && eb.qp.state() == QpState::Rts);
        }
        Err(e) => {
            let code = if write { e.ddp_code() } else { e.rdmap_code() };
            assert!(
                eb.qp.wait_closed(T) && ea.qp.wait_closed(T),
                "both QPs in error"
            );
            assert_eq!(
                eb.qp.last_error().as_deref(),
                Some(format!("sent Terminate: {code}").as_str())
            );
            assert_eq!(
                ea.qp.last_error().as_deref(),
                Some(format!("peer sent Terminate: {code}").as_str())
            );
            let wc = wait_wc(&eb.rcq, T);
            assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Flushed));
            let wc = wait_wc(&ea.rcq, T);
            assert_eq!((wc.wr_id, wc.status), (200, WcStatus::Flushed));
            let mut sends = [wait_wc(&ea.scq, T), wait_wc(&ea.scq, T)];
            sends.sort_by_key(|w| w.wr_id);
            assert_eq!(sends.map(|w| w.wr_id), [1, 2]);
            if !write {
                assert_eq!(sends[0].status, WcStatus::RemoteAccess, "{sends:?}");
                assert!(snapshot(&sink).iter().all(|&x| x == 0), "read sink written");
            }
        }
    }
    for (i, r) in regions.iter().enumerate() {
        assert!(
            snapshot(&r.mr) == r.content,
            "region {i} changed unexpectedly"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn tagged_accesses_stay_inside_registered_regions(
        specs in proptest::collection::vec(region_spec(), 1..8),
        target in target(),
        len in 1usize..6000,
        write in any::<bool>(),
        crc in any::<bool>(),
    ) {
        one_access(specs, target, len, write, crc);
    }
}

/// The named cases, so each Terminate code is seen whatever the random draws.
#[test]
fn each_violation_has_its_code() {
    let spec = |access: u8, other_pd: bool, invalidated: bool| RegionSpec {
        other_pd,
        len: 999,
        access,
        invalidated,
    };
    for write in [true, false] {
        let all = Access::ALL.0;
        // In bounds, accepted.
        one_access(
            vec![spec(all, false, false)],
            Target::Real {
                region: 0,
                delta: 10,
            },
            989,
            write,
            false,
        );
        // One byte past the end, one byte before the base.
        one_access(
            vec![spec(all, false, false)],
            Target::Real {
                region: 0,
                delta: 10,
            },
            990,
            write,
            false,
        );
        one_access(
            vec![spec(all, false, false)],
            Target::Real {
                region: 0,
                delta: -1,
            },
            1,
            write,
            true,
        );
        // Rights: a read-only region written, a write-only region read.
        let rights = if write {
            Access::REMOTE_READ.0
        } else {
            Access::REMOTE_WRITE.0
        };
        one_access(
            vec![spec(rights, false, false)],
            Target::Real {
                region: 0,
                delta: 0,
            },
            8,
            write,
            false,
        );
        // Another protection domain; an invalidated STag; a stale key.
        one_access(
            vec![spec(all, true, false)],
            Target::Real {
                region: 0,
                delta: 0,
            },
            8,
            write,
            false,
        );
        one_access(
            vec![spec(all, false, true)],
            Target::Real {
                region: 0,
                delta: 0,
            },
            8,
            write,
            false,
        );
        one_access(
            vec![spec(all, false, false)],
            Target::WrongKey { region: 0, key: 1 },
            8,
            write,
            false,
        );
    }
}
