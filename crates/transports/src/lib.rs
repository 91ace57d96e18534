//! Composes ironsan's transports with its iSCSI engines, which know only the `datamover`
//! traits. [`target`] builds a target's portals from its configuration (iSCSI/TCP on
//! `datamover-tcp`, iSER on the software RNIC with its reactor or on an rdma-core device, one
//! port shared by both when listed for both) and the registered memory RAM LUNs' images live
//! in, and starts the target on them; [`initiator`] is the [`datamover::Connector`] an
//! initiator's sessions open their connections with (iSCSI/TCP, or iSER on a software RNIC per
//! connection or on the process's rdma-core device). Everything above the engines (the
//! `ironsan` binary, lab, bench, nbd, the tests) composes through here.

pub mod initiator;
pub mod target;

pub use initiator::{connect_session, connector, discover, with_transports};
pub use target::bind_target;
