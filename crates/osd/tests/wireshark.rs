//! The bytes this crate produces (CDBs, data-out lists, data-in) decode in
//! Wireshark's OSD dissector: commands and answers are carried in hand-made
//! iSCSI PDUs, written as a pcapng trace, and read back with tshark. Skipped
//! when tshark is not installed.

use std::net::SocketAddr;
use std::process::Command;

use osd::attr::{number, page, AttrId, Attribute};
use osd::client::{self, Request};
use osd::OsdUnit;
use pcap_trace::{PduTrace, Side};

const P: u64 = 0x10000;

/// A SCSI Command PDU: 48-byte BHS, Extended CDB AHS, bidirectional read length
/// AHS when both directions carry data, data-out as immediate data.
fn scsi_command(itt: u32, r: &Request) -> Vec<u8> {
    let cdb = r.cdb.encode();
    let (read, write) = (r.data_in_len > 0, !r.data_out.is_empty());
    let mut ahs = Vec::new();
    ahs.extend_from_slice(&((cdb.len() - 16 + 1) as u16).to_be_bytes());
    ahs.extend_from_slice(&[1, 0]);
    ahs.extend_from_slice(&cdb[16..]);
    if read && write {
        ahs.extend_from_slice(&[0, 5, 2, 0]);
        ahs.extend_from_slice(&r.data_in_len.to_be_bytes());
    }
    ahs.resize(ahs.len().next_multiple_of(4), 0);
    let mut bhs = [0u8; 48];
    bhs[0] = 0x01;
    bhs[1] = 0x80 | if read { 0x40 } else { 0 } | if write { 0x20 } else { 0 } | 1;
    bhs[4] = (ahs.len() / 4) as u8;
    bhs[5..8].copy_from_slice(&(r.data_out.len() as u32).to_be_bytes()[1..]);
    bhs[16..20].copy_from_slice(&itt.to_be_bytes());
    let edtl = if write {
        r.data_out.len() as u32
    } else {
        r.data_in_len
    };
    bhs[20..24].copy_from_slice(&edtl.to_be_bytes());
    bhs[24..28].copy_from_slice(&itt.to_be_bytes());
    bhs[32..48].copy_from_slice(&cdb[..16]);
    let mut pdu = bhs.to_vec();
    pdu.extend_from_slice(&ahs);
    pdu.extend_from_slice(&r.data_out);
    pdu.resize(pdu.len().next_multiple_of(4), 0);
    pdu
}

/// The answer: a Data-In PDU carrying status (or a SCSI Response when no data).
fn scsi_answer(itt: u32, status: u8, data: &[u8]) -> Vec<u8> {
    let mut bhs = [0u8; 48];
    if data.is_empty() {
        bhs[0] = 0x21;
        bhs[1] = 0x80;
        bhs[3] = status;
    } else {
        bhs[0] = 0x25;
        bhs[1] = 0x81;
        bhs[3] = status;
        bhs[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        bhs[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    }
    bhs[16..20].copy_from_slice(&itt.to_be_bytes());
    bhs[24..28].copy_from_slice(&itt.to_be_bytes());
    let mut pdu = bhs.to_vec();
    pdu.extend_from_slice(data);
    pdu.resize(pdu.len().next_multiple_of(4), 0);
    pdu
}

/// A SCSI Response PDU carrying `segment` (sense length + sense data).
fn scsi_response(itt: u32, status: u8, segment: &[u8]) -> Vec<u8> {
    let mut bhs = [0u8; 48];
    bhs[0] = 0x21;
    bhs[1] = 0x80;
    bhs[3] = status;
    bhs[5..8].copy_from_slice(&(segment.len() as u32).to_be_bytes()[1..]);
    bhs[16..20].copy_from_slice(&itt.to_be_bytes());
    let mut pdu = bhs.to_vec();
    pdu.extend_from_slice(segment);
    pdu.resize(pdu.len().next_multiple_of(4), 0);
    pdu
}

fn tshark_available() -> bool {
    Command::new("tshark").arg("--version").output().is_ok()
}

#[test]
fn commands_and_answers_decode_in_wireshark() {
    if !tshark_available() {
        eprintln!("tshark not installed: decoder check skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unit = OsdUnit::open(&dir.path().join("lu"), 1 << 30).unwrap();
    let path = dir.path().join("osd.pcapng");
    let trace = PduTrace::create(&path).unwrap();
    let local: SocketAddr = "10.0.0.1:40000".parse().unwrap();
    let target: SocketAddr = "10.0.0.2:3260".parse().unwrap();
    let conn = trace.connection(local, target, Side::Connected);
    let username = Attribute::new(page::USER_INFO, number::USERNAME, b"ann".to_vec());
    let ids = [AttrId {
        page: page::USER_INFO,
        number: number::LOGICAL_LENGTH,
    }];
    let requests = [
        client::create_partition(P),
        client::create(P, 0x10000, 1),
        client::write(P, 0x10000, 0, &[7; 123]),
        client::set_attributes(P, 0x10000, &[username]),
        client::get_attributes(P, 0x10000, &ids, 64),
        client::list(P, 0, 256),
    ];
    for (itt, r) in requests.iter().enumerate() {
        let reply = unit.execute(&r.cdb.encode(), &r.data_out, r.data_in_len);
        assert_eq!(reply.status, 0, "{:?}", reply.sense);
        conn.sent(&scsi_command(itt as u32 + 1, r));
        conn.received(&scsi_answer(itt as u32 + 1, reply.status, &reply.data_in));
    }
    // A refused command: descriptor sense in the SCSI Response.
    let missing = client::read(P, 0x10077, 0, 16);
    let reply = unit.execute(&missing.cdb.encode(), &[], missing.data_in_len);
    let sense = reply.sense.expect("missing object").to_descriptor();
    let mut segment = (sense.len() as u16).to_be_bytes().to_vec();
    segment.extend_from_slice(&sense);
    conn.sent(&scsi_command(99, &missing));
    conn.received(&scsi_response(99, reply.status, &segment));
    drop(conn);
    trace.flush().unwrap();
    drop(trace);
    let out = Command::new("tshark")
        .args(["-r", path.to_str().unwrap(), "-V"])
        .args([
            "-o",
            "scsi.decode_scsi_messages_as:Object Based Storage Device",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if std::env::var_os("OSD_SHOW_DECODE").is_some() {
        eprintln!("{text}");
    }
    for expected in [
        "Create Partition (OSD-2)",
        "Requested Partition Id: 0x0000000000010000",
        "Get Attributes (OSD-2)",
        "Set Attributes (OSD-2)",
        "List (OSD-2)",
        "Additional CDB Length: 228",
        "Attributes List Type: Retrieve/Set attributes for this OSD object (0x9)",
        "Attributes List Type: Retrieve attributes for this OSD object (0x1)",
        "User Object Logical Length: 123",
        "Object Descriptor Format: User Object ID (0x21)",
        "User Object Id: 0000000000010000",
        "Object Type: USER (0x80)",
        "Additional Sense Code+Qualifier: Invalid Field In Cdb (0x2400)",
        "Field pointer: 24",
        "Sense data descriptor type: OSD object identification (0x06)",
        "Object ID: 0x0000000000010077",
    ] {
        assert!(
            text.contains(expected),
            "tshark output lacks {expected:?}:\n{text}"
        );
    }
    assert!(!text.contains("Malformed"), "malformed packet in:\n{text}");
}
