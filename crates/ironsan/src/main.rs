//! The `ironsan` binary: argument parsing and dispatch to the layer crates.
//! Each subcommand lives in its own module under `cmd/`; this file only wires them.

use clap::{Parser, Subcommand};

mod cmd;
#[cfg(test)]
mod docs_examples;

/// mimalloc keeps freed pages for reuse: with the system allocator every 128 KiB+ command
/// buffer freed at the top of the heap was trimmed and faulted in again by the next one,
/// which cost more than the data copy itself on both the target and the initiator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the 16th entry of its option enum, in v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the process before mimalloc returns it to the system.
/// Its default (1 s) returned command buffers between bursts of a steady stream, and each
/// came back as page faults on zeroed (often 2 MiB) pages, costing more CPU than the data
/// copy (figures: docs/performance-notes.md). Ten seconds keeps them through any steady load
/// and still gives memory back after one.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = 10_000;

fn tune_allocator() {
    // SAFETY: mi_option_set stores a value in mimalloc's option table (no pointers, any
    // time, any thread); the option index is one mimalloc defines.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS) }
}

#[derive(Parser)]
#[command(
    name = "ironsan",
    version,
    about = "User-space iSCSI/iSER target, initiator and SAN tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve iSCSI targets (default: a 1 GiB RAM LUN on 127.0.0.1:3260).
    Target(cmd::target::TargetArgs),
    /// Watch and change a running target through its control socket (`target --control`).
    Admin(cmd::admin::AdminArgs),
    /// Benchmarks: `ironsan bench iscsi://...` (access generator), `ironsan bench crc`.
    Bench(cmd::bench::BenchArgs),
    /// List the targets a portal offers (SendTargets discovery).
    Discover(cmd::initiator::DiscoverArgs),
    /// List targets and their LUNs with sizes.
    Ls(cmd::initiator::LsArgs),
    /// INQUIRY, VPD pages and capacity of a LUN.
    Inq(cmd::initiator::InqArgs),
    /// Read bytes of a LUN to stdout (or --output).
    Read(cmd::initiator::ReadArgs),
    /// Write stdin (or --input) to a LUN.
    Write(cmd::initiator::WriteArgs),
    /// Object storage (OSD-2) commands on an OSD LUN: partitions, objects, attributes, a bench.
    Osd(cmd::osd::OsdArgs),
    /// Export a LUN over NBD (qemu-img, qemu-io, nbdinfo, nbd-client).
    Nbd(cmd::nbd::NbdArgs),
    /// Mount a target's LUNs as files (FUSE), e.g. for `losetup --direct-io=on`.
    Mount(cmd::mount::MountArgs),
    /// RDMA tools over the software iWARP RNIC: rping-compatible ping, bandwidth test.
    Rdma(cmd::rdma::RdmaArgs),
    /// Translate a capture into readable PDUs, per-command/connection statistics and a timeline.
    Analyze(cmd::analyze::AnalyzeArgs),
    /// Many sessions of mixed, verified I/O for a long time (default 64 x QD 32, 10 minutes):
    /// errors, verify mismatches, throughput over time, the target's memory and descriptors.
    Soak(cmd::soak::SoakArgs),
    /// Relay TCP through an emulated long link (delay, rate limit, one injected loss).
    DelayProxy(cmd::delay::ProxyArgs),
    /// Sweep delay and block size through the delay proxy and compare with the model.
    DelayExperiment(cmd::delay::ExperimentArgs),
}

/// `ironsan ... | head` closes stdout early. Rust ignores SIGPIPE (so sockets report EPIPE
/// instead of killing the target), which makes `println!` panic on the closed pipe; end quietly
/// with the status a SIGPIPE death would give instead.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

fn main() {
    tune_allocator();
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Discover(_)
            | Command::Ls(_)
            | Command::Inq(_)
            | Command::Read(_)
            | Command::Write(_)
            | Command::Osd(_)
    ) {
        // Silent unless asked: IRONSAN_LOG=info shows the initiator's recovery events.
        cmd::target::init_logging_or("off");
    }
    let result = match cli.command {
        Command::Target(args) => cmd::target::run(args),
        Command::Admin(args) => cmd::admin::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Soak(args) => cmd::soak::run(args),
        Command::Discover(args) => cmd::initiator::discover(args),
        Command::Ls(args) => cmd::initiator::ls(args),
        Command::Inq(args) => cmd::initiator::inq(args),
        Command::Read(args) if cmd::nvme_host::is_nvme(&args.url) => cmd::nvme_host::read(args),
        Command::Read(args) => cmd::initiator::read(args),
        Command::Write(args) if cmd::nvme_host::is_nvme(&args.url) => cmd::nvme_host::write(args),
        Command::Write(args) => cmd::initiator::write(args),
        Command::Osd(args) => cmd::osd::run(args),
        Command::Nbd(args) => cmd::nbd::run(args),
        Command::Mount(args) => cmd::mount::run(args),
        Command::Rdma(args) => cmd::rdma::run(args),
        Command::Analyze(args) => cmd::analyze::run(args),
        Command::DelayProxy(args) => cmd::delay::run_proxy(args),
        Command::DelayExperiment(args) => cmd::delay::run_experiment(args),
    };
    if let Err(e) = result {
        eprintln!("ironsan: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod allocator_tests {
    /// The index names the purge delay: its default is mimalloc's 1000 ms (unless the
    /// environment sets it), no other option has that default, and the tuning takes.
    #[test]
    fn the_purge_delay_is_the_option_tuned() {
        let get = || {
            // SAFETY: reads a value from mimalloc's option table.
            unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) }
        };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert!(
                matches!(get(), 1000 | super::ALLOCATOR_PURGE_DELAY_MS),
                "{}",
                get()
            );
        }
        super::tune_allocator();
        assert_eq!(get(), super::ALLOCATOR_PURGE_DELAY_MS);
    }
}
