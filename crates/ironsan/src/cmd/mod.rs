//! One module per subcommand.
pub mod bench;
pub mod crc;
pub mod rdma;
pub mod target;
