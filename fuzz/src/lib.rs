//! The fuzz harnesses of ironsan: one plain function per target, each taking the fuzzer's
//! bytes and feeding them to a decoder that reads bytes from the network or a file. A
//! harness panics only when the code under test misbehaves (a panic in a decoder, or a
//! property the harness checks, such as "a re-encoded header decodes to the same header").
//!
//! The libFuzzer entry points in `fuzz_targets/` call these functions, and so does the
//! replay test (`tests/replay.rs`), which runs every committed corpus and regression input
//! on stable Rust without libFuzzer.
//!
//! Inputs are structured where plain bytes would waste the fuzzer's time: a leading byte of
//! options (digests, transport, authentication), records with a length prefix instead of
//! length fields the fuzzer would have to keep consistent, and digests or CHAP responses
//! the harness can fill in correctly when asked (otherwise the fuzzer would never get past
//! a CRC or a challenge).

pub mod control_request;
pub mod input;
pub mod login;
pub mod nvme_tcp;
pub mod osd_unit;
pub mod scsi_dev;
pub mod session;
pub mod session_core;
pub mod session_iser;
pub mod wire;

pub use control_request::control_request;
pub use input::Input;
pub use login::{chap, login_initiator, login_target, send_targets, text_keys};
pub use nvme_tcp::nvme_tcp_pdu;
pub use osd_unit::osd;
pub use scsi_dev::scsi;
pub use session::session_tcp;
pub use session_core::session_core;
pub use session_iser::session_iser;
pub use wire::{ddp_rdmap, iscsi_pdu, iser, mpa};

/// A harness: what each fuzz target runs on one input.
pub type Harness = fn(&[u8]);

/// Every target by name, in the order scripts/fuzz.sh runs them.
pub const TARGETS: &[(&str, Harness)] = &[
    ("iscsi_pdu", iscsi_pdu),
    ("login_target", login_target),
    ("login_initiator", login_initiator),
    ("chap", chap),
    ("text_keys", text_keys),
    ("send_targets", send_targets),
    ("iser", iser),
    ("mpa", mpa),
    ("ddp_rdmap", ddp_rdmap),
    ("scsi", scsi),
    ("osd", osd),
    ("pcap", pcap),
    ("tcp_stream", tcp_stream),
    ("config", config),
    ("control_request", control_request),
    ("session_core", session_core),
    ("session_tcp", session_tcp),
    ("session_iser", session_iser),
    ("nvme_tcp_pdu", nvme_tcp_pdu),
];

/// The harness of the target called `name`.
pub fn harness(name: &str) -> Option<Harness> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, h)| *h)
}

/// Runs the analysis and everything built on it (listing, JSON, statistics).
fn analyze_all(frames: &[analyze::capture::Frame]) {
    let opts = analyze::Options {
        ports: vec![3260, 7174],
        detect_by_content: true,
    };
    let a = analyze::analyze_frames(frames, &opts);
    let _ = analyze::listing::text(&a);
    serde_json::to_writer(std::io::sink(), &analyze::listing::json(&a))
        .expect("serializing the listing");
    let _ = analyze::listing::opcode_counts(&a);
    let sopts = analyze::stats::StatsOptions::default();
    let cmds = analyze::stats::commands(&a, &sopts);
    let _ = analyze::stats::connections(&a, &cmds, &sopts);
}

