//! A blocking control socket client: one request, one reply, in order.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::codec::{encode_request, Id, Response, RpcError};

/// The longest reply line read.
pub const MAX_REPLY: u64 = 64 << 20;

/// Why a call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket could not be reached.
    Connect(PathBuf, io::Error),
    /// The connection failed mid-call.
    Io(io::Error),
    /// The reply was not a JSON-RPC response (or not to this request).
    Protocol(String),
    /// The server answered with an error.
    Rpc(RpcError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Connect(p, e) => write!(
                f,
                "cannot connect to the control socket {}: {e} (is `ironsan target --control {}` running, and is this its path?)",
                p.display(),
                p.display()
            ),
            ClientError::Io(e) => write!(f, "control socket: {e}"),
            ClientError::Protocol(m) => write!(f, "control socket: {m}"),
            ClientError::Rpc(e) => write!(f, "{}", e.message),
        }
    }
}

impl std::error::Error for ClientError {}

/// A connection to a control socket.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: i64,
}

impl Client {
    /// Connects; every later read and write waits at most `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client, ClientError> {
        let connect = || -> io::Result<(UnixStream, UnixStream)> {
            let s = UnixStream::connect(path)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            Ok((s.try_clone()?, s))
        };
        let (r, writer) = connect().map_err(|e| ClientError::Connect(path.to_path_buf(), e))?;
        Ok(Client {
            reader: BufReader::new(r),
            writer,
            next_id: 1,
        })
    }

    /// Calls `method` with `params` (an object, or none) and returns its result.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.writer
            .write_all(&encode_request(id, method, params))
            .map_err(ClientError::Io)?;
        let reply = self.read_reply()?;
        if reply.id != Id::Num(id) && reply.id != Id::Null {
            return Err(ClientError::Protocol(format!(
                "reply to request {:?} while waiting for {id}",
                reply.id
            )));
        }
        reply.outcome.map_err(ClientError::Rpc)
    }

    fn read_reply(&mut self) -> Result<Response, ClientError> {
        let mut line = Vec::new();
        (&mut self.reader)
            .take(MAX_REPLY)
            .read_until(b'\n', &mut line)
            .map_err(ClientError::Io)?;
        if line.last() != Some(&b'\n') {
            return Err(ClientError::Protocol(if line.is_empty() {
                "the server closed the connection without replying".into()
            } else {
                "reply cut short or longer than 64 MiB".into()
            }));
        }
        Response::decode(&line).map_err(ClientError::Protocol)
    }
}
