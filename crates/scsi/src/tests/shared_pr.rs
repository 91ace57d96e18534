//! Two gateways (two `Device`s, relative target ports 1 and 2) exporting one LUN whose
//! persistent reservations live in one shared file.

use std::path::Path;

use super::*;
use crate::sense::key;

const X: &str = "iqn.init-x,i,0x1";
const Y: &str = "iqn.init-y,i,0x2";

/// A gateway: relative port `rtp`, X on nexus 1 and Y on nexus 2.
fn gateway(record: &Path, rtp: u16) -> Device {
    let mut cfg = LunConfig::memory(BLOCKS * BS as u64);
    cfg.reservations = Some(record.to_path_buf());
    let d = Device::new("iqn.2024-01.test:shared", vec![(0, cfg)]).unwrap();
    d.set_relative_port(rtp);
    d.nexus_added(NexusId(1), X, Bytes::new());
    d.nexus_added(NexusId(2), Y, Bytes::new());
    d
}

fn prout(sa: u8, rtype: u8, key: u64, sa_key: u64, all_tg_pt: bool) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = if all_tg_pt { 0x04 } else { 0 };
    (vec![0x5F, sa, rtype, 0, 0, 0, 0, 0, 24, 0], p)
}

fn pr_out(d: &Device, nexus: u64, sa: u8, rtype: u8, key: u64, sa_key: u64, all: bool) -> u8 {
    let (c, p) = prout(sa, rtype, key, sa_key, all);
    run(d, cmd(nexus, &c, &p, 24)).status
}

