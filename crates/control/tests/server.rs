//! The control socket server over a real Unix socket: mode bits, stale and live sockets,
//! malformed and hostile requests answered with the right error and nothing changed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use control::client::{Client, ClientError};
use control::codec::{self, Id, Response};
use control::{Methods, Server, ServerConfig};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(10);

/// A counter the test methods read and change.
#[derive(Default)]
struct State {
    value: AtomicU64,
}

fn methods() -> Methods<State> {
    let mut m = Methods::new(Arc::new(State::default()));
    m.add("counter.get", |s, p| async move {
        p.finish()?;
        Ok(json!(s.value.load(Ordering::SeqCst)))
    })
    .add("counter.set", |s, mut p| async move {
        let v = p.u64("value")?;
        p.finish()?;
        if v == 13 {
            return Err(control::RpcError::refused(
                "13 is unlucky: pick another value",
            ));
        }
        s.value.store(v, Ordering::SeqCst);
        Ok(Value::Null)
    })
    .add("sleep", |_, _| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(Value::Null)
    });
    m
}

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-control-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("control.sock")
}

/// A started server's runtime; dropping it stops the server and removes its directory.
struct Running {
    rt: Option<tokio::runtime::Runtime>,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.rt.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a server on a runtime of its own thread; returns its path.
fn start(name: &str, tune: impl FnOnce(&mut ServerConfig)) -> (PathBuf, Running) {
    let path = socket_path(name);
    let mut config = ServerConfig::new(&path);
    tune(&mut config);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(async { Server::bind(config) }).expect("bind");
    rt.spawn(server.serve(methods()));
    let dir = path.parent().unwrap().to_path_buf();
    (path, Running { rt: Some(rt), dir })
}

/// Sends raw bytes and reads one reply line (None: closed without one).
fn raw(path: &Path, bytes: &[u8]) -> Option<Response> {
    let mut s = UnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(T)).unwrap();
    let _ = s.write_all(bytes);
    let mut line = Vec::new();
    BufReader::new(s).read_until(b'\n', &mut line).ok()?;
    (!line.is_empty()).then(|| Response::decode(&line).expect("a JSON-RPC reply"))
}

fn get(path: &Path) -> u64 {
    Client::connect(path, T)
        .unwrap()
        .call("counter.get", None)
        .unwrap()
        .as_u64()
        .unwrap()
}

#[test]
fn the_socket_is_owner_only_and_its_directory_private() {
    let (path, rt) = start("mode", |_| {});
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let dir_mode = std::fs::metadata(path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "directory mode {dir_mode:o}");
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("control.sock")]);
    drop(rt);
}

#[test]
fn requests_are_answered_in_order_and_change_state() {
    let (path, _rt) = start("order", |_| {});
    let mut c = Client::connect(&path, T).unwrap();
    assert_eq!(c.call("counter.get", None).unwrap(), json!(0));
    c.call("counter.set", Some(json!({"value": 5}))).unwrap();
    assert_eq!(c.call("counter.get", None).unwrap(), json!(5));
    let names = c.call("methods.list", None).unwrap();
    assert_eq!(
        names,
        json!(["counter.get", "counter.set", "methods.list", "sleep"])
    );
    // Two requests in one write: two replies, in order.
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.get\"}\n{\"jsonrpc\":\"2.0\",\"id\":\"b\",\"method\":\"nope\"}\n").unwrap();
    let mut r = BufReader::new(s);
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).unwrap();
    assert_eq!(Response::decode(&line).unwrap().id, Id::Num(1));
    line.clear();
    r.read_until(b'\n', &mut line).unwrap();
    let second = Response::decode(&line).unwrap();
    assert_eq!(second.id, Id::Str("b".into()));
    assert_eq!(second.outcome.unwrap_err().code, codec::METHOD_NOT_FOUND);
}

#[test]
fn malformed_requests_get_clear_errors_and_change_nothing() {
    let (path, _rt) = start("malformed", |_| {});
    Client::connect(&path, T)
        .unwrap()
        .call("counter.set", Some(json!({"value": 2})))
        .unwrap();
    let cases: [(&[u8], i64); 7] = [
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.set\"\n", codec::PARSE_ERROR),
        (b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.set\",\"params\":{\"value\":9}}]\n", codec::INVALID_REQUEST),
        (b"{\"jsonrpc\":\"2.0\",\"method\":\"counter.set\",\"params\":{\"value\":9}}\n", codec::INVALID_REQUEST),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.sett\",\"params\":{\"value\":9}}\n", codec::METHOD_NOT_FOUND),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.set\",\"params\":{\"value\":\"9\"}}\n", codec::INVALID_PARAMS),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.set\",\"params\":{\"value\":9,\"force\":true}}\n", codec::INVALID_PARAMS),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.set\",\"params\":{\"value\":13}}\n", codec::REFUSED),
    ];
    for (bytes, code) in cases {
        let reply = raw(&path, bytes);
        let e = reply.clone().unwrap().outcome.unwrap_err();
        assert_eq!(e.code, code, "{}: {e}", String::from_utf8_lossy(bytes));
        assert!(!e.message.is_empty() && !e.message.contains('\n'));
        assert_eq!(
            get(&path),
            2,
            "state changed by {}",
            String::from_utf8_lossy(bytes)
        );
    }
    let e = Client::connect(&path, T)
        .unwrap()
        .call("counter.set", Some(json!({"value": "9"})))
        .unwrap_err();
    match e {
        ClientError::Rpc(e) => assert_eq!(
            e.message,
            "params.value: expected an unsigned integer, got a string"
        ),
        other => panic!("{other}"),
    }
}

