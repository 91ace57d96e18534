//! Measurements of ironsan's layers: its one job is to load and time them, so the protocol
//! libraries hold protocol code only. [`workload`] is the access generator behind
//! `ironsan bench` (commands kept outstanding on initiator sessions, latencies recorded, data
//! verified, the `--script` step language), submitting through [`device::BlockDevice`]
//! (iSCSI sessions, NVMe/TCP namespaces); [`crc`] times every CRC32C implementation of
//! `digest`, and copy-then-CRC against the fused copy (`ironsan crc`); [`regcost`] measures
//! what memory registration costs an iSER READ per command (`ironsan rdma reg`); [`tcp_rr`]
//! times a raw TCP request/response over loopback, the floor of an iSCSI/TCP command's
//! latency (`ironsan bench tcp-rr`). Presenting the results is the caller's job.

pub mod crc;
pub mod device;
pub mod regcost;
pub mod tcp_rr;
pub mod workload;
