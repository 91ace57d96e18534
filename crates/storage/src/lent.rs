//! What a lent read buffer ([`crate::ReadBuf`]) tells its lender about the data it produced,
//! in types both sides name: the facts the transports act on, not an opaque value the lender
//! has to recognise again. The TCP datamover's buffers note the CRC32C of every Data-In
//! payload ([`BufNote::SegmentCrcs`]); an RDMA datamover's note where the bytes lie in
//! registered memory ([`BufNote::Registered`]), a RAM LUN's image included
//! ([`ImageMemory::registration`](crate::ImageMemory::registration)).

use std::sync::Arc;

pub use digest::SegmentCrcs;

/// What a lent [`crate::ReadBuf`] noted while it was filled, for its lender. Storage and the
/// SCSI engine only pass it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufNote {
    /// The CRC32C of every fixed-size piece of the data (an iSCSI/TCP connection's data
    /// digests, computed in the backend's copy).
    SegmentCrcs(Arc<SegmentCrcs>),
    /// The data lies in memory registered with an RDMA device.
    Registered(Registered),
}

/// Where a buffer's data lies in registered memory, as an RDMA device addresses it (an SGE
/// is the local key and an address in the region), and what keeps that memory in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The protection domain the region is registered in, as its lender numbers domains.
    pub domain: usize,
    /// The region's local key.
    pub lkey: u32,
    /// The address of the data's first byte in SGEs.
    pub addr: u64,
    /// Where the data's first byte lies in this process: bytes handed to the lender later
    /// are sent from the region only if they lie within `at..at + len`
    /// ([`Registered::addr_of`]).
    pub at: usize,
    /// The data's length in bytes.
    pub len: usize,
    /// The bytes lie in a RAM LUN's image (read where they lie, no copy), not in a buffer
    /// region the backend copied them into.
    pub in_image: bool,
    /// The memory (and, for an image, the reader's range lock) stays while this lives.
    pub held: Held,
}

impl Registered {
    /// The SGE address of `data`, if it lies within these bytes.
    pub fn addr_of(&self, data: &[u8]) -> Option<u64> {
        let from = (data.as_ptr() as usize).checked_sub(self.at)?;
        (from <= self.len && data.len() <= self.len - from).then(|| self.addr + from as u64)
    }
}

/// Where memory that holds a RAM LUN's image is registered with an RDMA device
/// ([`crate::ImageMemory::registration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The protection domain, as the device's owner numbers domains (never 0).
    pub domain: usize,
    /// The region's local key.
    pub lkey: u32,
    /// The SGE address of the image's first byte.
    pub addr: u64,
}

/// Something kept alive and never looked into: what a note's memory belongs to, or the
/// reader's range lock a buffer keeps until its data is sent ([`crate::ReadBuf::keep_until_sent`]).
/// Dropping the last clone lets it go. Two are equal when they hold the same owner.
#[derive(Clone)]
pub struct Held(Arc<dyn Send + Sync>);

impl Held {
    pub fn new(owner: impl Send + Sync + 'static) -> Held {
        Held(Arc::new(owner))
    }

    /// Shares `owner` (also held elsewhere, such as by the data's `Bytes`).
    pub fn shared(owner: Arc<impl Send + Sync + 'static>) -> Held {
        Held(owner)
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Held {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bytes_within_the_registered_ones_have_an_address() {
        let mem = [0u8; 100];
        let r = Registered {
            domain: 1,
            lkey: 7,
            addr: 0x1000,
            at: mem[10..].as_ptr() as usize,
            len: 50,
            in_image: false,
            held: Held::new(()),
        };
        assert_eq!(r.addr_of(&mem[10..60]), Some(0x1000));
        assert_eq!(r.addr_of(&mem[30..40]), Some(0x1000 + 20));
        assert_eq!(r.addr_of(&mem[60..60]), Some(0x1000 + 50));
        assert_eq!(r.addr_of(&mem[9..20]), None, "starts before");
        assert_eq!(r.addr_of(&mem[50..61]), None, "ends after");
        assert_eq!(r.addr_of(&[1, 2, 3]), None, "elsewhere");
    }

    #[test]
    fn held_lets_go_with_its_last_clone() {
        let owner = Arc::new(());
        let held = Held::shared(owner.clone());
        let again = held.clone();
        assert_eq!(held, again);
        assert_eq!(held, Held::shared(owner.clone()), "the same owner");
        assert_ne!(held, Held::new(()));
        drop(held);
        assert_eq!(Arc::strong_count(&owner), 2);
        drop(again);
        assert_eq!(Arc::strong_count(&owner), 1);
    }
}
