//! The initiator half of the conformance kit: one suite, written against
//! [`InitiatorDatamover`], that every initiator-side datamover must pass — read data placed
//! before its status is reported, solicited write data fetched from the command's buffer
//! at the offsets the target asks for, control PDUs both ways, a short read's missing bytes
//! reading as zeros, the connection's end reported once, `close` flushing what was queued.
//! A transport runs it by providing an [`InitiatorKitTransport`]: a datamover under test
//! joined to a [`KitTarget`], that transport's target end driven in iSCSI terms (a TCP peer
//! speaks Data-In/R2T/Data-Out PDUs; an iSER peer does RDMA Writes and Reads).
//! [`initiator_conformance_tests!`](crate::initiator_conformance_tests) expands to one test
//! per case.

use super::WAIT;
use crate::{CommandOut, InitiatorDatamover, InitiatorFfpConfig, InitiatorNotice, NoticeSink};
use async_trait::async_trait;
use bytes::Bytes;
use iscsi_wire::{Bhs, NopIn, NopOut, Pdu, ScsiResponse, RESERVED_TAG};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the target end received.
#[derive(Debug, Clone)]
pub enum KitArrival {
    /// A SCSI Command or a control PDU (data the target solicited is consumed by
    /// [`KitTarget::get_data`], not reported).
    Pdu(Pdu),
    /// The initiator closed the connection.
    Closed,
}

/// The target's end of a connection whose initiator end is the datamover under test.
#[async_trait]
pub trait KitTarget: Send {
    /// What arrived next, `None` if nothing within `timeout`.
    async fn next(&mut self, timeout: Duration) -> Option<KitArrival>;
    /// Places read data of `itt` at `offset` (TCP: Data-In; iSER: an RDMA Write).
    async fn put_data(&mut self, itt: u32, offset: u32, data: Bytes);
    /// Fetches bytes `offset..offset + len` of `itt`'s write data (TCP: an R2T and the
    /// Data-Out answering it; iSER: an RDMA Read).
    async fn get_data(&mut self, itt: u32, offset: u32, len: u32) -> Bytes;
    /// Sends a PDU (a SCSI Response, NOP-In, ...).
    async fn send(&mut self, pdu: Pdu);
    /// Drops the connection, as a network failure would.
    fn disconnect(&mut self);
}

/// A transport under test: makes connected pairs.
#[async_trait]
pub trait InitiatorKitTransport: Sync {
    /// The parameters the datamover was set up with.
    fn config(&self) -> InitiatorFfpConfig;
    /// An initiator datamover reporting to `sink`, connected to a target end.
    async fn connect(&self, sink: NoticeSink) -> (Arc<dyn InitiatorDatamover>, Box<dyn KitTarget>);
}

/// A connected pair whose notices arrive on a channel.
async fn connect(
    t: &dyn InitiatorKitTransport,
) -> (
    Arc<dyn InitiatorDatamover>,
    mpsc::UnboundedReceiver<InitiatorNotice>,
    Box<dyn KitTarget>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink: NoticeSink = Arc::new(move |notices: &mut Vec<InitiatorNotice>| {
        for n in notices.drain(..) {
            let _ = tx.send(n);
        }
    });
    let (dm, target) = t.connect(sink).await;
    (dm, rx, target)
}

fn pattern(len: usize, seed: u32) -> Bytes {
    super::pattern(len, seed)
}

/// A SCSI Command for the datamover: reading `read_len`, or writing `write` of which
/// `solicited_from..` is left for the target to ask for.
pub fn command(itt: u32, read_len: u32, write: Bytes, solicited_from: u32) -> CommandOut {
    let len = read_len.max(write.len() as u32);
    let mut bhs = super::scsi_command(itt, write.is_empty(), len, true);
    if let Bhs::ScsiCommand(c) = &mut bhs {
        c.read = read_len > 0;
        c.write = !write.is_empty();
    }
    CommandOut {
        pdu: Pdu::new(bhs, Bytes::new()),
        write,
        solicited_from,
        read_len,
    }
}

fn response(itt: u32, stat_sn: u32, underflow: u32) -> Pdu {
    let rsp = ScsiResponse {
        itt,
        stat_sn,
        underflow: underflow > 0,
        residual: underflow,
        exp_cmd_sn: 1,
        max_cmd_sn: 64,
        ..Default::default()
    };
    Pdu::new(Bhs::ScsiResponse(rsp), Bytes::new())
}