/// A pcap or pcapng file, as `ironsan analyze` reads it: the capture reader, TCP
/// reassembly, iSCSI/iSER decoding and statistics. The frames read are then written again
/// with pcap-trace's pcapng writer and read back: the same frames must come out.
pub fn pcap(data: &[u8]) {
    let Ok(frames) = analyze::capture::read_frames_from_bytes(data) else {
        return;
    };
    analyze_all(&frames);
    // Round trip through the runtimes' pcapng writer (Ethernet frames only: it writes one
    // Ethernet interface).
    let eth: Vec<_> = frames
        .iter()
        .filter(|f| f.linktype == analyze::capture::linktype::ETHERNET)
        .collect();
    let mut w = pcap_trace::PcapngWriter::new(Vec::new()).expect("writing to memory");
    for f in &eth {
        w.write_frame(f.ts_ns, &f.data).expect("writing to memory");
    }
    let bytes = w.into_inner();
    let again = analyze::capture::read_frames_from_bytes(&bytes).expect("own pcapng reads back");
    assert_eq!(
        again.len(),
        eth.len(),
        "frames lost in the pcapng round trip"
    );
    for (a, b) in eth.iter().zip(&again) {
        assert_eq!(
            a.data, b.data,
            "frame {} changed in the round trip",
            a.number
        );
    }
}

/// TCP reassembly and PDU framing in the analyzer, from segments described by records
/// (easier to mutate than whole frames): each record is a flag byte (bit 0: direction,
/// bit 1 SYN, bit 2 FIN, bit 3 RST, bit 4: an absolute sequence number follows, bit 5: the
/// next port pair), a sequence-number step or value, and a payload with a 16-bit length.
pub fn tcp_stream(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut frames = Vec::new();
    let client: [std::net::SocketAddr; 2] = [
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.1:40001".parse().unwrap(),
    ];
    let server: [std::net::SocketAddr; 2] = [
        "10.0.0.2:3260".parse().unwrap(),
        "10.0.0.2:7174".parse().unwrap(),
    ];
    // Next sequence number per (connection, direction).
    let mut seq = [[1000u32, 5000u32], [9000u32, 7000u32]];
    let mut ts = 1_000_000_000u64;
    // Bounded: each record consumes at least one byte; at most 4096 frames.
    while !inp.is_empty() && frames.len() < 4096 {
        let flags = inp.u8();
        let conn = usize::from(flags & 0x20 != 0);
        let dir = usize::from(flags & 1);
        let s = &mut seq[conn][dir];
        if flags & 0x10 != 0 {
            *s = inp.u32();
        } else {
            // A small signed step: retransmissions and holes.
            *s = s.wrapping_add(inp.u8() as i8 as i32 as u32);
        }
        let payload = inp.record();
        let mut tcp_flags = 0x10; // ACK
        if flags & 2 != 0 {
            tcp_flags |= 0x02;
        }
        if flags & 4 != 0 {
            tcp_flags |= 0x01;
        }
        if flags & 8 != 0 {
            tcp_flags |= 0x04;
        }
        let (src, dst) = if dir == 0 {
            (client[conn], server[conn])
        } else {
            (server[conn], client[conn])
        };
        let ack = seq[conn][1 - dir];
        let frame = pcap_trace::build_frame(src, dst, seq[conn][dir], ack, tcp_flags, payload);
        let s = &mut seq[conn][dir];
        *s = s.wrapping_add(payload.len() as u32 + u32::from(flags & 2 != 0));
        ts += u64::from(flags >> 6) * 1_000_000 + 1000;
        frames.push(analyze::capture::Frame {
            number: frames.len() as u64 + 1,
            ts_ns: ts,
            linktype: analyze::capture::linktype::ETHERNET,
            data: frame,
        });
    }
    analyze_all(&frames);
}

/// The target's TOML configuration loader (`ironsan target --config`), and the value
/// parsers it uses. Nothing is opened: a valid configuration's LUN list is only built.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = iscsi_target::Config::parse(text, "fuzz.toml") {
        for t in &cfg.targets {
            let _ = iscsi_target::Config::luns(t);
        }
    }
    // Single values as they appear in the file.
    for line in text.lines().take(64) {
        let v = line.trim().trim_matches('"');
        let _ = scsi::ByteSize::parse(v);
        let _ = iscsi_target::PortalSpec::parse(v);
        let _ = scsi::config::parse_naa(v);
    }
}