#[test]
fn a_huge_request_is_refused_and_the_connection_closed() {
    let (path, _rt) = start("huge", |c| c.max_request = 4096);
    let s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    // Written from another thread: the server stops reading once past the limit.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 64 << 10];
        for _ in 0..64 {
            if w.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut r = BufReader::new(s);
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).unwrap();
    let e = Response::decode(&line).unwrap().outcome.unwrap_err();
    assert_eq!(e.code, codec::INVALID_REQUEST);
    assert!(e.message.contains("longer than"), "{e}");
    line.clear();
    assert_eq!(
        r.read_until(b'\n', &mut line).unwrap_or(0),
        0,
        "closed after the error"
    );
    writer.join().unwrap();
    assert_eq!(get(&path), 0);
}

#[test]
fn connections_beyond_the_bound_are_refused_and_calls_bounded_in_time() {
    let (path, _rt) = start("bounds", |c| {
        c.max_connections = 1;
        c.call_timeout = Duration::from_millis(300);
    });
    let held = UnixStream::connect(&path).unwrap();
    // The first connection's slot is taken once its task starts: retry briefly.
    let mut refused = None;
    for _ in 0..50 {
        if let Some(r) = raw(&path, b"") {
            refused = Some(r);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = refused.expect("refused").outcome.unwrap_err();
    assert_eq!(e.code, codec::FORBIDDEN);
    assert!(e.message.contains("too many"), "{e}");
    drop(held);
    let mut answered = None;
    for _ in 0..50 {
        let r = raw(
            &path,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"sleep\"}\n",
        );
        if r.as_ref().is_some_and(|r| {
            r.outcome
                .as_ref()
                .err()
                .is_none_or(|e| e.code != codec::FORBIDDEN)
        }) {
            answered = r;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let answered = answered.expect("answered");
    assert_eq!(answered.id, Id::Num(1), "answered under the request's id");
    let e = answered.outcome.unwrap_err();
    assert_eq!(e.code, codec::INTERNAL_ERROR);
    assert!(e.message.contains("abandoned"), "{e}");
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
    let path = socket_path("stale");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(async { Server::bind(ServerConfig::new(&path)) })
        .expect("a stale socket is replaced");
    rt.spawn(server.serve(methods()));
    assert_eq!(get(&path), 0);
    let e = rt
        .block_on(async { Server::bind(ServerConfig::new(&path)) })
        .err()
        .expect("a live socket is kept");
    assert!(e.to_string().contains("another process accepts"), "{e}");
    assert_eq!(get(&path), 0, "the first server still answers");
    drop(rt);
    assert!(!path.exists(), "the server removes its socket when dropped");

    let file = socket_path("plain-file");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"x").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt
        .block_on(async { Server::bind(ServerConfig::new(&file)) })
        .err()
        .expect("a file is not replaced");
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
fn a_closed_socket_says_how_to_reach_the_target() {
    let path = socket_path("absent");
    let e = Client::connect(&path, T).err().expect("nothing there");
    let text = e.to_string();
    assert!(text.contains("--control") && !text.contains('\n'), "{text}");
}

/// Run by `a_peer_of_another_uid_is_refused` as another user: sends a change to the socket
/// named by CONTROL_TEST_PEER and prints the error code of the reply. Does nothing otherwise.
#[test]
fn peer_of_another_uid() {
    let Some(path) = std::env::var_os("CONTROL_TEST_PEER") else {
        return;
    };
    let reply = raw(
        Path::new(&path),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"counter.set\",\"params\":{\"value\":9}}\n",
    );
    let code = reply.and_then(|r| r.outcome.err()).map(|e| e.code);
    println!("PEER-CODE {code:?}");
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: only root can run a peer as another uid");
        return;
    }
    let (path, _rt) = start("peer", |_| {});
    // Let the other user reach the socket, so that the credential check is what refuses it.
    let dir = path.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peer_of_another_uid",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CONTROL_TEST_PEER", &path)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run the peer as uid 65534");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("PEER-CODE Some({})", codec::FORBIDDEN)),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(get(&path), 0, "the refused peer changed the state");
}