fn pr_in(d: &Device, nexus: u64, sa: u8) -> Bytes {
    let r = run(
        d,
        cmd(nexus, &[0x5E, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[], 4096),
    );
    good(&r);
    r.data_in
}

fn keys(d: &Device, nexus: u64) -> Vec<u64> {
    let data = pr_in(d, nexus, 0);
    let len = be32_at(&data, 4) as usize;
    data[8..8 + len]
        .chunks(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect()
}

/// READ RESERVATION: (key, type) of the reservation, if any.
fn reservation(d: &Device, nexus: u64) -> Option<(u64, u8)> {
    let data = pr_in(d, nexus, 1);
    (be32_at(&data, 4) == 16).then(|| {
        let key = u64::from_be_bytes(data[8..16].try_into().unwrap());
        (key, data[21] & 0x0F)
    })
}

fn write_status(d: &Device, nexus: u64) -> u8 {
    run(d, cmd(nexus, &write10(0, 1), &[7u8; BS], BS as u32)).status
}

#[test]
fn a_reservation_through_one_gateway_holds_through_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("lun0.pr");
    let a = gateway(&record, 1);
    let b = gateway(&record, 2);
    assert_eq!(pr_out(&a, 1, 0, 0, 0, 0xA, false), status::GOOD);
    assert_eq!(pr_out(&a, 1, 1, 1, 0xA, 0, false), status::GOOD); // WRITE EXCLUSIVE
                                                                  // B's next command sees the record's file changed and reads it: Y cannot write there.
    assert_eq!(write_status(&b, 2), status::RESERVATION_CONFLICT);
    good(&run(&b, cmd(2, &read10(0, 1), &[], BS as u32)));
    // PERSISTENT RESERVE IN through B reports what was done through A.
    assert_eq!(keys(&b, 2), vec![0xA]);
    assert_eq!(reservation(&b, 2), Some((0xA, 1)));
    // X registered through A's port only: its nexus through B is another, unregistered one.
    assert_eq!(write_status(&b, 1), status::RESERVATION_CONFLICT);
    assert_eq!(write_status(&a, 1), status::GOOD);
    // READ FULL STATUS names the target port X registered through.
    let full = pr_in(&b, 2, 3);
    assert_eq!(be32_at(&full, 4), 24);
    assert_eq!(full[20], 0x01, "R_HOLDER, not ALL_TG_PT");
    assert_eq!(&full[26..28], &1u16.to_be_bytes());
}

#[test]
fn all_tg_pt_preempt_unit_attentions_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("lun0.pr");
    let a = gateway(&record, 1);
    let b = gateway(&record, 2);
    // X registers through A for every target port and reserves WRITE EXCLUSIVE.
    assert_eq!(pr_out(&a, 1, 0, 0, 0, 0xA, true), status::GOOD);
    assert_eq!(pr_out(&a, 1, 1, 1, 0xA, 0, false), status::GOOD);
    assert_eq!(write_status(&b, 1), status::GOOD, "X holds through B too");
    assert_eq!(write_status(&b, 2), status::RESERVATION_CONFLICT);
    let full = pr_in(&b, 2, 3);
    assert_eq!(full[20], 0x03, "R_HOLDER and ALL_TG_PT");
    // Y registers through B and preempts X.
    assert_eq!(pr_out(&b, 2, 0, 0, 0, 0xB, false), status::GOOD);
    assert_eq!(pr_out(&b, 2, 4, 1, 0xB, 0xA, false), status::GOOD);
    assert_eq!(write_status(&b, 2), status::GOOD);
    // X's nexus through B hears it, and through A on its next command there.
    let preempted = (key::UNIT_ATTENTION, 0x2A, 0x05);
    let tur = [0u8; 6];
    assert_eq!(sense_code(&run(&b, cmd(1, &tur, &[], 0))), preempted);
    assert_eq!(sense_code(&run(&a, cmd(1, &tur, &[], 0))), preempted);
    good(&run(&a, cmd(1, &tur, &[], 0)));
    assert_eq!(write_status(&a, 1), status::RESERVATION_CONFLICT);
    // Y's nexus through A is not the holder (Y registered through B only).
    good(&run(&a, cmd(2, &tur, &[], 0)));
    assert_eq!(write_status(&a, 2), status::RESERVATION_CONFLICT);
    // Gateway B restarts: the reservation is still Y's, enforced from the start.
    drop(b);
    let b = gateway(&record, 2);
    assert_eq!(reservation(&b, 1), Some((0xB, 1)));
    assert_eq!(keys(&b, 1), vec![0xB]);
    assert_eq!(write_status(&b, 2), status::GOOD);
    assert_eq!(write_status(&b, 1), status::RESERVATION_CONFLICT);
    // Gateways race: each registers its own key many times; none is lost.
    std::thread::scope(|s| {
        for (d, nexus) in [(&a, 2u64), (&b, 1)] {
            s.spawn(move || {
                for _ in 0..20 {
                    assert_eq!(pr_out(d, nexus, 6, 0, 0, 0xC0 + nexus, false), status::GOOD);
                }
            });
        }
    });
    let mut k = keys(&a, 1);
    k.sort_unstable();
    assert_eq!(k, vec![0xB, 0xC1, 0xC2]);
    let generation = be32_at(&pr_in(&a, 1, 0), 0);
    // 1 (X) + 1 (Y) + 1 (preempt) + 40 registrations.
    assert_eq!(generation, 43);
}

#[test]
fn a_corrupt_record_stops_the_lun_from_being_built() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("lun0.pr");
    {
        let a = gateway(&record, 1);
        assert_eq!(pr_out(&a, 1, 0, 0, 0, 0xA, false), status::GOOD);
    }
    let mut raw = std::fs::read(&record).unwrap();
    *raw.last_mut().unwrap() ^= 0xFF;
    std::fs::write(&record, raw).unwrap();
    let mut cfg = LunConfig::memory(BLOCKS * BS as u64);
    cfg.reservations = Some(record.clone());
    let e = Device::new("iqn.2024-01.test:shared", vec![(0, cfg)])
        .err()
        .unwrap();
    assert!(e.message.contains("corrupt"), "{e}");
}

