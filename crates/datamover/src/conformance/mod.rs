//! The conformance kit: suites written against the traits. This module's is the one every
//! target-side datamover must pass (module [`initiator`] has the initiator side's) — read data before its status, write data gathered from immediate,
//! unsolicited and solicited parts, aborts and connection loss freeing waiters, bad data
//! reported for a Reject and failing only its command, statuses numbered in wire order,
//! read data produced into the buffers the datamover lends. A transport runs it by
//! providing a [`KitTransport`]: a datamover under test joined to a [`KitInitiator`], that transport's initiator end driven in iSCSI terms (a TCP peer
//! speaks Data-In/R2T/Data-Out PDUs; an iSER peer registers buffers the target reads and
//! writes). [`conformance_tests!`](crate::conformance_tests) expands to one test per case.

pub mod initiator;

use crate::{CollapsedStatus, Datamover, DmError, FfpConfig, Notice, TaskRef, WriteHandle};
use async_trait::async_trait;
use bytes::Bytes;
use iscsi_session::WriteLimits;
use iscsi_wire::{Bhs, Digests, Pdu, ScsiCommand, ScsiResponse};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long any one expected event may take (loopback; generous for loaded CI machines).
pub const WAIT: Duration = Duration::from_secs(20);

/// What the initiator end observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KitEvent {
    /// Read data placed for a task (TCP: one Data-In; iSER: one RDMA Write).
    Data { itt: u32, offset: u32, data: Bytes },
    /// A task's status (collapsed into the last Data-In, or a SCSI Response).
    Status {
        itt: u32,
        stat_sn: u32,
        status: u8,
        underflow: bool,
        residual: u32,
    },
    /// Any other PDU from the target (Reject, NOP-In, ...).
    Control(Pdu),
    /// The target closed the connection.
    Closed,
}

/// The initiator's end of a connection whose target end is the datamover under test.
#[async_trait]
pub trait KitInitiator: Send {
    /// Sends a SCSI command reading `len` bytes.
    async fn send_read(&mut self, itt: u32, len: u32);
    /// Sends a SCSI command writing `data`: its first `immediate` bytes ride in the
    /// command, the next `unsolicited` follow unsolicited; the rest is sent when the target
    /// solicits it (while [`KitInitiator::next_event`] runs).
    async fn send_write(&mut self, itt: u32, data: Bytes, immediate: u32, unsolicited: u32);
    /// Sends a SCSI Command writing `data` (at most the first burst) that announces all of
    /// it as unsolicited data (F=0) and withholds it: the target waits for data only the
    /// peer can send, whatever the transport (an RNIC would answer solicitations itself).
    async fn send_write_withholding(&mut self, itt: u32, data: Bytes);
    /// Sends data for `itt` that the target did not ask for and must refuse (TCP: a
    /// Data-Out beyond the expected length).
    async fn send_bad_data(&mut self, itt: u32);
    /// The next event, `None` if none comes within `timeout`. Solicitations of write data
    /// that arrive meanwhile are answered.
    async fn next_event(&mut self, timeout: Duration) -> Option<KitEvent>;
    /// Drops the connection, as a network failure would.
    fn disconnect(&mut self);
}

/// A datamover under test, its notices, and the initiator end it is connected to.
pub type KitConnection = (
    Arc<dyn Datamover>,
    mpsc::Receiver<Notice>,
    Box<dyn KitInitiator>,
);

/// A transport under test: makes connected pairs.
#[async_trait]
pub trait KitTransport: Sync {
    /// The parameters the datamover was set up with (the suite sizes transfers by them).
    fn config(&self) -> FfpConfig;
    /// A datamover (with its notices) connected to an initiator end.
    async fn connect(&self) -> KitConnection;
}

