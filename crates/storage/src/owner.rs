//! Ownership of a LUN that several gateways serve: one writer at a time, the others fenced.
//!
//! The gateway that holds a shared LUN's [`ExclusiveOwner`] writes to it. One that takes
//! over breaks the current owner's hold and fences that owner first, so writes the old owner
//! still has in flight can no longer land after the new owner's. A backend whose storage
//! offers such a lock (an RBD image's exclusive lock with blocklisting) returns it from
//! [`crate::Backend::exclusive_owner`]; others take one from the configuration (a lock on a
//! shared file).

use std::io;

/// One gateway's handle on a shared LUN's ownership. Calls may block on the storage (a
/// cluster round trip): async callers run them on a blocking thread.
pub trait ExclusiveOwner: Send + Sync + std::fmt::Debug {
    /// This gateway's name in the lock, as log lines and [`ExclusiveOwner::owner`] show it.
    fn id(&self) -> &str;

    /// Takes ownership if nobody holds it. With `force`, breaks a current owner's hold and
    /// fences that owner first. Returns whether this gateway is the owner afterwards.
    fn acquire(&self, force: bool) -> io::Result<bool>;

    /// Gives ownership up: a clean handover, so nobody needs to be fenced.
    fn release(&self) -> io::Result<()>;

    /// Whether this gateway holds ownership now, as the shared storage says: false once
    /// another gateway broke the hold, or this gateway was fenced.
    fn is_owner(&self) -> io::Result<bool>;

    /// The current owner's id, if anyone holds ownership.
    fn owner(&self) -> io::Result<Option<String>>;
}
