//! An independent check of the encoder and the controller queue: a short exchange (IC,
//! Connect, a read answered with C2HData, a write through R2T/H2CData, responses) written as
//! a pcap of synthetic Ethernet/IPv4/TCP frames and dissected by Wireshark's nvme-tcp
//! dissector. Skipped, with a note, when `tshark` is not installed.

use nvme_tcp::pdu::{encode, DataHeader, Framing, IcReq, PduHeader};
use nvme_tcp::queue::{Action, ControllerQueue, QueueConfig};
use nvme_tcp::sqe::{fabrics, nvm, SglDescriptor, Sqe};
use nvme_tcp::{Cqe, Status};
use std::process::Command;

/// A minimal classic pcap of one TCP connection, 10.0.0.1:50000 (host) to 10.0.0.2:4420.
struct Pcap {
    out: Vec<u8>,
    seq: [u32; 2],
    frames: u32,
}

impl Pcap {
    fn new() -> Pcap {
        let mut out = Vec::new();
        out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&262_144u32.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes()); // Ethernet
        Pcap {
            out,
            seq: [1000, 5000],
            frames: 0,
        }
    }

    /// One TCP segment from the host (`from_host`) or the controller.
    fn segment(&mut self, from_host: bool, payload: &[u8]) {
        let (i, src, dst, sport, dport) = if from_host {
            (0, [10, 0, 0, 1], [10, 0, 0, 2], 50000u16, 4420u16)
        } else {
            (1, [10, 0, 0, 2], [10, 0, 0, 1], 4420, 50000)
        };
        let mut f = Vec::new();
        f.extend_from_slice(&[
            2,
            0,
            0,
            0,
            0,
            2 - i as u8,
            2,
            0,
            0,
            0,
            0,
            1 + i as u8,
            0x08,
            0x00,
        ]);
        let total = (20 + 20 + payload.len()) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        let sum = ip
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum::<u32>();
        let sum = !(((sum & 0xFFFF) + (sum >> 16)) as u16);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&self.seq[i].to_be_bytes());
        f.extend_from_slice(&self.seq[1 - i].to_be_bytes());
        f.extend_from_slice(&[0x50, 0x18, 0xFF, 0xFF, 0, 0, 0, 0]); // PSH|ACK
        f.extend_from_slice(payload);
        self.seq[i] = self.seq[i].wrapping_add(payload.len() as u32);
        self.frames += 1;
        for v in [
            1_700_000_000 + self.frames,
            0,
            f.len() as u32,
            f.len() as u32,
        ] {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        self.out.extend_from_slice(&f);
    }
}

/// Runs the exchange through a `ControllerQueue`; every controller PDU is the queue's.
fn exchange(hdgst: bool, ddgst: bool) -> Pcap {
    let mut pcap = Pcap::new();
    let mut q = ControllerQueue::new(QueueConfig {
        c2h_cut: 2048,
        ..QueueConfig::default()
    });
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst,
        ddgst,
        maxr2t: 0,
    };
    let to_controller = |pcap: &mut Pcap,
                         q: &mut ControllerQueue,
                         bytes: Vec<u8>|
     -> Vec<nvme_tcp::queue::Command> {
        pcap.segment(true, &bytes);
        let mut cmds = Vec::new();
        for a in q.receive(&bytes) {
            match a {
                Action::Send(b) => pcap.segment(false, &b),
                Action::Execute(c) => cmds.push(c),
                Action::Close(r) => panic!("closed: {r:?}"),
            }
        }
        cmds
    };
    to_controller(
        &mut pcap,
        &mut q,
        encode(&PduHeader::IcReq(ic), &[], &Framing::default()).to_vec(),
    );
    let f = Framing {
        hdgst,
        ddgst,
        pda: 0,
    };
    let connect = fabrics::Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 5000,
    };
    let data = fabrics::ConnectData {
        hostid: [9; 16],
        cntlid: fabrics::CNTLID_DYNAMIC,
        subnqn: "nqn.2026-11.org.ironsan:lun0".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
    };
    let cmds = to_controller(
        &mut pcap,
        &mut q,
        encode(
            &PduHeader::CapsuleCmd(connect.to_sqe(0x11)),
            &[&data.to_bytes()],
            &f,
        )
        .to_vec(),
    );
    assert_eq!(cmds.len(), 1);
    let mut cqe = Cqe::new(0x11, Status::SUCCESS);
    cqe.dw0 = 1;
    pcap.segment(false, &q.respond(cqe).unwrap().to_vec());

    let mut read = Sqe::rw(nvm::READ, 0x22, 1, 0, 8);
    read.set_sgl(SglDescriptor::transport(4096));
    assert_eq!(
        to_controller(
            &mut pcap,
            &mut q,
            encode(&PduHeader::CapsuleCmd(read), &[], &f).to_vec()
        )
        .len(),
        1
    );
    let block = vec![0x5Au8; 4096];
    for p in q
        .respond_with_data(Cqe::new(0x22, Status::SUCCESS), &[&block])
        .unwrap()
    {
        pcap.segment(false, &p.to_vec());
    }

    let mut write = Sqe::rw(nvm::WRITE, 0x33, 1, 8, 8);
    write.set_sgl(SglDescriptor::transport(4096));
    assert!(to_controller(
        &mut pcap,
        &mut q,
        encode(&PduHeader::CapsuleCmd(write), &[], &f).to_vec()
    )
    .is_empty());
    let d = DataHeader {
        cid: 0x33,
        ttag: 0,
        offset: 0,
        last: true,
        success: false,
    };
    let cmds = to_controller(
        &mut pcap,
        &mut q,
        encode(&PduHeader::H2CData(d), &[&block], &f).to_vec(),
    );
    assert_eq!(cmds.len(), 1);
    pcap.segment(
        false,
        &q.respond(Cqe::new(0x33, Status::SUCCESS)).unwrap().to_vec(),
    );
    pcap
}