/// The parameters the suite's datamovers run with: 4 KiB data segments out in 16 KiB bursts,
/// 8 KiB segments in and first burst, two R2Ts (or RDMA Reads) outstanding.
pub fn config(digests: Digests, initial_r2t: bool, next_stat_sn: u32) -> FfpConfig {
    FfpConfig {
        digests,
        max_recv_data_segment_length: 8192,
        max_send_data_segment_length: 4096,
        max_burst_length: 16384,
        write_limits: WriteLimits {
            first_burst_length: 8192,
            max_burst_length: 16384,
            initial_r2t,
            immediate_data: true,
            max_outstanding_r2t: 2,
            max_recv_data_segment_length: 8192,
        },
        status: crate::status_numbering(next_stat_sn),
        max_write_len: 1 << 20,
        error_recovery_level: 0,
        recovery: Default::default(),
        budget: crate::budget::Budget::unlimited(),
        timeouts: Default::default(),
    }
}

/// A SCSI Command as a kit peer sends it: READ(10) or WRITE(10) of `len` bytes, CmdSN = ITT.
pub fn scsi_command(itt: u32, read: bool, len: u32, final_: bool) -> Bhs {
    let mut cdb = [0u8; 16];
    cdb[0] = if read { 0x28 } else { 0x2a };
    Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_,
        read,
        write: !read,
        attr: 1,
        lun: 0,
        itt,
        expected_data_len: len,
        cmd_sn: itt,
        exp_stat_sn: 0,
        cdb,
    })
}

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) >> 3) as u8)
        .collect::<Vec<u8>>()
        .into()
}

const GOOD: CollapsedStatus = CollapsedStatus {
    status: 0,
    overflow: false,
    underflow: false,
    residual: 0,
};

async fn next_notice(notices: &mut mpsc::Receiver<Notice>) -> Notice {
    tokio::time::timeout(WAIT, notices.recv())
        .await
        .expect("a notice in time")
        .expect("the notice stream is open")
}

/// The next command notice: its ITT and write handle.
async fn next_command(notices: &mut mpsc::Receiver<Notice>) -> (TaskRef, Option<WriteHandle>) {
    match next_notice(notices).await {
        Notice::Command { pdu, write } => {
            let Bhs::ScsiCommand(c) = &pdu.pdu.bhs else {
                panic!(
                    "a Command notice carries a SCSI Command, not {:?}",
                    pdu.pdu.bhs
                )
            };
            (
                TaskRef {
                    itt: c.itt,
                    lun: c.lun,
                },
                write,
            )
        }
        other => panic!("expected a command notice, got {other:?}"),
    }
}

/// Collects events until every task in `want` has its status; checks that each task's data
/// covers exactly its expected bytes and arrived entirely before its status. Returns the
/// StatSN of each status.
async fn expect_reads(
    peer: &mut dyn KitInitiator,
    want: &HashMap<u32, Bytes>,
) -> HashMap<u32, u32> {
    let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut done = HashMap::new();
    while done.len() < want.len() {
        let ev = peer
            .next_event(WAIT)
            .await
            .unwrap_or_else(|| panic!("status for {} of {} reads", done.len(), want.len()));
        match ev {
            KitEvent::Data { itt, offset, data } => {
                assert!(
                    !done.contains_key(&itt),
                    "data for ITT {itt:#x} after its status"
                );
                let buf = got.entry(itt).or_default();
                assert_eq!(
                    offset as usize,
                    buf.len(),
                    "ITT {itt:#x}: data in order, no gap"
                );
                buf.extend_from_slice(&data);
            }
            KitEvent::Status {
                itt,
                status,
                stat_sn,
                ..
            } => {
                assert_eq!(status, 0, "ITT {itt:#x} status");
                done.insert(itt, stat_sn);
            }
            KitEvent::Control(p) => panic!("unexpected {:?} during reads", p.bhs.opcode()),
            KitEvent::Closed => panic!("connection closed during reads"),
        }
    }
    for (itt, data) in want {
        let buf = got.remove(itt).unwrap_or_default();
        assert!(buf == data[..], "ITT {itt:#x}: read data differs");
    }
    done
}

