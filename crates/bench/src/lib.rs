//! Measurements of ironsan's layers: its one job is to load and time them, so the protocol
//! libraries hold protocol code only. [`workload`] is the access generator behind
//! `ironsan bench` (commands kept outstanding on initiator sessions, latencies recorded, data
//! verified, the `--script` step language); [`crc`] times every CRC32C implementation of
//! `digest`, and copy-then-CRC against the fused copy (`ironsan crc`); [`regcost`] measures
//! what memory registration costs an iSER READ per command (`ironsan rdma reg`). Presenting the
//! results is the caller's job.

pub mod crc;
pub mod regcost;
pub mod workload;
