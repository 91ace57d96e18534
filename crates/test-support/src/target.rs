//! An ironsan target in this process: a configuration parsed, its portals bound on loopback
//! and served in the background.

use std::net::SocketAddr;
use std::sync::Arc;

use iscsi_target::{Config, Target};

/// IRONSAN_LOG (a filter such as `info` or `debug`) shows the target's and the initiator's
/// logs when a test fails.
pub fn log_from_env() {
    if let Ok(f) = std::env::var("IRONSAN_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Binds every portal of `config`, serves them in the background and returns the first
/// portal's address and the target.
pub async fn serve(config: Config) -> (SocketAddr, Arc<Target>) {
    let bound = transports::bind_target(config).await.expect("bind");
    let addr = bound.local_addrs()[0];
    let target = bound.target();
    tokio::spawn(bound.serve());
    (addr, target)
}

/// Binds the target described by `config` (TOML, portals on 127.0.0.1 with port 0 or a
/// [`free_port`]), serves it in the background and returns its address. Logs as
/// [`log_from_env`] says.
pub async fn start_target(config: &str) -> SocketAddr {
    log_from_env();
    let config = Config::parse(config, "test.toml").expect("config");
    serve(config).await.0
}

/// The configuration of one target `iqn` on `portals` (a TOML array) with LUN 0: `top`
/// top-level keys, `target_keys` in the target's table, `lun` the LUN's keys (as
/// `size = "64MiB"\nbackend = "memory"`).
pub fn one_lun_config(portals: &str, top: &str, iqn: &str, target_keys: &str, lun: &str) -> String {
    format!(
        "portals = {portals}\n{top}\n[[target]]\nname = \"{iqn}\"\n{target_keys}\n\
         [target.lun.0]\n{lun}\n"
    )
}

/// A loopback port free at the time of the call: for a configuration that lists one address
/// for both iSCSI/TCP and iSER (one listener, told apart by the first bytes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a loopback port")
        .local_addr()
        .expect("its address")
        .port()
}
