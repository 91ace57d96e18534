//! Shared by the lab's integration tests: an ironsan target started in-process, and data
//! that differs between writes.

use std::net::SocketAddr;

use bytes::Bytes;

/// `n` bytes of a xorshift sequence from `seed`: data that differs between writes.
#[allow(dead_code)] // not every test file uses it
pub fn random_bytes(n: usize, seed: u64) -> Bytes {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Binds the target described by `config` (TOML, portals on 127.0.0.1:0), serves it in the
/// background and returns its address. IRONSAN_LOG=debug shows both sides' logs when a test
/// fails.
pub async fn start_target(config: &str) -> SocketAddr {
    if let Ok(f) = std::env::var("IRONSAN_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let config = iscsi_target::Config::parse(config, "test.toml").expect("config");
    let bound = transports::bind_target(config).await.expect("bind");
    let addr = bound.local_addrs()[0];
    tokio::spawn(bound.serve());
    addr
}
