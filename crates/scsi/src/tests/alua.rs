//! ALUA with `[gateway]`: INQUIRY's TPGS and target port designators, REPORT TARGET PORT
//! GROUPS in both formats, the sense each state answers with, the unit attention after a
//! change, and two gateways handing a shared file LUN over through its lock file.

use std::time::{Duration, Instant};

use super::*;
use crate::alua::AccessState;
use crate::config::{BackendConfig, GatewayConfig, PeerConfig};

const TUR: [u8; 6] = [0; 6];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 255, 0];
const VPD_83: [u8; 6] = [0x12, 1, 0x83, 0, 255, 0];
const REPORT_LUNS: [u8; 12] = [0xA0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
const REQUEST_SENSE: [u8; 6] = [0x03, 0, 0, 0, 252, 0];
const MODE_SENSE_6: [u8; 6] = [0x1A, 0, 0x3F, 0, 255, 0];
const STATE_CHANGED: (u8, u8, u8) = (6, 0x2A, 0x06);

fn rtpg(format: u8, alloc: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = 0xA3;
    c[1] = format << 5 | 0x0A;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

fn gateway(name: &str, group: u16, port: u16, peer: (&str, u16, u16)) -> GatewayConfig {
    GatewayConfig {
        group: "test".into(),
        name: name.into(),
        port_group: group,
        relative_port: port,
        preferred: false,
        hold_down_ms: 5000,
        check_interval_ms: 1000,
        reads_take_over: false,
        failback_delay_ms: 0,
        peers: vec![PeerConfig {
            name: peer.0.into(),
            port_group: peer.1,
            relative_port: peer.2,
            preferred: true,
            portals: vec![],
        }],
    }
}

fn gateway_device(gw: GatewayConfig, lun: LunConfig) -> Arc<Device> {
    let d = Device::with_gateway(
        "iqn.2024-01.test:t",
        vec![(0, lun)],
        Arc::new(|_, _| None),
        Some(gw),
    )
    .unwrap();
    d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
    d.nexus_added(NexusId(2), "iqn.init-b,i,0x2", Bytes::new());
    Arc::new(d)
}

/// A RAM LUN (not shared: active/optimized here) on gateway group 3, port 7; the peer
/// "gw-b" is group 1, port 2, preferred.
fn unshared() -> Arc<Device> {
    gateway_device(
        gateway("gw-a", 3, 7, ("gw-b", 1, 2)),
        LunConfig::memory(BLOCKS * BS as u64),
    )
}

fn sense(r: &Response) -> (u8, u8, u8) {
    let d = decode(r);
    (d.key, d.asc, d.ascq)
}

fn force(d: &Device, state: AccessState) {
    d.block_lun(0).unwrap().alua.as_ref().unwrap().force(state);
}

#[test]
fn inquiry_reports_implicit_tpgs_only_with_a_gateway() {
    let r = run(&unshared(), cmd(1, &INQUIRY, &[], 255));
    good(&r);
    assert_eq!(r.data_in[5], 0x18, "3PC and TPGS 01b");
    let r = run(&device(), cmd(1, &INQUIRY, &[], 255));
    assert_eq!(r.data_in[5], 0x08, "no TPGS without [gateway]");
}

#[test]
fn vpd_83_carries_this_gateways_port_and_group() {
    let r = run(&unshared(), cmd(1, &VPD_83, &[], 255));
    good(&r);
    let page = &r.data_in;
    assert_eq!(
        &page[page.len() - 16..],
        &[
            0x51, 0x94, 0x00, 0x04, 0, 0, 0, 7, // iSCSI, PIV, target port, relative port 7
            0x51, 0x95, 0x00, 0x04, 0, 0, 0, 3, // iSCSI, PIV, target port, group 3
        ]
    );
    assert_eq!(
        u16::from_be_bytes([page[2], page[3]]) as usize,
        page.len() - 4
    );
    let r = run(&device(), cmd(1, &VPD_83, &[], 255));
    let page = &r.data_in;
    assert_eq!(&page[page.len() - 8..], &[0x51, 0x94, 0, 4, 0, 0, 0, 1]);
}

#[test]
fn report_target_port_groups_in_both_formats() {
    let d = unshared();
    let groups: [u8; 24] = [
        0x81, 0x8B, 0, 1, 0, 0, 0, 1, 0, 0, 0,
        2, // peer: PREF, non-optimized, group 1, port 2
        0x00, 0x8B, 0, 3, 0, 0, 0, 1, 0, 0, 0, 7, // this gateway: optimized, group 3, port 7
    ];
    let r = run(&d, cmd(1, &rtpg(0, 4096), &[], 4096));
    good(&r);
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 24]);
    assert_eq!(&r.data_in[4..], &groups);
    let r = run(&d, cmd(1, &rtpg(1, 4096), &[], 4096));
    good(&r);
    // Extended header: format type 001b, implicit transition time 5 + 2 + 2 = 9 s.
    assert_eq!(&r.data_in[..8], &[0, 0, 0, 28, 0x10, 9, 0, 0]);
    assert_eq!(&r.data_in[8..], &groups);
    let r = run(&d, cmd(1, &rtpg(1, 6), &[], 6));
    good(&r);
    assert_eq!(&r.data_in[..], &[0, 0, 0, 28, 0x10, 9]);
    let r = run(&d, cmd(1, &rtpg(2, 4096), &[], 4096));
    assert_eq!(decode(&r).field, Some((true, 1)));
    // Without [gateway] there is no such command.
    let r = run(&device(), cmd(1, &rtpg(0, 4096), &[], 4096));
    assert_eq!(sense(&r), (5, 0x24, 0));
}