async fn next_notice(rx: &mut mpsc::UnboundedReceiver<InitiatorNotice>) -> InitiatorNotice {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a notice in time")
        .expect("the notice stream is open")
}

/// The next status notice (window notices on the way are skipped): its ITT and read data.
async fn next_status(rx: &mut mpsc::UnboundedReceiver<InitiatorNotice>) -> (u32, Bytes) {
    loop {
        match next_notice(rx).await {
            InitiatorNotice::Status { pdu, read } => return (pdu.bhs.itt(), read),
            InitiatorNotice::Window { .. } => {}
            other => panic!("expected a status notice, got {other:?}"),
        }
    }
}

/// The next PDU at the target end: a SCSI Command's ITT, or panics.
async fn next_pdu(target: &mut dyn KitTarget) -> Pdu {
    match target.next(WAIT).await {
        Some(KitArrival::Pdu(p)) => p,
        other => panic!("expected a PDU at the target, got {other:?}"),
    }
}

/// Reads whose data the target places in pieces: each status notice comes with all of its
/// command's data.
pub async fn read_data_is_placed_before_its_status(t: &dyn InitiatorKitTransport) {
    let (dm, mut rx, mut target) = connect(t).await;
    let seg = t.config().max_recv_data_segment_length as usize;
    let reads = [
        (1u32, pattern(3 * seg + 1001, 1)),
        (2, pattern(seg / 2 + 3, 2)),
    ];
    for (itt, data) in &reads {
        dm.send_command(command(*itt, data.len() as u32, Bytes::new(), 0));
        let pdu = next_pdu(target.as_mut()).await;
        assert!(matches!(pdu.bhs, Bhs::ScsiCommand(ref c) if c.itt == *itt));
    }
    for (n, (itt, data)) in reads.iter().enumerate() {
        let piece = seg.min(data.len());
        let mut at = 0;
        while at < data.len() {
            let end = (at + piece).min(data.len());
            target.put_data(*itt, at as u32, data.slice(at..end)).await;
            at = end;
        }
        target.send(response(*itt, 10 + n as u32, 0)).await;
    }
    for (itt, data) in &reads {
        let (got_itt, read) = next_status(&mut rx).await;
        assert_eq!(got_itt, *itt, "statuses in the order sent");
        assert!(read == data, "ITT {itt:#x}: the read data placed");
    }
}

/// A read the target answers short: the bytes never placed read as zeros.
pub async fn a_short_read_reads_zeros_where_no_data_came(t: &dyn InitiatorKitTransport) {
    let (dm, mut rx, mut target) = connect(t).await;
    dm.send_command(command(5, 4096, Bytes::new(), 0));
    next_pdu(target.as_mut()).await;
    let data = pattern(1000, 5);
    target.put_data(5, 0, data.clone()).await;
    target.send(response(5, 1, 3096)).await;
    let (_, read) = next_status(&mut rx).await;
    assert_eq!(read.len(), 4096, "the read buffer is the expected length");
    assert!(read[..1000] == data[..]);
    assert!(
        read[1000..].iter().all(|&b| b == 0),
        "zeros where no data came"
    );
}

/// The target fetches solicited write data in two requests (each within MaxBurstLength) at
/// offsets of its choosing, past what the command sent unsolicited: it gets exactly the
/// command's bytes.
pub async fn solicited_write_data_is_fetched_from_the_command(t: &dyn InitiatorKitTransport) {
    let (dm, mut rx, mut target) = connect(t).await;
    let burst = t.config().max_burst_length.min(65536);
    let data = pattern(8192 + 2 * burst as usize - 777, 3);
    dm.send_command(command(3, 0, data.clone(), 8192));
    next_pdu(target.as_mut()).await;
    let first = target.get_data(3, 8192, burst).await;
    assert!(first == data[8192..8192 + burst as usize], "first request");
    let rest_at = 8192 + burst;
    let rest = target
        .get_data(3, rest_at, data.len() as u32 - rest_at)
        .await;
    assert!(rest == data[rest_at as usize..], "second request");
    target.send(response(3, 1, 0)).await;
    let (itt, read) = next_status(&mut rx).await;
    assert_eq!((itt, read.len()), (3, 0));
}

