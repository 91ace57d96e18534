//! The IP-SAN analysis system of ironsan: reads pcap/pcapng captures (any iSCSI
//! implementation, and ironsan's own `--trace` files), reassembles TCP, decodes iSCSI and
//! iSER/iWARP PDUs into readable lines and JSON, computes per-command and per-connection
//! statistics (latency, idle time on the wire, retransmissions and losses), draws timelines
//! (with TCP_INFO samples beside them) and diagnoses what limited a run. It never touches a
//! socket: the live tools (delay proxy, faults, the long-delay experiment, the TCP_INFO
//! sampler) are in the `lab` crate.

pub mod analysis;
pub mod capture;
pub mod cdb;
pub mod explain;
pub mod iscsi;
pub mod iser;
pub mod listing;
pub mod negotiated;
pub mod phases;
pub mod series;
pub mod stats;
#[cfg(test)]
pub(crate) mod synthetic;
pub mod tcp;
pub mod tcpinfo;
pub mod timeline;
pub mod window;

pub use analysis::{
    analyze_file, analyze_file_within, analyze_frames, analyze_frames_within, Analysis, Connection,
    Limits, Options,
};
pub use iscsi::{Dir, PduRecord};
/// The pcapng writer runtimes use for `--trace` (re-exported from the `pcap-trace` crate).
pub use pcap_trace as trace;
