//! A file LUN whose backing file is truncated under the running device: reads past the
//! new end fail with MEDIUM ERROR / UNRECOVERED READ ERROR, the rest of it and the other
//! LUNs go on serving.

use super::*;

const MEDIUM_READ_ERROR: (u8, u8, u8) = (3, 0x11, 0x00);

fn to(lun: u64, cdb: &[u8], data_out: &[u8], edtl: u32) -> Command {
    let mut c = cmd(1, cdb, data_out, edtl);
    c.lun = lun;
    c
}

#[test]
fn reads_past_the_end_of_a_truncated_backing_file_are_medium_errors() {
    let path = std::env::temp_dir().join(format!("ironsan-scsi-trunc-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    for (io, direct) in [("uring", true), ("threads", false)] {
        let file: LunConfig = toml::from_str(&format!(
            "size = \"1MiB\"\nbackend = {{ type = \"file\", path = \"{}\", create = true }}\n\
             io = \"{io}\"\ndirect = {direct}",
            path.display()
        ))
        .unwrap();
        let d = Device::new(
            "iqn.2024-01.test:t",
            vec![(0, LunConfig::memory(1 << 20)), (1, file)],
        )
        .unwrap();
        d.nexus_added(NexusId(1), "iqn.init-a,i,0x1", Bytes::new());
        let _ = run(&d, to(1, &[0, 0, 0, 0, 0, 0], &[], 0)); // the power-on unit attention
        let data = vec![0x6Du8; 8 * BS];
        for lun in [0, 1] {
            good(&run(
                &d,
                to(lun, &write10(1024, 8), &data, data.len() as u32),
            ));
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(256 * 1024)
            .unwrap();
        for (lba, n) in [(1024, 8), (511, 2), (2000, 1)] {
            let r = run(&d, to(1, &read10(lba, n), &[], n as u32 * BS as u32));
            assert_eq!(sense_code(&r), MEDIUM_READ_ERROR, "{io} LBA {lba}+{n}");
        }
        let r = run(&d, to(1, &read10(0, 8), &[], 8 * BS as u32));
        good(&r);
        let r = run(&d, to(0, &read10(1024, 8), &[], data.len() as u32));
        good(&r);
        assert_eq!(&r.data_in[..], &data[..]);
        // SYNCHRONIZE CACHE(10) on both.
        for lun in [0, 1] {
            good(&run(
                &d,
                to(lun, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0),
            ));
        }
        drop(d);
        std::fs::remove_file(&path).unwrap();
    }
}