/// Status collapsed into the data, and status in a separate response after the data: the
/// initiator sees all of a task's data before its status, the statuses numbered in order.
pub async fn read_data_arrives_before_its_status(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    let burst = t.config().max_burst_length as usize;
    let collapsed = pattern(3 * burst + 1001, 1);
    let separate = pattern(burst / 2 + 3, 2);
    peer.send_read(1, collapsed.len() as u32).await;
    peer.send_read(2, separate.len() as u32).await;
    let (task1, _) = next_command(&mut notices).await;
    let (task2, _) = next_command(&mut notices).await;
    dm.put_data(task1, collapsed.clone(), None, Some(GOOD))
        .await
        .expect("put_data");
    dm.put_data(task2, separate.clone(), None, None)
        .await
        .expect("put_data");
    let rsp = ScsiResponse {
        itt: task2.itt,
        ..Default::default()
    };
    dm.send_control(Pdu::new(Bhs::ScsiResponse(rsp), Bytes::new()))
        .await
        .expect("send_control");
    let want = HashMap::from([(1, collapsed), (2, separate)]);
    let numbers = expect_reads(peer.as_mut(), &want).await;
    assert_eq!(
        numbers[&2],
        numbers[&1].wrapping_add(1),
        "consecutive StatSNs in wire order"
    );
}

/// Read data produced into buffers the datamover lends (filled the way backends fill them:
/// copied pieces, zero runs, bytes taken over whole) reaches the initiator intact, with the
/// buffer's note; a datamover that lends none passes trivially.
pub async fn lent_read_buffers_carry_the_data(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    let Some(lender) = dm.read_buffers() else {
        return;
    };
    let data = pattern(3 * t.config().max_burst_length as usize + 555, 60);
    let mut want = HashMap::new();
    for (itt, how) in [(60u32, 0), (61, 1), (62, 2)] {
        let mut buf = lender.lend(data.len());
        match how {
            0 => {
                buf.put(&data[..7000]);
                buf.put_zeros(5000);
                buf.put(&data[12_000..]);
            }
            1 => buf.put_bytes(data.clone()),
            _ => {
                buf.put_bytes(data.slice(..100));
                buf.put(&data[100..]);
            }
        }
        assert_eq!(buf.len(), data.len());
        let (filled, note) = buf.finish();
        let mut expected = data.to_vec();
        if how == 0 {
            expected[7000..12_000].fill(0);
        }
        assert!(filled[..] == expected[..], "the buffer holds what was put");
        peer.send_read(itt, filled.len() as u32).await;
        let (task, _) = next_command(&mut notices).await;
        dm.put_data(task, filled, note, Some(GOOD))
            .await
            .expect("put_data");
        want.insert(itt, Bytes::from(expected));
    }
    expect_reads(peer.as_mut(), &want).await;
}

/// Many reads answered concurrently from separate tasks: each task's data still precedes
/// its status, and nothing is lost or mixed up.
pub async fn concurrent_reads_keep_each_status_after_its_data(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    let mut want = HashMap::new();
    for itt in 0..16u32 {
        let data = pattern(1000 + itt as usize * 4099, itt);
        peer.send_read(0x100 + itt, data.len() as u32).await;
        want.insert(0x100 + itt, data);
    }
    let mut jobs = Vec::new();
    for _ in 0..16 {
        let (task, _) = next_command(&mut notices).await;
        let data = want[&task.itt].clone();
        let dm = dm.clone();
        jobs.push(tokio::spawn(async move {
            dm.put_data(task, data, None, Some(GOOD)).await
        }));
    }
    expect_reads(peer.as_mut(), &want).await;
    for j in jobs {
        j.await.expect("task").expect("put_data");
    }
}