/// A control PDU goes out as given; one from the target comes back as a control notice.
pub async fn control_pdus_pass_both_ways(t: &dyn InitiatorKitTransport) {
    let (dm, mut rx, mut target) = connect(t).await;
    let ping = NopOut {
        immediate: true,
        itt: 0x77,
        ttt: RESERVED_TAG,
        ..Default::default()
    };
    dm.send_control(Pdu::new(Bhs::NopOut(ping), Bytes::from_static(b"ping")));
    let got = next_pdu(target.as_mut()).await;
    assert!(matches!(got.bhs, Bhs::NopOut(ref n) if n.itt == 0x77));
    assert_eq!(&got.data[..], b"ping");
    let nop = NopIn {
        itt: 0x77,
        ttt: RESERVED_TAG,
        stat_sn: 1,
        exp_cmd_sn: 1,
        max_cmd_sn: 64,
        ..Default::default()
    };
    target
        .send(Pdu::new(Bhs::NopIn(nop), Bytes::from_static(b"pong")))
        .await;
    match next_notice(&mut rx).await {
        InitiatorNotice::Control(p) => {
            assert!(matches!(p.bhs, Bhs::NopIn(ref n) if n.itt == 0x77));
            assert_eq!(&p.data[..], b"pong");
        }
        other => panic!("expected a control notice, got {other:?}"),
    }
}

/// A lost connection is reported once, as `Closed`; sending afterwards neither panics nor
/// hangs.
pub async fn a_lost_connection_is_reported_once(t: &dyn InitiatorKitTransport) {
    let (dm, mut rx, mut target) = connect(t).await;
    dm.send_command(command(9, 512, Bytes::new(), 0));
    next_pdu(target.as_mut()).await;
    target.disconnect();
    loop {
        match next_notice(&mut rx).await {
            InitiatorNotice::Closed(_) => break,
            InitiatorNotice::Window { .. } => {}
            other => panic!("expected Closed, got {other:?}"),
        }
    }
    dm.send_command(command(10, 512, Bytes::new(), 0));
    dm.send_control(Pdu::new(Bhs::NopOut(NopOut::default()), Bytes::new()));
    let more = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
    assert!(
        !matches!(more, Ok(Some(_))),
        "nothing after Closed: {more:?}"
    );
}

/// `close` sends what was queued before it, then ends the connection.
pub async fn close_flushes_what_was_queued(t: &dyn InitiatorKitTransport) {
    let (dm, _rx, mut target) = connect(t).await;
    for itt in 0..3u32 {
        let nop = NopOut {
            immediate: true,
            itt,
            ttt: RESERVED_TAG,
            ..Default::default()
        };
        dm.send_control(Pdu::new(Bhs::NopOut(nop), Bytes::new()));
    }
    dm.close();
    for itt in 0..3u32 {
        let p = next_pdu(target.as_mut()).await;
        assert_eq!(p.bhs.itt(), itt);
    }
    assert!(matches!(target.next(WAIT).await, Some(KitArrival::Closed)));
}

/// One `#[tokio::test]` per initiator conformance case for the transport `$make` builds
/// (an expression of a type implementing [`InitiatorKitTransport`]).
#[macro_export]
macro_rules! initiator_conformance_tests {
    ($make:expr) => {
        #[tokio::test]
        async fn read_data_is_placed_before_its_status() {
            $crate::conformance::initiator::read_data_is_placed_before_its_status(&$make).await
        }
        #[tokio::test]
        async fn a_short_read_reads_zeros_where_no_data_came() {
            $crate::conformance::initiator::a_short_read_reads_zeros_where_no_data_came(&$make)
                .await
        }
        #[tokio::test]
        async fn solicited_write_data_is_fetched_from_the_command() {
            $crate::conformance::initiator::solicited_write_data_is_fetched_from_the_command(&$make)
                .await
        }
        #[tokio::test]
        async fn control_pdus_pass_both_ways() {
            $crate::conformance::initiator::control_pdus_pass_both_ways(&$make).await
        }
        #[tokio::test]
        async fn a_lost_connection_is_reported_once() {
            $crate::conformance::initiator::a_lost_connection_is_reported_once(&$make).await
        }
        #[tokio::test]
        async fn close_flushes_what_was_queued() {
            $crate::conformance::initiator::close_flushes_what_was_queued(&$make).await
        }
    };
}
