//! NBD (Network Block Device) server of ironsan: a remote LUN, reached through ironsan's
//! initiator (`iscsi://` or `iser://`), exported to anything that speaks NBD — qemu
//! (`qemu-img`, `qemu-io`, `-drive file=nbd://...`), libnbd's `nbdinfo`/`nbdcopy`, the
//! kernel's `nbd-client`.
//!
//! * [`proto`] is the protocol, sans IO: the fixed newstyle handshake (`NBD_FLAG_FIXED_NEWSTYLE`,
//!   `NBD_FLAG_NO_ZEROES`), option haggling (`NBD_OPT_GO`, `NBD_OPT_INFO`, `NBD_OPT_EXPORT_NAME`,
//!   `NBD_OPT_LIST`, `NBD_OPT_ABORT`, `NBD_OPT_STRUCTURED_REPLY`; anything else
//!   `NBD_REP_ERR_UNSUP`; `NBD_INFO_EXPORT` and `NBD_INFO_BLOCK_SIZE` with every answer),
//!   request framing and checks (READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES with FUA and
//!   NO_HOLE; out-of-range requests refused with `EINVAL`/`ENOSPC`), and simple or structured
//!   replies. Bytes in, bytes and decisions out; a client that breaks the framing gets a
//!   [`proto::ProtoError`], never a panic.
//! * The device is [`lun_io::Lun`] (crates/lun-io, shared with `ironsan mount`):
//!   byte-addressed I/O on one logical unit of an [`iscsi_initiator::Session`], cut into
//!   SCSI commands that are all in flight at once; unaligned ranges read-modify-write whole
//!   blocks under a range lock; FLUSH is SYNCHRONIZE CACHE, TRIM is UNMAP (when the LUN is
//!   thin), WRITE_ZEROES is WRITE SAME(16) (written zeros when the target refuses it), FUA is
//!   the FUA bit. Writes are answered only after the target's GOOD status.
//! * [`server`] is the tokio driver: TCP or Unix socket listeners, one task per client (at
//!   most `max_clients`; one more is refused in the handshake), many requests of each client
//!   carried out at once with replies sent as they complete.
//!
//! ```no_run
//! use std::sync::Arc;
//! use iscsi_initiator::{IscsiUrl, SessionConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let url = IscsiUrl::parse_lun("iscsi://127.0.0.1/iqn.2026-11.org.ironsan:default/0")?;
//! let session = Arc::new(transports::connect_session(&url, SessionConfig::from_url(&url)).await?);
//! let lun = Arc::new(lun_io::Lun::open(session.clone(), url.lun.unwrap_or(0)).await?);
//! let server = Arc::new(nbd::server::Server::new(lun, "disk".into(), String::new(), 64));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:10809").await?;
//! server.serve_tcp(listener).await; // qemu-img info nbd://127.0.0.1:10809
//! # Ok(())
//! # }
//! ```

pub mod proto;
pub mod server;