/// Writes whose data comes as immediate, unsolicited and solicited parts (as the limits
/// allow), and wholly solicited: `get_data` returns exactly the bytes written.
pub async fn write_data_is_gathered_from_every_part(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    let cfg = t.config();
    let l = cfg.write_limits;
    let immediate = if l.immediate_data {
        l.first_burst_length
            .min(cfg.max_recv_data_segment_length)
            .min(4096)
    } else {
        0
    };
    let unsolicited = if l.initial_r2t {
        0
    } else {
        l.first_burst_length - immediate
    };
    let cases = [
        (
            10u32,
            pattern((3 * l.max_burst_length + 777) as usize, 10),
            immediate,
            unsolicited,
        ),
        (11, pattern(l.max_burst_length as usize + 1, 11), 0, 0),
        (12, pattern(immediate.max(512) as usize, 12), immediate, 0),
    ];
    for (itt, data, imm, unsol) in cases {
        peer.send_write(itt, data.clone(), imm, unsol).await;
        let (task, write) = next_command(&mut notices).await;
        assert_eq!(task.itt, itt);
        let write = write.expect("a write command comes with a write handle");
        assert_eq!(write.expected_len as usize, data.len());
        let dm2 = dm.clone();
        let gather = tokio::spawn(async move { dm2.get_data(task, write).await });
        // Answer solicitations until the gather completes.
        let deadline = tokio::time::Instant::now() + WAIT;
        while !gather.is_finished() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "ITT {itt:#x}: write data in time"
            );
            if let Some(ev) = peer.next_event(Duration::from_millis(20)).await {
                panic!("unexpected event during a write: {ev:?}");
            }
        }
        let (got, _) = gather.await.expect("task").expect("get_data");
        assert!(got == data, "ITT {itt:#x}: gathered write data differs");
    }
}

