//! JSON-RPC 2.0 framing and decoding, without I/O.
//!
//! A request is one JSON object on one line: the bytes up to a `\n` (a `\r` before it is
//! dropped). Lines are capped at [`MAX_REQUEST`] bytes: the [`Framer`] stops buffering at the
//! cap and reports [`Oversize`], after which the server answers once and closes the
//! connection (the rest of the line cannot be told from the next request).
//!
//! Each request needs `"jsonrpc": "2.0"`, a `method` string, an `id` (string or integer) and,
//! optionally, `params` as an object. Requests without an `id` (notifications) and batches
//! (a JSON array) are refused with -32600: a change made without a reply could not be
//! checked, and one request per line is as fast over a local socket.

use serde::Serialize;
use serde_json::{Map, Value};

/// The longest request line accepted, in bytes (the newline not counted).
pub const MAX_REQUEST: usize = 1 << 20;

/// Invalid JSON was received.
pub const PARSE_ERROR: i64 = -32700;
/// The JSON is not a valid request object (missing or mistyped member, batch, notification,
/// too large).
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// A parameter is missing, unknown, or of the wrong type or value.
pub const INVALID_PARAMS: i64 = -32602;
/// The server failed (a bug, or a handler that ran out of time).
pub const INTERNAL_ERROR: i64 = -32603;
/// The change was refused; the message says what to fix. Nothing was changed.
pub const REFUSED: i64 = -32000;
/// The named target, LUN, portal or session does not exist.
pub const NOT_FOUND: i64 = -32001;
/// The peer may not use this socket (its uid is neither the server's nor root's), or the
/// server has too many connections.
pub const FORBIDDEN: i64 = -32002;

/// A request id: JSON-RPC allows a string or a number (ids here are integers); `Null` only
/// in replies to requests whose id could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Id {
    Num(i64),
    Str(String),
    Null,
}

/// One decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: Id,
    pub method: String,
    /// The `params` object (empty when absent).
    pub params: Map<String, Value>,
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }
    /// The change was refused: `message` says what to fix.
    pub fn refused(message: impl Into<String>) -> RpcError {
        RpcError::new(REFUSED, message)
    }
    pub fn not_found(message: impl Into<String>) -> RpcError {
        RpcError::new(NOT_FOUND, message)
    }
    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(
            METHOD_NOT_FOUND,
            format!("no method {method:?} (methods.list names them all)"),
        )
    }
    /// The error for a line past [`MAX_REQUEST`].
    pub fn oversize() -> RpcError {
        RpcError::new(
            INVALID_REQUEST,
            format!(
                "request longer than {MAX_REQUEST} bytes; the connection is closed (send one request per line, each under the limit)"
            ),
        )
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (error {})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}

/// A reply: `result` or `error`, never both.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub id: Id,
    pub outcome: Result<Value, RpcError>,
}

impl Response {
    pub fn ok(id: Id, result: Value) -> Response {
        Response {
            id,
            outcome: Ok(result),
        }
    }
    pub fn err(id: Id, error: RpcError) -> Response {
        Response {
            id,
            outcome: Err(error),
        }
    }

    /// The reply as one line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Map::new();
        o.insert("jsonrpc".into(), "2.0".into());
        match &self.outcome {
            Ok(v) => o.insert("result".into(), v.clone()),
            Err(e) => o.insert(
                "error".into(),
                serde_json::to_value(e).unwrap_or(Value::Null),
            ),
        };
        o.insert(
            "id".into(),
            serde_json::to_value(&self.id).unwrap_or(Value::Null),
        );
        let mut line = serde_json::to_vec(&Value::Object(o)).unwrap_or_default();
        line.push(b'\n');
        line
    }

    /// Reads a reply line (the client's side). Anything but a well-formed JSON-RPC 2.0
    /// response object is an error saying what was wrong.
    pub fn decode(line: &[u8]) -> Result<Response, String> {
        let v: Value =
            serde_json::from_slice(line).map_err(|e| format!("reply is not JSON: {e}"))?;
        let Value::Object(mut o) = v else {
            return Err("reply is not a JSON object".into());
        };
        if o.get("jsonrpc") != Some(&Value::from("2.0")) {
            return Err("reply lacks \"jsonrpc\": \"2.0\"".into());
        }
        let id = match o.remove("id") {
            Some(Value::Number(n)) => n.as_i64().map(Id::Num).ok_or("reply id out of range")?,
            Some(Value::String(s)) => Id::Str(s),
            Some(Value::Null) | None => Id::Null,
            Some(_) => return Err("reply id is neither a number nor a string".into()),
        };
        let outcome = match (o.remove("result"), o.remove("error")) {
            (Some(r), None) => Ok(r),
            (None, Some(e)) => {
                let code = e.get("code").and_then(Value::as_i64);
                let message = e.get("message").and_then(Value::as_str);
                match (code, message) {
                    (Some(code), Some(m)) => Err(RpcError::new(code, m)),
                    _ => return Err("reply error lacks a numeric code or a message".into()),
                }
            }
            _ => return Err("reply has neither exactly one of result and error".into()),
        };
        Ok(Response { id, outcome })
    }
}

