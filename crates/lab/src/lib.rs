//! Live lab tools of ironsan: its one job is to stage IP-SAN conditions on real sockets and
//! measure them there. The delay proxy (one-way delay, rate limit, held target data, faults
//! at a chosen PDU or byte), the long-delay experiment that drives the ironsan initiator
//! through it, and TCP_INFO sampling of live sockets. Reading captures and diagnosing them
//! is the `analyze` crate's job; this crate only makes the traffic and samples it.

pub mod experiment;
pub mod fault;
pub mod proxy;
pub mod tcpinfo;
