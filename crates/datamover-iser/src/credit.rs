//! Receive credits. iSER's flow control is the receive queue: an initiator may have no more
//! Sends outstanding than the target has receives posted (RFC 7145: the command window and
//! MaxOutstandingUnexpectedPDUs are sized to them; iWARP has no receiver-not-ready retry).
//! Receives are posted again as soon as a Send's bytes are copied out, so the queue pair
//! alone would let a peer that never waits for answers pile up copies faster than the
//! session takes them. Instead every place that holds received Sends for the session (the
//! login channel, full feature phase's notices) holds at most as many as there are receives,
//! and a Send that finds it full ends the connection: an honest peer never has more
//! outstanding, whatever the session is busy with.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

/// Connections ended because their peer overran the receive credit, in this process.
static OVERRUNS: AtomicU64 = AtomicU64::new(0);

/// How many connections of this process were ended because their peer had more Sends
/// outstanding than receives posted for it.
pub fn overruns() -> u64 {
    OVERRUNS.load(Ordering::Relaxed)
}

/// Items waiting in a bounded channel (nobody reserves places in these).
pub(crate) fn queued<T>(tx: &mpsc::Sender<T>) -> usize {
    tx.max_capacity() - tx.capacity()
}

/// Why a connection ends when a Send finds `held` waiting with a credit of `credit`.
pub(crate) fn overrun_reason(held: usize, credit: usize) -> String {
    format!(
        "a Send arrived while {held} earlier ones still waited for the session, with {credit} \
         receives posted: the peer ignores iSER flow control (the command window, \
         MaxOutstandingUnexpectedPDUs)"
    )
}

/// Counts and logs (once per connection) a peer overrunning its credit.
pub(crate) fn overrun(peer: &str, why: &str) {
    OVERRUNS.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(%peer, "closing the iSER connection: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn queued_counts_what_waits_in_the_channel() {
        let (tx, mut rx) = mpsc::channel::<u32>(4);
        assert_eq!(queued(&tx), 0);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(queued(&tx), 2);
        rx.recv().await.unwrap();
        assert_eq!(queued(&tx), 1);
    }
}
