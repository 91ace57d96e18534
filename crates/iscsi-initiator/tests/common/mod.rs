//! Shared by the initiator's integration tests: an ironsan target started in-process.

use std::net::SocketAddr;

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
    let bound = iscsi_target::Target::bind(config).await.expect("bind");
    let addr = bound.local_addrs()[0];
    tokio::spawn(bound.serve());
    addr
}
