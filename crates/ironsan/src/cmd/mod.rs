//! One module per subcommand.
pub mod analyze;
pub mod bench;
pub mod bench_procs;
pub mod bench_rbd;
pub mod bench_tgt;
pub mod bench_transports;
pub mod blockbench;
pub mod crc;
pub mod delay;
pub mod initiator;
pub mod mount;
pub mod nbd;
pub mod osd;
pub mod rdma;
pub mod soak;
pub mod target;
pub mod target_service;
