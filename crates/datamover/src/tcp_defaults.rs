//! The iSCSI/TCP settings the iSCSI layers and their configuration need without depending on
//! the TCP datamover: its default polling window (a configuration default on both roles).
//! `datamover-tcp` re-exports it where it uses it.

use std::time::Duration;

/// How long an iSCSI/TCP connection's reader polls its socket after the last PDU it handled
/// before it sleeps in epoll (zero: it sleeps at once). Being woken from epoll costs this kind
/// of machine more than the polling, and an idle connection stops polling after this long.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);