/// An aborted task's `get_data` ends with `Aborted`; the connection goes on.
pub async fn abort_frees_a_task_waiting_for_data(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    peer.send_write_withholding(20, pattern(8192, 20)).await;
    let (task, write) = next_command(&mut notices).await;
    let dm2 = dm.clone();
    let gather = tokio::spawn(async move { dm2.get_data(task, write.expect("handle")).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    dm.abort_task(task.itt);
    let r = tokio::time::timeout(WAIT, gather)
        .await
        .expect("get_data ends after an abort")
        .expect("task");
    assert_eq!(r.map(|_| ()), Err(DmError::Aborted));
    // Solicitations already sent are answered or dropped; a read still works.
    let data = pattern(5000, 21);
    peer.send_read(21, data.len() as u32).await;
    let (task, _) = next_command(&mut notices).await;
    dm.put_data(task, data.clone(), None, Some(GOOD))
        .await
        .expect("put_data");
    expect_reads(peer.as_mut(), &HashMap::from([(21, data)])).await;
}

/// A lost connection fails a waiting `get_data` with `Closed` and ends the notices with
/// `Notice::Closed`; later operations fail instead of hanging.
pub async fn connection_loss_frees_waiters(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    peer.send_write_withholding(30, pattern(8192, 30)).await;
    let (task, write) = next_command(&mut notices).await;
    let dm2 = dm.clone();
    let gather = tokio::spawn(async move { dm2.get_data(task, write.expect("handle")).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    peer.disconnect();
    let r = tokio::time::timeout(WAIT, gather)
        .await
        .expect("get_data ends when the connection is lost")
        .expect("task");
    assert_eq!(r.map(|_| ()), Err(DmError::Closed));
    assert!(
        matches!(next_notice(&mut notices).await, Notice::Closed(_)),
        "Notice::Closed after a connection loss"
    );
    let sent = tokio::time::timeout(WAIT, async {
        for _ in 0..100 {
            let p = Pdu::new(Bhs::NopIn(Default::default()), Bytes::new());
            if dm.send_control(p).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    })
    .await;
    assert_eq!(
        sent,
        Ok(true),
        "send_control fails once the connection is gone"
    );
}

/// Data the target did not ask for fails its command's `get_data` with `DataPhase`,
/// carrying the offending header as received (for the iSCSI layer's Reject, which must
/// precede the command's status); the connection goes on.
pub async fn bad_data_is_rejected_and_fails_only_its_command(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    // Refused before the command asks for its data, and while it waits for it.
    for (itt, waiting) in [(40u32, false), (42, true)] {
        if waiting {
            peer.send_write_withholding(itt, pattern(8192, itt)).await;
        } else {
            peer.send_write(itt, pattern(8192, itt), 0, 0).await;
        }
        let (task, write) = next_command(&mut notices).await;
        let dm2 = dm.clone();
        let gather = async move { dm2.get_data(task, write.expect("handle")).await };
        let r = if waiting {
            let gather = tokio::spawn(gather);
            tokio::time::sleep(Duration::from_millis(50)).await;
            peer.send_bad_data(itt).await;
            tokio::time::timeout(WAIT, gather)
                .await
                .map(|r| r.expect("task"))
        } else {
            peer.send_bad_data(itt).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            tokio::time::timeout(WAIT, gather).await
        };
        match r.expect("get_data ends") {
            Err(DmError::DataPhase { raw_bhs, .. }) => {
                let got = u32::from_be_bytes(raw_bhs[16..20].try_into().expect("4 bytes"));
                assert_eq!(got, itt, "the refused header is the bad data's");
            }
            other => panic!("ITT {itt:#x}: expected DataPhase, got {other:?}"),
        }
    }
    let data = pattern(3000, 41);
    peer.send_read(41, data.len() as u32).await;
    let (task, _) = next_command(&mut notices).await;
    dm.put_data(task, data.clone(), None, Some(GOOD))
        .await
        .expect("put_data");
    expect_reads(peer.as_mut(), &HashMap::from([(41, data)])).await;
}

/// `close` sends what was queued before it, then ends the connection.
pub async fn close_flushes_what_was_queued(t: &dyn KitTransport) {
    let (dm, mut notices, mut peer) = t.connect().await;
    let data = pattern(50_000, 50);
    peer.send_read(50, data.len() as u32).await;
    let (task, _) = next_command(&mut notices).await;
    dm.put_data(task, data.clone(), None, Some(GOOD))
        .await
        .expect("put_data");
    dm.close();
    expect_reads(peer.as_mut(), &HashMap::from([(50, data)])).await;
    assert_eq!(peer.next_event(WAIT).await, Some(KitEvent::Closed));
}

/// One `#[tokio::test]` per conformance case for the transport `$make` builds (an
/// expression of a type implementing [`KitTransport`]).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        #[tokio::test]
        async fn read_data_arrives_before_its_status() {
            $crate::conformance::read_data_arrives_before_its_status(&$make).await
        }
        #[tokio::test]
        async fn lent_read_buffers_carry_the_data() {
            $crate::conformance::lent_read_buffers_carry_the_data(&$make).await
        }
        #[tokio::test]
        async fn concurrent_reads_keep_each_status_after_its_data() {
            $crate::conformance::concurrent_reads_keep_each_status_after_its_data(&$make).await
        }
        #[tokio::test]
        async fn write_data_is_gathered_from_every_part() {
            $crate::conformance::write_data_is_gathered_from_every_part(&$make).await
        }
        #[tokio::test]
        async fn abort_frees_a_task_waiting_for_data() {
            $crate::conformance::abort_frees_a_task_waiting_for_data(&$make).await
        }
        #[tokio::test]
        async fn connection_loss_frees_waiters() {
            $crate::conformance::connection_loss_frees_waiters(&$make).await
        }
        #[tokio::test]
        async fn bad_data_is_rejected_and_fails_only_its_command() {
            $crate::conformance::bad_data_is_rejected_and_fails_only_its_command(&$make).await
        }
        #[tokio::test]
        async fn close_flushes_what_was_queued() {
            $crate::conformance::close_flushes_what_was_queued(&$make).await
        }
    };
}