#[test]
fn aptpl_is_accepted_only_where_reservations_are_shared() {
    let dir = tempfile::tempdir().unwrap();
    let a = gateway(&dir.path().join("lun0.pr"), 1);
    let caps = pr_in(&a, 1, 2);
    assert_eq!(caps[2] & 0x01, 0x01, "PTPL_C");
    let (c, mut p) = prout(0, 0, 0, 0xA, false);
    p[20] = 0x01;
    good(&run(&a, cmd(1, &c, &p, 24)));
    assert_eq!(pr_in(&a, 1, 2)[3] & 0x01, 0x01, "PTPL_A");
    let local = device();
    assert_eq!(pr_in(&local, 1, 2)[2] & 0x01, 0, "no PTPL_C in memory");
    assert_eq!(
        decode(&run(&local, cmd(1, &c, &p, 24))).asc,
        0x26,
        "APTPL refused in memory"
    );
}

/// A shared record that cannot be read while `down` is set (a cluster not reached yet).
#[derive(Debug, Default)]
struct LateBlob {
    down: std::sync::atomic::AtomicBool,
    record: std::sync::Mutex<(u64, Vec<u8>)>,
}

impl storage::SharedBlob for LateBlob {
    fn read(&self) -> std::io::Result<(u64, Vec<u8>)> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("cluster not reached"));
        }
        Ok(self.record.lock().unwrap().clone())
    }
    fn compare_and_write(&self, expected: u64, data: &[u8]) -> std::io::Result<Option<u64>> {
        let mut r = self.record.lock().unwrap();
        if r.0 != expected {
            return Ok(None);
        }
        *r = (expected + 1, data.to_vec());
        Ok(Some(r.0))
    }
}

/// A LUN whose record could not be read at start (`SharedPr::unread`) keeps trying at its
/// commands, and takes the registrations made through other gateways once it reads it,
/// without raising the unit attentions logged before.
#[test]
fn a_record_not_read_at_start_is_read_when_it_can_be() {
    use crate::pr::{Notice, PrState, Registration};
    use crate::pr_shared::{Record, SharedPr, REFRESH};

    let mut rec = Record {
        pr: PrState {
            regs: vec![Registration {
                port: X.into(),
                rtp: 2,
                all_tg_pt: false,
                key: 0xAB,
                transport_id: Bytes::new(),
            }],
            generation: 1,
            ..PrState::default()
        },
        ..Record::default()
    };
    rec.log_notices(vec![Notice {
        code: (0x2A, 0x03),
        port: Y.into(),
        rtp: 2,
        all_tg_pt: true,
    }]);
    let blob = Arc::new(LateBlob::default());
    *blob.record.lock().unwrap() = (5, rec.encode());
    blob.down.store(true, std::sync::atomic::Ordering::SeqCst);

    let dev = Device::new("iqn.2024-01.test:late", vec![]).unwrap();
    dev.nexus_added(NexusId(2), Y, Bytes::new());
    let backend = Arc::new(storage::MemoryBackend::new(BLOCKS * BS as u64));
    let lun = crate::lun::Lun::new(
        0,
        LunConfig::memory(BLOCKS * BS as u64),
        backend,
        vec![0x60; 16],
        "late".into(),
        "iqn.2024-01.test:late",
        None,
    )
    .with_shared_pr(SharedPr::unread(blob.clone(), None), PrState::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let shared = lun.shared_pr.as_ref().unwrap();
    assert!(shared.due(), "a record never read is due at once");
    rt.block_on(lun.refresh_shared(&dev));
    assert!(lun.state().pr.regs.is_empty(), "nothing read yet");

    blob.down.store(false, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(REFRESH + std::time::Duration::from_millis(10));
    assert!(shared.due());
    rt.block_on(lun.refresh_shared(&dev));
    let pr = lun.state().pr.clone();
    assert_eq!(pr.regs.len(), 1);
    assert_eq!((pr.regs[0].key, pr.generation), (0xAB, 1));
    let ua = lun.state().ua.get(&NexusId(2)).map_or(0, |q| q.len());
    assert_eq!(
        ua, 0,
        "the notice logged before the first read is not raised"
    );
}
