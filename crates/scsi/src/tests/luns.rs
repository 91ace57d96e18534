//! LUNs added and removed while the device runs: REPORT LUNS follows at once, every nexus
//! hears REPORTED LUNS DATA HAS CHANGED once, a removed LUN is not supported, commands
//! running on it finish.

use super::*;
use crate::device::LunChangeError;

const TUR: [u8; 6] = [0, 0, 0, 0, 0, 0];
const REPORT_LUNS: [u8; 12] = [0xA0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
const LUNS_CHANGED: (u8, u8, u8) = (6, 0x3F, 0x0E);
const NOT_SUPPORTED: (u8, u8, u8) = (5, 0x25, 0x00);

fn ram() -> LunConfig {
    LunConfig::memory(BLOCKS * BS as u64)
}

/// `c` sent by `nexus` to `lun`.
fn to(nexus: u64, lun: u64, cdb: &[u8], data_out: &[u8], edtl: u32) -> Command {
    let mut c = cmd(nexus, cdb, data_out, edtl);
    c.lun = lun;
    c
}

/// The LUN numbers REPORT LUNS from `nexus` (sent to `lun`) lists.
fn reported(d: &Device, nexus: u64, lun: u64) -> Vec<u64> {
    let r = run(d, to(nexus, lun, &REPORT_LUNS, &[], 4096));
    good(&r);
    let len = u32::from_be_bytes(r.data_in[..4].try_into().unwrap()) as usize;
    assert_eq!(r.data_in.len(), 8 + len);
    r.data_in[8..]
        .chunks(8)
        .map(|e| u64::from(u16::from_be_bytes([e[0], e[1]]) & 0x3FFF))
        .collect()
}

#[test]
fn a_lun_added_is_reported_announced_once_per_nexus_and_usable() {
    let d = device();
    d.add_lun(3, ram()).expect("LUN 3 added");
    assert_eq!(d.luns(), vec![0, 3]);

    // Nexus 1 hears the news once, on whichever LUN it addresses first.
    good(&run(&d, to(1, 3, &[0x12, 0, 0, 0, 36, 0], &[], 36))); // INQUIRY keeps it
    assert_eq!(sense_code(&run(&d, to(1, 3, &TUR, &[], 0))), LUNS_CHANGED);
    good(&run(&d, to(1, 3, &TUR, &[], 0)));
    good(&run(&d, to(1, 0, &TUR, &[], 0)));
    assert_eq!(reported(&d, 1, 0), vec![0, 3]);

    // Nexus 2 asks REPORT LUNS first: it has the new inventory, so no unit attention.
    assert_eq!(reported(&d, 2, 0), vec![0, 3]);
    good(&run(&d, to(2, 0, &TUR, &[], 0)));

    let w = to(2, 3, &write10(7, 1), &[0xC3; BS], BS as u32);
    good(&run(&d, w));
    let r = run(&d, to(1, 3, &read10(7, 1), &[], BS as u32));
    good(&r);
    assert_eq!(&r.data_in[..], &[0xC3; BS][..]);
    assert_eq!(d.capacity(3), Some((BLOCKS, BS as u32)));
}

#[test]
fn a_lun_number_in_use_or_out_of_range_or_a_backend_that_fails_is_refused() {
    let d = device();
    assert_eq!(d.add_lun(0, ram()), Err(LunChangeError::InUse(0)));
    assert_eq!(
        LunChangeError::InUse(0).to_string(),
        "LUN 0 is already in use"
    );
    let e = d.add_lun(16384, ram()).unwrap_err();
    assert!(
        matches!(&e, LunChangeError::Build(w) if w.contains("16384")),
        "{e}"
    );
    let missing: LunConfig =
        toml::from_str("backend = { type = \"file\", path = \"/nonexistent-ironsan-dir/x.img\" }")
            .unwrap();
    let e = d.add_lun(5, missing).unwrap_err();
    assert!(
        matches!(&e, LunChangeError::Build(w) if w.starts_with("LUN 5: ")),
        "{e}"
    );
    // Nothing changed: no LUN 5, and no news for anyone.
    assert_eq!(d.luns(), vec![0]);
    good(&run(&d, to(1, 0, &TUR, &[], 0)));
    good(&run(&d, to(2, 0, &TUR, &[], 0)));
}

#[test]
fn a_removed_lun_is_not_supported_and_the_news_comes_once_through_any_lun() {
    let d = two_lun_device();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(d.remove_lun(1)).expect("LUN 1 removed");
    assert_eq!(
        rt.block_on(d.remove_lun(1)),
        Err(LunChangeError::NotFound(1))
    );
    assert_eq!(d.luns(), vec![0]);

    // A removed LUN: LOGICAL UNIT NOT SUPPORTED, and the news stays pending.
    let r = run(&d, to(1, 1, &read10(0, 1), &[], BS as u32));
    assert_eq!(sense_code(&r), NOT_SUPPORTED);
    assert_eq!(sense_code(&run(&d, to(1, 0, &TUR, &[], 0))), LUNS_CHANGED);
    good(&run(&d, to(1, 0, &TUR, &[], 0)));

    // Nexus 2 hears it through REQUEST SENSE, once.
    let sense_of = |d: &Device| {
        let r = run(d, to(2, 0, &[0x03, 0, 0, 0, 18, 0], &[], 18));
        good(&r);
        (r.data_in[2] & 0x0F, r.data_in[12], r.data_in[13])
    };
    assert_eq!(sense_of(&d), LUNS_CHANGED);
    assert_eq!(sense_of(&d), (0, 0, 0));
    assert_eq!(reported(&d, 2, 1), vec![0]);

    // The last LUN may go too: REPORT LUNS is empty, LUN 0 answers INQUIRY as "no device".
    rt.block_on(d.remove_lun(0)).expect("LUN 0 removed");
    assert_eq!(reported(&d, 1, 0), Vec::<u64>::new());
    let inq = run(&d, to(1, 0, &[0x12, 0, 0, 0, 36, 0], &[], 36));
    good(&inq);
    assert_eq!(inq.data_in[0], 0x7F, "peripheral qualifier 3");
    assert_eq!(sense_code(&run(&d, to(1, 0, &TUR, &[], 0))), NOT_SUPPORTED);
}

#[test]
fn a_lun_added_again_under_a_removed_number_starts_afresh() {
    let d = two_lun_device();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    good(&run(&d, to(1, 1, &write10(4, 1), &[0x11; BS], BS as u32)));
    good(&run(&d, to(1, 1, &[0x16, 0, 0, 0, 0, 0], &[], 0))); // RESERVE(6)
    let w = to(2, 1, &write10(4, 1), &[0x22; BS], BS as u32);
    assert_eq!(run(&d, w).status, status::RESERVATION_CONFLICT);

    rt.block_on(d.remove_lun(1)).unwrap();
    d.add_lun(1, ram()).unwrap();
    // Two changes, one piece of news.
    let w = to(2, 1, &write10(4, 1), &[0x22; BS], BS as u32);
    assert_eq!(sense_code(&run(&d, w.clone())), LUNS_CHANGED);
    good(&run(&d, w));
    let r = run(&d, to(2, 1, &read10(4, 1), &[], BS as u32));
    assert_eq!(
        &r.data_in[..],
        &[0x22; BS][..],
        "a new image, no reservation"
    );
}

/// Removing a LUN under a command that waits (a WRITE behind a read whose data is not
/// sent yet) lets that command finish as usual; the removal returns once it has.
#[tokio::test]
async fn removing_a_lun_lets_its_running_commands_finish() {
    let d = two_lun_device();
    let lender = StallingLender::default();
    read_left_unsent(&d, 1, &lender).await;
    let write = start_stalled(&d, write_ab(1, 5)).await;
    let removal = {
        let d = d.clone();
        tokio::spawn(async move { d.remove_lun(1).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!removal.is_finished(), "the removal waits for the write");
    assert_eq!(d.luns(), vec![0], "but the LUN is gone at once");
    let r = d.execute(to(1, 1, &read10(4, 1), &[], BS as u32)).await;
    assert_eq!(sense_code(&r), NOT_SUPPORTED);

    lender.kept.lock().unwrap().clear(); // the read's data has left
    let r = tokio::time::timeout(PROMPTLY, write)
        .await
        .expect("the write ends")
        .unwrap();
    good(&r);
    assert!(!r.aborted);
    tokio::time::timeout(PROMPTLY, removal)
        .await
        .expect("the removal returns")
        .unwrap()
        .unwrap();
}