#[test]
fn supported_operation_codes_list_rtpg_only_with_a_gateway() {
    // REPORTING OPTIONS 2: one command by opcode and service action.
    let rsoc = [0xA3, 0x0C, 0x02, 0xA3, 0x00, 0x0A, 0, 0, 1, 0, 0, 0];
    let r = run(&unshared(), cmd(1, &rsoc, &[], 256));
    good(&r);
    assert_eq!(r.data_in[1] & 0x07, 3, "supported");
    assert_eq!(&r.data_in[4..6], &[0xA3, 0xEA]);
    let r = run(&device(), cmd(1, &rsoc, &[], 256));
    good(&r);
    assert_eq!(r.data_in[1] & 0x07, 1, "not supported");
}

#[test]
fn each_state_serves_what_spc_says_and_refuses_the_rest() {
    let d = unshared();
    let write = write10(0, 1);
    let block = vec![0u8; BS];
    for (state, refusal) in [
        (AccessState::Standby, (2, 0x04, 0x0B)),
        (AccessState::Unavailable, (2, 0x04, 0x0C)),
        (AccessState::Transitioning, (2, 0x04, 0x0A)),
        (AccessState::Offline, (2, 0x04, 0x12)),
    ] {
        force(&d, state);
        // The change is announced first, to each nexus once.
        assert_eq!(sense(&run(&d, cmd(1, &TUR, &[], 0))), STATE_CHANGED);
        assert_eq!(sense(&run(&d, cmd(2, &TUR, &[], 0))), STATE_CHANGED);
        for c in [
            cmd(1, &TUR, &[], 0),
            cmd(1, &read10(0, 1), &[], 512),
            cmd(1, &write, &block, 512),
        ] {
            assert_eq!(sense(&run(&d, c)), refusal, "{state:?}");
        }
        for c in [
            &INQUIRY[..],
            &VPD_83,
            &REQUEST_SENSE,
            &REPORT_LUNS,
            &rtpg(1, 4096),
        ] {
            good(&run(&d, cmd(1, c, &[], 4096)));
        }
        let mode = run(&d, cmd(1, &MODE_SENSE_6, &[], 255));
        if state == AccessState::Standby {
            good(&mode);
        } else {
            assert_eq!(sense(&mode), refusal, "{state:?}");
        }
        let r = run(&d, cmd(1, &rtpg(0, 4096), &[], 4096));
        assert_eq!(r.data_in[16] & 0x0F, state as u8, "RTPG tells the state");
    }
    force(&d, AccessState::ActiveNonOptimized);
    assert_eq!(sense(&run(&d, cmd(1, &TUR, &[], 0))), STATE_CHANGED);
    good(&run(&d, cmd(1, &write, &block, 512)));
    good(&run(&d, cmd(1, &read10(0, 1), &[], 512)));
}

