//! A small record several gateways keep beside a shared LUN (its persistent reservations),
//! updated by compare-and-swap, so that two gateways' concurrent changes never overwrite
//! each other. A backend whose storage can hold one (a RADOS object beside an RBD image)
//! returns it from [`crate::Backend::shared_state`]; others take one from the configuration
//! (a file on storage every gateway reaches).

use std::io;

/// A versioned record shared by the gateways of one LUN. Calls may block on the storage:
/// async callers run them on a blocking thread.
pub trait SharedBlob: Send + Sync + std::fmt::Debug {
    /// The record and its version: `(0, empty)` when it was never written.
    fn read(&self) -> io::Result<(u64, Vec<u8>)>;

    /// Replaces the record with `data` if its version is still `expected`, and returns the
    /// new version; `None` when another writer changed it first (read again and retry).
    fn compare_and_write(&self, expected: u64, data: &[u8]) -> io::Result<Option<u64>>;
}
