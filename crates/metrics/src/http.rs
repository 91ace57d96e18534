//! The scrape endpoint: HTTP/1.1 on a TCP listener, `GET /metrics` answered with the
//! registry's text, anything else with 404 (405 for another method on /metrics). One
//! request per connection; its head must arrive within [`HEAD_TIME`] and fit [`HEAD_MAX`],
//! and at most [`MAX_CLIENTS`] scrapes are answered at once (more wait in the backlog).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// What a scrape's response declares when the client accepts OpenMetrics (what
/// prometheus-client writes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// What it declares otherwise (see [`crate::to_classic_text`]).
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bytes a request head may take.
const HEAD_MAX: usize = 8192;
/// Time a request head may take to arrive, and a response to leave.
const HEAD_TIME: Duration = Duration::from_secs(5);
/// Scrapes answered at once.
const MAX_CLIENTS: usize = 8;

/// Binds `addr` and serves the registry's metrics on it; returns the address bound (port 0
/// gets a free one) and the server's future, which runs until dropped.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = ()> + Send + 'static,
)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((bound, serve_on(listener, registry)))
}

/// Serves the registry's metrics on `listener` until the future is dropped.
pub async fn serve_on(listener: TcpListener, registry: Registry) {
    let registry = Arc::new(registry);
    let clients = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let Ok(permit) = clients.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &registry).await {
                tracing::debug!(%peer, "metrics: {e}");
            }
            drop(permit);
        });
    }
}

/// Reads one request head and answers it.
async fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let head = tokio::time::timeout(HEAD_TIME, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::other("request head not in within 5 s"))??;
    let (status, body) = match route(&head) {
        Route::Metrics if wants_open_metrics(&head) => {
            ("200 OK", Some((CONTENT_TYPE, crate::encode(registry))))
        }
        Route::Metrics => {
            let text = crate::to_classic_text(&crate::encode(registry));
            ("200 OK", Some((CLASSIC_CONTENT_TYPE, text)))
        }
        Route::NotFound => ("404 Not Found", None),
        Route::NotAllowed => ("405 Method Not Allowed", None),
        Route::Bad => ("400 Bad Request", None),
    };
    let (kind, body) = match body {
        Some(typed) => typed,
        None => ("text/plain; charset=utf-8", format!("{status}\n")),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::time::timeout(HEAD_TIME, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await
    .map_err(|_| std::io::Error::other("response not taken within 5 s"))?
}

/// The request head, up to its blank line; an error past [`HEAD_MAX`] bytes.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed before a whole request head"));
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(head);
        }
        if head.len() > HEAD_MAX {
            return Err(std::io::Error::other("request head too large"));
        }
    }
}

/// Whether the request's Accept header names the OpenMetrics text format.
fn wants_open_metrics(head: &[u8]) -> bool {
    String::from_utf8_lossy(head).lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("accept") && v.contains("application/openmetrics-text")
        })
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    NotFound,
    NotAllowed,
    Bad,
}

/// Where a request head goes: by its request line alone.
fn route(head: &[u8]) -> Route {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::Bad;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Route::Bad;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics,
        (_, "/metrics") => Route::NotAllowed,
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_route_by_their_request_line() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::NotAllowed);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Route::Bad);
        assert_eq!(route(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"), Route::Bad);
    }

    async fn request(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(req).await.unwrap();
        let mut out = String::new();
        // A connection closed with the request unread may be reset: read as nothing.
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out));
        match read.await.expect("the server answers within 10 s") {
            Ok(_) => out,
            Err(_) => String::new(),
        }
    }

    #[tokio::test]
    async fn the_server_answers_metrics_404_and_refuses_a_huge_head() {
        let mut registry = Registry::default();
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        c.inc_by(7);
        registry.register("probe", "A test counter", c);
        let (addr, server) = serve("127.0.0.1:0".parse().unwrap(), registry)
            .await
            .unwrap();
        let server = tokio::spawn(server);
        let accept = b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
        let ok = request(addr, accept).await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE));
        assert!(ok.contains("\nprobe_total 7\n"), "{ok}");
        assert!(ok.ends_with("# EOF\n"));
        let classic = request(addr, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(classic.contains(CLASSIC_CONTENT_TYPE), "{classic}");
        assert!(
            classic.contains("# TYPE probe_total counter\nprobe_total 7\n"),
            "{classic}"
        );
        let missing = request(addr, b"GET /other HTTP/1.1\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        // A head that never ends is cut off at its bound: the connection closes unanswered.
        let huge = vec![b'a'; HEAD_MAX + 2048];
        assert_eq!(request(addr, &huge).await, "");
        server.abort();
    }
}
