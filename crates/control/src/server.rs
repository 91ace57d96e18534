//! The control socket server: an owner-only Unix socket, every peer's credentials checked,
//! connections and request time bounded, each request dispatched to a [`Methods`] table.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::codec::{decode_request, Framer, Id, Request, Response, RpcError, FORBIDDEN};
use crate::codec::{INTERNAL_ERROR, MAX_REQUEST};
use crate::params::Params;

/// Limits of a control socket server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the socket is created.
    pub path: PathBuf,
    /// Connections served at once; one more is answered with an error and closed.
    pub max_connections: usize,
    /// How long a connection may wait to complete its next request before it is closed.
    pub idle_timeout: Duration,
    /// How long one method may run (and its reply take to write) before the caller is
    /// told it ran out of time.
    pub call_timeout: Duration,
    /// The longest request line, in bytes.
    pub max_request: usize,
}

impl ServerConfig {
    /// The default limits: 16 connections, 5 minutes idle, 60 s per call, 1 MiB requests.
    pub fn new(path: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            path: path.into(),
            max_connections: 16,
            idle_timeout: Duration::from_secs(300),
            call_timeout: Duration::from_secs(60),
            max_request: MAX_REQUEST,
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Value, RpcError>> + Send>>;
type Handler<S> = Box<dyn Fn(Arc<S>, Params) -> BoxFuture + Send + Sync>;

/// The methods a server answers, each a function of the shared state `S` and the request's
/// [`Params`]. `methods.list` is built in and names them.
pub struct Methods<S> {
    state: Arc<S>,
    table: BTreeMap<&'static str, Handler<S>>,
}

impl<S: Send + Sync + 'static> Methods<S> {
    pub fn new(state: Arc<S>) -> Methods<S> {
        Methods {
            state,
            table: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) the method `name`.
    pub fn add<F, Fut>(&mut self, name: &'static str, f: F) -> &mut Methods<S>
    where
        F: Fn(Arc<S>, Params) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, RpcError>> + Send + 'static,
    {
        self.table
            .insert(name, Box::new(move |s, p| Box::pin(f(s, p)) as BoxFuture));
        self
    }

    /// The method names, sorted, `methods.list` included.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.table.keys().copied().collect();
        names.push("methods.list");
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Runs one decoded request.
    pub async fn call(&self, req: Request) -> Response {
        let outcome = match self.table.get(req.method.as_str()) {
            Some(h) => h(self.state.clone(), Params::new(req.params)).await,
            None if req.method == "methods.list" => Params::new(req.params)
                .finish()
                .map(|()| Value::from(self.names())),
            None => Err(RpcError::method_not_found(&req.method)),
        };
        Response {
            id: req.id,
            outcome,
        }
    }
}

/// Whether a peer with uid `peer` may use the socket of a server running as `ours`: the same
/// user, or root.
pub fn peer_allowed(peer: u32, ours: u32) -> bool {
    peer == ours || peer == 0
}

/// A bound control socket. Dropping it removes the socket file (if it is still ours).
pub struct Server {
    listener: UnixListener,
    config: Arc<ServerConfig>,
    /// The socket file's (device, inode), to remove only our own file.
    file: (u64, u64),
}

impl Server {
    /// Creates the socket at `config.path`, mode 0600, and listens (call it within a tokio
    /// runtime). A socket file already there is replaced only when nothing accepts on it;
    /// anything else there is an error saying so.
    pub fn bind(config: ServerConfig) -> io::Result<Server> {
        let std_listener = bind_owner_only(&config.path)?;
        let meta = std::fs::symlink_metadata(&config.path)?;
        let listener = UnixListener::from_std(std_listener)?;
        Ok(Server {
            listener,
            config: Arc::new(config),
            file: (meta.dev(), meta.ino()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// Accepts and serves connections until the future is dropped.
    pub async fn serve<S: Send + Sync + 'static>(self, methods: Methods<S>) {
        let methods = Arc::new(methods);
        let slots = Arc::new(tokio::sync::Semaphore::new(self.config.max_connections));
        let ours = nix::unistd::geteuid().as_raw();
        loop {
            let stream = match self.listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!("control socket: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let config = self.config.clone();
            let methods = methods.clone();
            let slot = slots.clone().try_acquire_owned();
            tokio::spawn(async move {
                let refuse = match (stream.peer_cred().map(|c| c.uid()), &slot) {
                    (Ok(uid), _) if !peer_allowed(uid, ours) => Some(format!(
                        "uid {uid} may not use this control socket (only uid {ours} and root may)"
                    )),
                    (Err(e), _) => Some(format!("the peer's credentials are unknown: {e}")),
                    (_, Err(_)) => Some(format!(
                        "too many control connections ({}): close one and retry",
                        config.max_connections
                    )),
                    _ => None,
                };
                match refuse {
                    Some(why) => {
                        tracing::warn!("control socket: refused a connection: {why}");
                        let reply = Response::err(Id::Null, RpcError::new(FORBIDDEN, why));
                        let _ = write_reply(stream, &reply, config.call_timeout).await;
                    }
                    None => connection(stream, &methods, &config).await,
                }
                drop(slot);
            });
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.config.path) {
            if (m.dev(), m.ino()) == self.file {
                let _ = std::fs::remove_file(&self.config.path);
            }
        }
    }
}

async fn write_reply(mut stream: UnixStream, reply: &Response, limit: Duration) -> io::Result<()> {
    let line = reply.encode();
    match tokio::time::timeout(limit, stream.write_all(&line)).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Serves one connection: requests in order, one reply each, until the peer closes, stays
/// idle too long, or sends a line past the limit (answered, then closed).
async fn connection<S: Send + Sync + 'static>(
    mut stream: UnixStream,
    methods: &Methods<S>,
    config: &ServerConfig,
) {
    let mut framer = Framer::new(config.max_request);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let reply = match framer.next_frame() {
            Ok(Some(line)) => match decode_request(&line) {
                Ok(req) => {
                    let id = req.id.clone();
                    match tokio::time::timeout(config.call_timeout, methods.call(req)).await {
                        Ok(r) => r,
                        Err(_) => Response::err(id, abandoned(config.call_timeout)),
                    }
                }
                Err((id, e)) => Response::err(id, e),
            },
            Ok(None) => {
                let read = tokio::time::timeout(config.idle_timeout, stream.read(&mut buf)).await;
                match read {
                    Ok(Ok(n)) if n > 0 => framer.push(&buf[..n]),
                    _ => return,
                }
                continue;
            }
            Err(_) => {
                let reply = Response::err(Id::Null, RpcError::oversize());
                let _ = write_reply(stream, &reply, config.call_timeout).await;
                return;
            }
        };
        let line = reply.encode();
        match tokio::time::timeout(config.call_timeout, stream.write_all(&line)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

/// The error of a call that ran past `limit`.
fn abandoned(limit: Duration) -> RpcError {
    RpcError::new(
        INTERNAL_ERROR,
        format!(
            "the call ran past {} s and was abandoned; its outcome is unknown, list the state to check",
            limit.as_secs_f64()
        ),
    )
}

/// Binds a listening socket at `path` with mode 0600 and no window in which it has any
/// other: it is bound in a fresh mode-0700 directory beside `path`, chmodded, then renamed
/// over `path`. The parent directory is created (mode 0700) when missing.
fn bind_owner_only(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        )
    })?;
    check_not_live(path)?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.exists() {
        std::fs::DirBuilder::new().mode(0o700).create(&parent)?;
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp_dir = parent.join(tmp_name);
    let _ = std::fs::remove_dir_all(&tmp_dir);
    std::fs::DirBuilder::new().mode(0o700).create(&tmp_dir)?;
    let tmp = tmp_dir.join("s");
    let bound = std::os::unix::net::UnixListener::bind(&tmp).and_then(|l| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        l.set_nonblocking(true)?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&tmp_dir);
    bound
}

/// Fails when something is at `path` that must not be replaced: a socket something accepts
/// on, or anything not a socket.
fn check_not_live(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket: remove it or choose another control socket path",
                path.display()
            ),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{}: another process accepts on this control socket (another ironsan target?): stop it or choose another path",
                path.display()
            ),
        )),
        // Nobody listens: a stale socket a crashed target left, replaced by the rename.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{}: cannot tell whether the socket is in use: {e}", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_and_root_are_allowed() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000));
        assert!(peer_allowed(0, 0));
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(1000, 0));
    }
}