/// A line past [`MAX_REQUEST`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversize;

/// Cuts newline-delimited frames out of a byte stream, holding at most `limit` bytes of an
/// unfinished line (plus whatever complete lines the last [`Framer::push`] brought).
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Where the search for the next newline resumes: the bytes before it have none.
    scanned: usize,
    limit: usize,
}

impl Default for Framer {
    fn default() -> Self {
        Framer::new(MAX_REQUEST)
    }
}

impl Framer {
    /// A framer refusing lines longer than `limit` bytes.
    pub fn new(limit: usize) -> Framer {
        Framer {
            buf: Vec::new(),
            scanned: 0,
            limit,
        }
    }

    /// Appends bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line (without its `\n` or `\r\n`); `Ok(None)` until one has come;
    /// [`Oversize`] once the unfinished line, or a finished one, is past the limit. Blank
    /// lines are skipped.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, Oversize> {
        loop {
            let Some(nl) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') else {
                self.scanned = self.buf.len();
                return if self.buf.len() > self.limit {
                    Err(Oversize)
                } else {
                    Ok(None)
                };
            };
            let end = self.scanned + nl;
            if end > self.limit + 1 {
                return Err(Oversize);
            }
            let mut line: Vec<u8> = self.buf.drain(..=end).collect();
            self.scanned = 0;
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > self.limit {
                return Err(Oversize);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Ok(Some(line));
        }
    }

    /// Bytes held: an unfinished line and complete lines not yet taken.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// Decodes one request line. The error comes with the id to answer under (the request's
/// when it could be read, else `Null`).
pub fn decode_request(line: &[u8]) -> Result<Request, (Id, RpcError)> {
    let invalid = |id: Id, m: &str| (id, RpcError::new(INVALID_REQUEST, m));
    let v: Value = serde_json::from_slice(line).map_err(|e| {
        (
            Id::Null,
            RpcError::new(PARSE_ERROR, format!("not valid JSON: {e}")),
        )
    })?;
    let mut o = match v {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(invalid(
                Id::Null,
                "batch requests are not supported: send one request object per line",
            ))
        }
        _ => return Err(invalid(Id::Null, "a request must be a JSON object")),
    };
    let id =
        match o.remove("id") {
            None => return Err(invalid(
                Id::Null,
                "\"id\" is required (notifications are not supported: every request is answered)",
            )),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(n) => Id::Num(n),
                None => return Err(invalid(Id::Null, "\"id\" must be an integer or a string")),
            },
            Some(Value::String(s)) => Id::Str(s),
            Some(_) => return Err(invalid(Id::Null, "\"id\" must be an integer or a string")),
        };
    if o.get("jsonrpc") != Some(&Value::from("2.0")) {
        return Err(invalid(id, "\"jsonrpc\" must be \"2.0\""));
    }
    let method = match o.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return Err(invalid(id, "\"method\" must be a string")),
        None => return Err(invalid(id, "\"method\" is required")),
    };
    let params = match o.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(Value::Array(_)) => {
            return Err((
                id,
                RpcError::invalid_params(
                    "params must be an object of named parameters, not an array",
                ),
            ))
        }
        Some(_) => return Err(invalid(id, "\"params\" must be an object")),
    };
    o.remove("jsonrpc");
    if let Some(k) = o.keys().next() {
        return Err(invalid(
            id,
            &format!("unknown member {k:?} (a request has jsonrpc, id, method and params)"),
        ));
    }
    Ok(Request { id, method, params })
}

/// A request line for `method` with `params` (the client's side), newline included.
pub fn encode_request(id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
    let mut o = Map::new();
    o.insert("jsonrpc".into(), "2.0".into());
    o.insert("id".into(), id.into());
    o.insert("method".into(), method.into());
    if let Some(p) = params {
        o.insert("params".into(), p);
    }
    let mut line = serde_json::to_vec(&Value::Object(o)).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests;
