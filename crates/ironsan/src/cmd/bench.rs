//! `ironsan bench ...`: benchmarks. One variant per benchmark; each lives in its own module.

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Without a subcommand: the iSCSI access generator (`ironsan bench iscsi://...`).
    #[command(flatten)]
    pub iscsi: Box<super::blockbench::BlockBenchArgs>,
}

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// CRC32C cost per byte: Sarwate, slicing-by-8, hardware, copy-then-CRC vs fused copy+CRC.
    Crc(super::crc::CrcArgs),
    /// ironsan's target vs Debian's tgtd, both driven by libiscsi's iscsi-perf in one run.
    VsTgt(super::bench_tgt::VsTgtArgs),
    /// iSCSI/TCP vs iSER (software RNIC) against one ironsan target, alternating, in one run:
    /// throughput and CPU seconds per GB of initiator and target, 4 KiB to 16 MiB.
    Transports(super::bench_transports::TransportsArgs),
    /// An RBD image served by ironsan against fio's rbd engine (the librbd ceiling) and
    /// tgtd's bs_rbd, alternating, in one run: throughput and CPU seconds per GB.
    Rbd(super::bench_rbd::RbdArgs),
    /// ironsan's file LUNs (tmpfs, and disk with O_DIRECT) against its RAM LUN, fio's
    /// io_uring engine and tgtd's rdwr store on the same disk file, alternating, in one run:
    /// IOPS, MB/s and CPU seconds per GB.
    Backends(super::bench_backends::BackendsArgs),
    /// A raw TCP request/response over loopback (48 bytes out, 4,144 back, one at a time):
    /// the floor of an iSCSI/TCP 4 KiB read's latency. Blocking reads; --poll adds spinning
    /// ones.
    TcpRr(super::bench_tcp_rr::TcpRrArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    // Silent unless asked: IRONSAN_LOG=info shows the initiator's recovery events
    // (reconnects, connection recovery, SNACKs) as they happen.
    super::target::init_logging_or("off");
    match args.command {
        Some(BenchCommand::Crc(args)) => super::crc::run(args),
        Some(BenchCommand::VsTgt(args)) => super::bench_tgt::run(args),
        Some(BenchCommand::Transports(args)) => super::bench_transports::run(args),
        Some(BenchCommand::Rbd(args)) => super::bench_rbd::run(args),
        Some(BenchCommand::Backends(args)) => super::bench_backends::run(args),
        Some(BenchCommand::TcpRr(args)) => super::bench_tcp_rr::run(args),
        None if args
            .iscsi
            .url
            .as_deref()
            .is_some_and(super::nvme_host::is_nvme) =>
        {
            super::nvme_host::bench(*args.iscsi)
        }
        None => super::blockbench::run(*args.iscsi),
    }
}
