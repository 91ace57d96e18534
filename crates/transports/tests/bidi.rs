//! Bidirectional commands and long CDBs against the ironsan target in-process: an OSD
//! WRITE that also retrieves an attribute carries 1 MiB out (immediate, unsolicited and
//! R2T-solicited data) and its retrieved attributes in, in one task, over iSCSI/TCP and over
//! iSER on the software RNIC; both residuals come back; a block LUN refuses a bidirectional
//! command as an unsupported one (INVALID COMMAND OPERATION CODE).

use std::net::SocketAddr;

use bytes::Bytes;
use iscsi_initiator::{CommandRequest, IscsiUrl, Residual, Session};
use osd::attr::{number, page, AttrId};
use osd::client;

use test_support::random_bytes;

const P: u64 = 0x10000;
const O: u64 = 0x10000;

fn config(store: &std::path::Path) -> String {
    format!(
        r#"
portals = ["tcp://127.0.0.1:0", "iser://127.0.0.1:0"]
[[target]]
name = "iqn.2026-11.org.ironsan:objects"
[target.lun.0]
size = "256MiB"
backend = {{ type = "osd", path = "{}" }}
[target.lun.1]
size = "16MiB"
backend = "memory"
"#,
        store.display()
    )
}

async fn session(addr: SocketAddr, scheme: &str, lun: u16) -> Session {
    let url = IscsiUrl::parse_lun(&format!(
        "{scheme}://{addr}/iqn.2026-11.org.ironsan:objects/{lun}"
    ))
    .expect("url");
    test_support::connect(&url).await.expect("login")
}

fn command(lun: u16, r: &client::Request) -> CommandRequest {
    let out = Bytes::copy_from_slice(&r.data_out);
    CommandRequest::with_data(lun, r.cdb.encode().to_vec(), out, r.data_in_len)
}

/// Where the retrieved attribute list that starts at `at` ends, by its own header (list
/// length in bytes 4..8): what the target filled of the data-in.
fn retrieved_end(data: &[u8], at: usize) -> usize {
    let len = u32::from_be_bytes(data[at + 4..at + 8].try_into().unwrap());
    at + 8 + len as usize
}

async fn osd(s: &Session, r: &client::Request) -> iscsi_initiator::CommandResult {
    s.execute(command(0, r)).await.expect("command")
}

/// A 1 MiB WRITE retrieving the object's logical length in the same command.
async fn write_and_get_length(s: &Session, object: u64, seed: u64) {
    let data = random_bytes(1 << 20, seed);
    let ids = [AttrId {
        page: page::USER_INFO,
        number: number::LOGICAL_LENGTH,
    }];
    let r = client::write(P, object, 0, &data).get_list(&ids, 64);
    assert!(
        r.data_out.len() > 1 << 20 && r.data_in_len > 0,
        "a bidirectional command"
    );
    let got = osd(s, &r).await;
    assert_eq!(got.status, 0, "sense {:02x?}", &got.sense[..]);
    let at = r.retrieved_at().expect("retrieved offset");
    let attrs = client::parse_retrieved(&got.data, at).expect("retrieved list");
    assert_eq!(
        attrs[0].value.as_deref(),
        Some(&(1u64 << 20).to_be_bytes()[..])
    );
    // The target filled the data-in up to the end of the list, less than the read length
    // it was given: an underflow of the read part, nothing of the write part.
    assert_eq!(got.residual, Residual::None);
    let unfilled = r.data_in_len as usize - retrieved_end(&got.data, at);
    assert_eq!(
        got.bidi_read_residual,
        Some(Residual::Underflow(unfilled as u32))
    );
    assert!(unfilled > 0);
    let back = osd(s, &client::read(P, object, 0, 1 << 20)).await;
    assert_eq!(back.status, 0);
    assert!(back.data == data, "object read back differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_commands_over_tcp_and_iser() {
    let store = std::env::temp_dir().join(format!("ironsan-bidi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&store);
    let addr = test_support::start_target(&config(&store)).await;
    let tcp = session(addr, "iscsi", 0).await;
    assert_eq!(osd(&tcp, &client::create_partition(P)).await.status, 0);
    assert_eq!(osd(&tcp, &client::create(P, O, 1)).await.status, 0);
    // Over TCP the 1 MiB goes out as immediate data, unsolicited Data-Out and R2T-solicited
    // bursts; the Data-In is numbered after the R2Ts (the initiator checks every DataSN).
    write_and_get_length(&tcp, O, 7).await;
    let iser = session(addr, "iser", 0).await;
    assert_eq!(osd(&iser, &client::create(P, O + 1, 1)).await.status, 0);
    write_and_get_length(&iser, O + 1, 9).await;

    // A block LUN has no bidirectional commands.
    let block = session(addr, "iscsi", 1).await;
    let mut cdb = vec![0u8; 10];
    cdb[0] = 0x2A; // WRITE(10) of one block, sent with a read part too
    cdb[8] = 1;
    let r = block
        .execute(CommandRequest::with_data(1, cdb, random_bytes(512, 1), 512))
        .await
        .expect("command");
    assert_eq!(r.status, 2);
    assert_eq!((r.sense[2] & 0xF, r.sense[12], r.sense[13]), (5, 0x20, 0));
    assert_eq!(r.bidi_read_residual, Some(Residual::Underflow(512)));
    for s in [tcp, iser, block] {
        let _ = s.logout().await;
    }
    let _ = std::fs::remove_dir_all(&store);
}
