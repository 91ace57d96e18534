//! `ironsan target`: serve iSCSI targets from a TOML config, or the embedded default
//! (one 1 GiB RAM LUN on 127.0.0.1:3260).

use anyhow::Context;
use iscsi_target::{Config, Target};
use std::time::Duration;

#[derive(clap::Args)]
pub struct TargetArgs {
    /// Portal to listen on (repeatable). Default 127.0.0.1:3260, or the config's portals.
    #[arg(long = "portal", value_name = "ADDR:PORT")]
    pub portals: Vec<String>,
    /// TOML configuration file (portals, targets, LUNs, ACLs, CHAP).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

pub fn run(args: TargetArgs) -> anyhow::Result<()> {
    init_logging();
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    if !args.portals.is_empty() {
        for p in &args.portals {
            p.parse::<std::net::SocketAddr>().map_err(|_| {
                anyhow::anyhow!("--portal {p:?} is not ADDR:PORT (e.g. 127.0.0.1:3260)")
            })?;
        }
        config.portals = args.portals.clone();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let targets: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
        let bound = Target::bind(config).await.map_err(anyhow::Error::msg)?;
        let addrs = bound.local_addrs();
        let target = bound.target();
        for a in &addrs {
            println!("ironsan: serving iSCSI on {a}");
        }
        if let (Some(a), Some(t)) = (addrs.first(), targets.first()) {
            let host = if a.is_ipv6() {
                format!("[{}]", a.ip())
            } else {
                a.ip().to_string()
            };
            let hp = if a.port() == 3260 {
                host.clone()
            } else {
                format!("{host}:{}", a.port())
            };
            println!("ironsan: targets: {}", targets.join(", "));
            println!("ironsan: try:");
            println!("    iscsi-ls -s iscsi://{hp}/");
            println!("    iscsi-inq iscsi://{hp}/{t}/0");
            println!("    iscsi-readcapacity16 iscsi://{hp}/{t}/0");
            println!("    iscsiadm -m discovery -t sendtargets -p {hp}   # Linux open-iscsi");
        }
        let serving = tokio::spawn(bound.serve());
        shutdown_signal().await;
        println!("ironsan: shutting down (asking initiators to log out)");
        target.shutdown(Duration::from_secs(2)).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), serving).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("IRONSAN_LOG")
        .unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