/// Runs tshark on `file` with NVMe/TCP on port 4420 and digest verification on.
fn tshark(file: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("tshark")
        .args(["-r", file, "-d", "tcp.port==4420,nvme-tcp"])
        .args([
            "-o",
            "nvme-tcp.check_hdgst:TRUE",
            "-o",
            "nvme-tcp.check_ddgst:TRUE",
        ])
        .args(args)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn wireshark_dissects_the_exchange() {
    if Command::new("tshark").arg("--version").output().is_err() {
        eprintln!("tshark is not installed: the Wireshark check is skipped");
        return;
    }
    for (hdgst, ddgst) in [(false, false), (true, true)] {
        let path = std::env::temp_dir().join(format!(
            "nvme-tcp-{}-{hdgst}{ddgst}.pcap",
            std::process::id()
        ));
        std::fs::write(&path, exchange(hdgst, ddgst).out).unwrap();
        let file = path.to_str().unwrap();
        let verbose = tshark(file, &["-V"]).unwrap();
        let fields = tshark(
            file,
            &[
                "-T",
                "fields",
                "-E",
                "occurrence=a",
                "-e",
                "nvme-tcp.type",
                "-e",
                "nvme-tcp.cmd.cid",
                "-e",
                "nvme.cqe.cid",
                "-e",
                "nvme.cmd.cid",
                "-e",
                "nvme-tcp.hdgst.status",
                "-e",
                "nvme-tcp.ddgst.status",
            ],
        )
        .unwrap();
        std::fs::remove_file(&path).ok();
        assert!(!verbose.contains("Malformed"), "{verbose}");
        assert!(!verbose.contains("Expert Info (Error"), "{verbose}");
        let rows: Vec<&str> = fields.lines().collect();
        eprintln!("{fields}");
        let types: Vec<&str> = rows.iter().map(|r| r.split('\t').next().unwrap()).collect();
        assert_eq!(
            types,
            ["0", "1", "4", "5", "4", "7", "7", "5", "4", "9", "6", "5"],
            "{fields}"
        );
        for cid in ["0x0011", "0x0022", "0x0033"] {
            assert!(
                rows.iter().any(|r| r.contains(cid)),
                "{cid} missing: {fields}"
            );
        }
        // Digest status 1 is Wireshark's "good": our CRC32C and byte order are its.
        for r in &rows[2..] {
            let cols: Vec<&str> = r.split('\t').collect();
            if hdgst {
                assert_eq!(cols[4], "1", "header digest not good: {r}");
            }
            assert!(matches!(cols[5], "" | "1"), "data digest not good: {r}");
        }
        if ddgst {
            assert_eq!(
                rows.iter().filter(|r| r.ends_with("\t1")).count(),
                4,
                "{fields}"
            );
        }
    }
}