/// Polls `d`'s LUN 0 until `done` holds of its status (10 s at most).
fn wait_for(
    d: &Device,
    what: &str,
    done: impl Fn(&crate::AluaStatus) -> bool,
) -> crate::AluaStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = d.alua_status().remove(0).1;
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}: still {status:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_write_on_the_non_owner_takes_the_shared_lun_over_once() {
    let dir = std::env::temp_dir().join(format!("ironsan-alua-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("lun.img");
    let lock = dir.join("lun.owner");
    let _ = std::fs::remove_file(&lock);
    std::fs::write(&image, vec![0u8; BLOCKS as usize * BS]).unwrap();
    let lun = LunConfig {
        backend: BackendConfig::File {
            path: image,
            create: false,
        },
        owner_lock: Some(lock),
        ..LunConfig::memory(BLOCKS * BS as u64)
    };
    let quick = |mut g: GatewayConfig| {
        g.check_interval_ms = 20;
        g.hold_down_ms = 3000;
        g
    };
    let a = gateway_device(quick(gateway("gw-a", 1, 1, ("gw-b", 2, 2))), lun.clone());
    wait_for(&a, "A owns", |s| s.state == AccessState::ActiveOptimized);
    let b = gateway_device(quick(gateway("gw-b", 2, 2, ("gw-a", 1, 1))), lun);
    let s = wait_for(&b, "B sees A", |s| s.owner.as_deref() == Some("gw-a"));
    assert_eq!(s.state, AccessState::ActiveNonOptimized);
    for d in [&a, &b] {
        new_nexus_hears_the_states_changed(d);
    }
    // B's RTPG: A's group optimized, its own non-optimized.
    let r = run(&b, cmd(1, &rtpg(0, 4096), &[], 4096));
    assert_eq!((r.data_in[4] & 0x0F, r.data_in[16] & 0x0F), (0, 1));
    // Reads on B are served without a takeover.
    good(&run(&b, cmd(1, &read10(0, 1), &[], 512)));

    let block = vec![0x5Au8; BS];
    good(&run(&b, cmd(1, &write10(5, 1), &block, 512)));
    let s = wait_for(&b, "B owns", |s| s.state == AccessState::ActiveOptimized);
    assert_eq!(s.acquired, 1);
    let s = wait_for(&a, "A gave up", |s| {
        s.lost == 1 && s.state == AccessState::Transitioning
    });
    assert_eq!(s.acquired, 1);
    // A announces its change, then refuses medium access during its hold-down.
    assert_eq!(sense(&run(&a, cmd(1, &TUR, &[], 0))), STATE_CHANGED);
    assert_eq!(
        sense(&run(&a, cmd(1, &write10(6, 1), &block, 512))),
        (2, 0x04, 0x0A)
    );
    assert_eq!(
        sense(&run(&a, cmd(1, &read10(5, 1), &[], 512))),
        (2, 0x04, 0x0A)
    );
    // B announced its change too, and reads back what it wrote.
    assert_eq!(sense(&run(&b, cmd(2, &TUR, &[], 0))), STATE_CHANGED);
    let r = run(&b, cmd(2, &read10(5, 1), &[], 512));
    good(&r);
    assert_eq!(&r.data_in[..], &block[..]);
    // A's RTPG: itself transitioning, B (seen in the lock file) optimized.
    wait_for(&a, "A sees B", |s| s.owner.as_deref() == Some("gw-b"));
    let r = run(&a, cmd(1, &rtpg(0, 4096), &[], 4096));
    assert_eq!((r.data_in[4] & 0x0F, r.data_in[16] & 0x0F), (0xF, 0));
    // After the hold-down A is non-optimized again, and nothing moved back.
    let s = wait_for(&a, "A's hold-down ends", |s| {
        s.state == AccessState::ActiveNonOptimized
    });
    assert_eq!((s.acquired, s.lost), (1, 1));
    assert_eq!(b.alua_status()[0].1.acquired, 1);
    // B stopping hands the LUN over; A takes it without being asked.
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(b.release_ownership(Duration::from_secs(5)));
    assert_eq!(b.alua_status()[0].1.state, AccessState::Unavailable);
    wait_for(&a, "A owns again", |s| {
        s.acquired == 2 && s.state == AccessState::ActiveOptimized
    });
}

/// Each nexus's first command to a shared LUN answers ASYMMETRIC ACCESS STATE CHANGED (the
/// host reads the groups again), the next one runs.
fn new_nexus_hears_the_states_changed(d: &Device) {
    for n in [1, 2] {
        assert_eq!(sense(&run(d, cmd(n, &TUR, &[], 0))), STATE_CHANGED);
        good(&run(d, cmd(n, &TUR, &[], 0)));
    }
}

#[test]
fn a_new_nexus_hears_of_shared_luns_states_only() {
    let d = unshared();
    good(&run(&d, cmd(1, &TUR, &[], 0)));
    let dir = tempfile::tempdir().unwrap();
    let g = gateway("gw-a", 1, 1, ("gw-b", 2, 2));
    let a = gateway_device(g, shared_lun(dir.path()));
    wait_for(&a, "A owns", |s| s.state == AccessState::ActiveOptimized);
    new_nexus_hears_the_states_changed(&a);
    a.nexus_added(NexusId(3), "iqn.init-c,i,0x3", Bytes::new());
    assert_eq!(sense(&run(&a, cmd(3, &TUR, &[], 0))), STATE_CHANGED);
    good(&run(&a, cmd(3, &TUR, &[], 0)));
    good(&run(&a, cmd(1, &TUR, &[], 0)));
}

/// A file LUN in `dir` whose ownership the lock file `dir/lun.owner` decides.
fn shared_lun(dir: &std::path::Path) -> LunConfig {
    let image = dir.join("lun.img");
    std::fs::write(&image, vec![0u8; BLOCKS as usize * BS]).unwrap();
    LunConfig {
        backend: BackendConfig::File {
            path: image,
            create: false,
        },
        owner_lock: Some(dir.join("lun.owner")),
        ..LunConfig::memory(BLOCKS * BS as u64)
    }
}

/// Gateway `name` (group and port `id`, peer `peer` with `peer_id`), checking every 20 ms,
/// a 1 s hold-down; preferred with `failback_ms` when that is not `None`.
fn quick_gateway(
    name: &str,
    id: u16,
    peer: &str,
    peer_id: u16,
    failback_ms: Option<u64>,
) -> GatewayConfig {
    let mut g = gateway(name, id, id, (peer, peer_id, peer_id));
    g.check_interval_ms = 20;
    g.hold_down_ms = 1000;
    g.preferred = failback_ms.is_some();
    g.failback_delay_ms = failback_ms.unwrap_or(0);
    g.peers[0].preferred = failback_ms.is_none();
    g
}

fn owned_lost(d: &Device) -> (u64, u64, u64) {
    let s = &d.alua_status()[0].1;
    (s.acquired, s.lost, s.failbacks)
}

#[test]
fn the_preferred_gateway_takes_the_lun_back_once_and_a_host_can_undo_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = gateway_device(
        quick_gateway("gw-b", 2, "gw-a", 1, None),
        shared_lun(dir.path()),
    );
    wait_for(&b, "B owns", |s| s.state == AccessState::ActiveOptimized);
    let started = Instant::now();
    let a = gateway_device(
        quick_gateway("gw-a", 1, "gw-b", 2, Some(300)),
        shared_lun(dir.path()),
    );
    wait_for(&a, "A sees B", |s| s.owner.as_deref() == Some("gw-b"));
    for d in [&a, &b] {
        new_nexus_hears_the_states_changed(d);
    }
    // A's RTPG: its own group non-optimized with PREF, B's optimized.
    let r = run(&a, cmd(1, &rtpg(0, 4096), &[], 4096));
    assert_eq!((r.data_in[4], r.data_in[16]), (0x81, 0x00));
    let s = wait_for(&a, "A fails back", |s| {
        s.state == AccessState::ActiveOptimized
    });
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "not before the delay"
    );
    assert_eq!((s.acquired, s.lost, s.failbacks), (1, 0, 1));
    wait_for(&b, "B gave up", |s| {
        s.lost == 1 && s.state == AccessState::Transitioning
    });
    // Both announce the move; B refuses writes during its hold-down (no takeover).
    assert_eq!(sense(&run(&a, cmd(1, &TUR, &[], 0))), STATE_CHANGED);
    assert_eq!(sense(&run(&b, cmd(1, &TUR, &[], 0))), STATE_CHANGED);
    let block = vec![0xA5u8; BS];
    assert_eq!(
        sense(&run(&b, cmd(1, &write10(3, 1), &block, 512))),
        (2, 0x04, 0x0A)
    );
    good(&run(&a, cmd(1, &write10(3, 1), &block, 512)));
    assert_eq!((owned_lost(&a), owned_lost(&b)), ((1, 0, 1), (1, 1, 0)));
    // A host that insists on B: after B's hold-down its write takes the LUN over again...
    wait_for(&b, "B's hold-down ends", |s| {
        s.state == AccessState::ActiveNonOptimized
    });
    assert_eq!(sense(&run(&b, cmd(1, &TUR, &[], 0))), STATE_CHANGED);
    good(&run(&b, cmd(1, &write10(4, 1), &block, 512)));
    wait_for(&a, "A lost it", |s| s.lost == 1);
    // ... and A does not take it back again: one failback, then the host's choice holds.
    std::thread::sleep(Duration::from_millis(1000 + 3 * 300));
    assert_eq!((owned_lost(&a), owned_lost(&b)), ((1, 1, 1), (2, 1, 0)));
    assert_eq!(a.alua_status()[0].1.state, AccessState::ActiveNonOptimized);
    assert_eq!(sense(&run(&b, cmd(2, &TUR, &[], 0))), STATE_CHANGED);
    let r = run(&b, cmd(2, &read10(3, 2), &[], 1024));
    good(&r);
    assert_eq!(
        &r.data_in[..],
        &[block.clone(), block].concat()[..],
        "no write lost"
    );
}

#[test]
fn a_failback_delay_of_zero_never_fails_back() {
    let dir = tempfile::tempdir().unwrap();
    let b = gateway_device(
        quick_gateway("gw-b", 2, "gw-a", 1, None),
        shared_lun(dir.path()),
    );
    wait_for(&b, "B owns", |s| s.state == AccessState::ActiveOptimized);
    let a = gateway_device(
        quick_gateway("gw-a", 1, "gw-b", 2, Some(0)),
        shared_lun(dir.path()),
    );
    wait_for(&a, "A sees B", |s| s.owner.as_deref() == Some("gw-b"));
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!((owned_lost(&a), owned_lost(&b)), ((0, 0, 0), (1, 0, 0)));
}
