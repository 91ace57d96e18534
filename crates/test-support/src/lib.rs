//! Fixtures shared by ironsan's integration tests and fuzz targets, and nothing else: a
//! target started in-process on loopback from a configuration (RAM LUNs), the project's
//! initiator connected to it, and raw clients that speak PDUs laid out byte by byte from the
//! RFCs (iSCSI/TCP in [`raw_tcp`], the iSER headers and a raw target's answers in
//! [`iser_raw`]) so tests can say what no well-behaved peer says.
//!
//! Only tests (as a dev-dependency) and `fuzz/` use this crate; it depends on the library
//! crates, never the other way round.

pub mod initiator;
pub mod iser_raw;
pub mod pdu;
pub mod raw_tcp;
pub mod target;

pub use initiator::connect;
pub use target::{log_from_env, one_lun_config, serve, start_target};

use bytes::Bytes;

/// `n` bytes of a xorshift sequence from `seed`: data that differs between writes.
pub fn random_bytes(n: usize, seed: u64) -> Bytes {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}
