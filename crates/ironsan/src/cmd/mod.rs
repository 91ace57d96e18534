//! One module per subcommand.
pub mod analyze;
pub mod bench;
pub mod bench_tgt;
pub mod crc;
pub mod delay;
pub mod rdma;
pub mod target;
