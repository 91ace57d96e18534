//! `ironsan nbd URL`: a remote LUN as an NBD export (crates/nbd), so qemu, libnbd's tools
//! and the kernel's nbd-client use it without a kernel initiator.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use iscsi_initiator::IscsiUrl;

use super::initiator::{run_with, LoginOpts};

#[derive(clap::Args)]
pub struct NbdArgs {
    /// iscsi://[user%password@]HOST[:PORT][,HOST2[:PORT]...]/TARGET-IQN/LUN (or iser://...; several hosts: multipath)
    pub url: String,
    /// Serve NBD on this TCP address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:10809")]
    pub listen: String,
    /// Serve NBD on this Unix socket instead of TCP.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// The export's name (clients may also ask for the default, empty name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Requests of one client carried out at once (default: the session's CmdSN window).
    #[arg(long, value_name = "N")]
    pub in_flight: Option<usize>,
    /// Close a client that sends nothing for this many seconds while none of its requests
    /// is outstanding (0: never). An idle mount through the kernel's nbd-client sends
    /// nothing either: give it 0 or a long time.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    pub idle_timeout: u64,
    /// Drop a client whose replies cannot be written (it does not read them) for this
    /// many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout: u64,
    /// Clients served at once; one more is refused in the handshake (its NBD_OPT_GO is
    /// answered with NBD_REP_ERR_POLICY, "too many clients").
    #[arg(long, value_name = "N", default_value_t = nbd::server::DEFAULT_MAX_CLIENTS as u64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_clients: u64,
    #[command(flatten)]
    pub login: LoginOpts,
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, PathBuf),
}

pub fn run(args: NbdArgs) -> anyhow::Result<()> {
    super::target::init_logging();
    let url = IscsiUrl::parse_lun(&args.url)?;
    let cfg = args.login.config(&url)?;
    run_with(&args.login, async {
        let session = Arc::new(
            transports::connect_session(&url, cfg)
                .await
                .with_context(|| format!("logging in to {}", args.url))?,
        );
        let lun_no = session.default_lun();
        let lun = Arc::new(
            lun_io::Lun::open(session.clone(), lun_no)
                .await
                .with_context(|| format!("opening LUN {lun_no}"))?,
        );
        let geo = lun.geometry();
        let in_flight = args
            .in_flight
            .unwrap_or(session.window() as usize)
            .clamp(1, 1024);
        let name = args.name.clone().unwrap_or_else(|| {
            format!(
                "{}/{lun_no}",
                url.target.clone().unwrap_or_else(|| "lun".into())
            )
        });
        let description = format!("ironsan: {}", redacted(&url));
        let timeouts = nbd::server::Timeouts {
            idle: (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout)),
            write_stall: Duration::from_secs(args.stall_timeout),
            ..nbd::server::Timeouts::default()
        };
        let server = Arc::new(
            nbd::server::Server::new(lun.clone(), name.clone(), description, in_flight)
                .with_timeouts(timeouts)
                .with_max_clients(args.max_clients as usize),
        );
        let listener = match &args.socket {
            Some(path) => {
                if path.exists() {
                    // A socket left by an earlier run; anything else is not ours to remove.
                    use std::os::unix::fs::FileTypeExt;
                    let meta = std::fs::symlink_metadata(path)?;
                    anyhow::ensure!(
                        meta.file_type().is_socket(),
                        "{} exists and is not a socket",
                        path.display()
                    );
                    std::fs::remove_file(path)?;
                }
                let l = tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("binding {}", path.display()))?;
                Listener::Unix(l, path.clone())
            }
            None => Listener::Tcp(
                tokio::net::TcpListener::bind(&args.listen)
                    .await
                    .with_context(|| format!("binding {}", args.listen))?,
            ),
        };
        println!(
            "ironsan: exporting {} ({} bytes, {} blocks of {} bytes{}) as NBD export {name:?}",
            redacted(&url),
            lun.size(),
            geo.blocks,
            geo.block_size,
            if geo.write_protected {
                ", read-only"
            } else {
                ""
            }
        );
        let serving = match listener {
            Listener::Tcp(l) => {
                let a = l.local_addr()?;
                let host = if a.is_ipv6() {
                    format!("[{}]", a.ip())
                } else {
                    a.ip().to_string()
                };
                println!("ironsan: serving NBD on {a}; try:");
                println!("    qemu-img info nbd://{host}:{}", a.port());
                println!("    nbdinfo nbd://{host}:{}", a.port());
                tokio::spawn(server.clone().serve_tcp(l))
            }
            Listener::Unix(l, p) => {
                println!("ironsan: serving NBD on {}; try:", p.display());
                println!("    qemu-img info 'nbd+unix:///?socket={}'", p.display());
                println!("    nbdinfo 'nbd+unix:///?socket={}'", p.display());
                tokio::spawn(server.clone().serve_unix(l))
            }
        };
        shutdown_signal().await;
        println!("ironsan: shutting down");
        serving.abort();
        let _ = serving.await;
        if let Some(p) = &args.socket {
            let _ = std::fs::remove_file(p);
        }
        drop(server);
        drop(lun);
        // The aborted clients' tasks let go of the session as they are dropped.
        let mut session = session;
        for _ in 0..100 {
            match Arc::try_unwrap(session) {
                Ok(s) => {
                    match s.logout().await {
                        Ok(()) => tracing::debug!("logged out"),
                        Err(e) => tracing::warn!("logout: {e}"),
                    }
                    return Ok(());
                }
                Err(s) => {
                    session = s;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        tracing::warn!("requests still hold the session after 1 s: closing it without logout");
        Ok(())
    })
}

/// The URL as printed (its Display masks passwords).
fn redacted(url: &IscsiUrl) -> String {
    url.to_string()
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
