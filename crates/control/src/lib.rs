//! The target's control socket: how a running `ironsan target` is watched and changed.
//!
//! The protocol is JSON-RPC 2.0, one JSON object per line (newline-delimited, UTF-8), over a
//! Unix socket; `docs/admin.md` documents it and every method.
//!
//! - [`codec`]: sans-IO. [`codec::Framer`] cuts lines out of the byte stream and refuses a
//!   line longer than [`codec::MAX_REQUEST`] without ever holding more than that;
//!   [`codec::decode_request`] turns one line into a typed [`codec::Request`] or the standard
//!   error (-32700 parse error, -32600 invalid request — batches and notifications included —,
//!   -32601 method not found is the dispatcher's); [`codec::Response`] encodes a reply.
//! - [`params`]: a request's named parameters read field by field, each mistake an -32602
//!   error saying which field and what type was expected, unknown fields refused.
//! - [`server`]: the socket, created owner-only (mode 0600, bound inside a private directory
//!   and renamed into place: no umask window), a stale socket replaced only when nothing
//!   answers on it, every peer's uid checked (SO_PEERCRED: ours or root), connections and
//!   request time bounded, requests dispatched to a [`server::Methods`] table the binary fills.
//! - [`client`]: a blocking client, one request at a time (`ironsan admin`).
//!
//! [`default_socket_path`] is the path both sides use when given none.

pub mod client;
pub mod codec;
pub mod params;
pub mod server;

pub use codec::{Id, Request, Response, RpcError};
pub use params::Params;
pub use server::{Methods, Server, ServerConfig};

/// Where `ironsan target --control` and `ironsan admin` put and look for the socket when
/// given no path: `$XDG_RUNTIME_DIR/ironsan/control.sock` (a directory only its user can
/// write), else `/run/ironsan/control.sock` for root. `None` otherwise: a shared directory
/// such as /tmp would let another user put a socket of theirs there first.
pub fn default_socket_path() -> Option<std::path::PathBuf> {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => {
            Some(std::path::Path::new(&dir).join("ironsan/control.sock"))
        }
        _ if nix::unistd::geteuid().is_root() => Some("/run/ironsan/control.sock".into()),
        _ => None,
    }
}
