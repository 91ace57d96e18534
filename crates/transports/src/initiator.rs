//! The initiator's transports: a [`datamover::Connector`] that opens iSCSI/TCP connections
//! (`datamover-tcp`) and iSER ones (`datamover-iser`, on a software RNIC of the connection's
//! own or on the process's rdma-core device), and the session entry points with it in place.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datamover::{ConnectSettings, Connector, InitiatorChannel, IserProvider, TransportKind};
use datamover_iser::rnic_task::PollWindow;
use datamover_iser::IserInitiatorConnection;
use datamover_tcp::initiator::TcpInitiatorConnection;
use iscsi_initiator::{
    DiscoveredTarget, Error, IscsiUrl, Session, SessionConfig, SessionConnector,
};
use rnic::Rnic;

type Channel = dyn InitiatorChannel;

/// Opens connections of every transport ironsan has.
pub struct Transports;

/// The connector of every transport, as a session takes it.
pub fn connector() -> SessionConnector {
    SessionConnector(Arc::new(Transports))
}

/// `cfg` with [`connector`] when it has none yet.
pub fn with_transports(mut cfg: SessionConfig) -> SessionConfig {
    cfg.connector.get_or_insert_with(connector);
    cfg
}

/// [`Session::connect`] over ironsan's transports (unless `cfg` brings its own connector).
pub async fn connect_session(url: &IscsiUrl, cfg: SessionConfig) -> Result<Session, Error> {
    Session::connect(url, with_transports(cfg)).await
}

/// [`iscsi_initiator::discover`] over ironsan's transports (unless `cfg` brings its own
/// connector).
pub async fn discover(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Vec<DiscoveredTarget>, Error> {
    iscsi_initiator::discover(url, &with_transports(cfg.clone())).await
}

#[async_trait]
impl Connector for Transports {
    async fn connect(
        &self,
        transport: TransportKind,
        addr: &str,
        settings: &ConnectSettings<'_>,
    ) -> Result<Box<Channel>, String> {
        let timeout = settings.timeout;
        let remote_invalidation = settings.iser_remote_invalidation;
        match transport {
            TransportKind::Tcp => {
                let c = TcpInitiatorConnection::connect(addr, timeout, settings.trace).await?;
                Ok(Box::new(c.with_poll(settings.tcp_poll)))
            }
            TransportKind::Iser => {
                let sockaddr = tokio::net::lookup_host(addr)
                    .await
                    .map_err(|e| e.to_string())?
                    .next()
                    .ok_or_else(|| "no address".to_string())?;
                match settings.iser_provider {
                    IserProvider::Software => {
                        let poll = PollWindow::new(settings.iser_poll);
                        let dev = software_rnic(poll.clone()).map_err(|e| e.to_string())?;
                        IserInitiatorConnection::connect(
                            dev,
                            sockaddr,
                            timeout,
                            remote_invalidation,
                        )
                        .await
                        .map(|c| Box::new(c.with_poll_window(poll)) as Box<Channel>)
                    }
                    IserProvider::RdmaCore => {
                        rdma_core_connect(sockaddr, timeout, remote_invalidation).await
                    }
                }
            }
        }
    }
}

/// An iSER connection through the process's rdma-core device (opened on first use).
#[cfg(feature = "rdma-core")]
async fn rdma_core_connect(
    addr: std::net::SocketAddr,
    timeout: Duration,
    remote_invalidation: bool,
) -> Result<Box<Channel>, String> {
    static DEV: std::sync::OnceLock<Arc<verbs::Verbs>> = std::sync::OnceLock::new();
    let dev = match DEV.get() {
        Some(d) => d.clone(),
        None => {
            let d = tokio::task::spawn_blocking(verbs::Verbs::open)
                .await
                .map_err(|e| format!("opening the rdma-core device: {e}"))?
                .map_err(|e| format!("no rdma-core device for iSER: {e}"))?;
            DEV.get_or_init(|| Arc::new(d)).clone()
        }
    };
    let c = IserInitiatorConnection::connect(dev, addr, timeout, remote_invalidation).await?;
    Ok(Box::new(c))
}

#[cfg(not(feature = "rdma-core"))]
async fn rdma_core_connect(
    _addr: std::net::SocketAddr,
    _timeout: Duration,
    _remote_invalidation: bool,
) -> Result<Box<Channel>, String> {
    Err("the rdma-core provider needs ironsan built with the rdma-core feature (cargo build --release --features rdma-core; Debian: libibverbs-dev librdmacm-dev)".into())
}

/// A software iWARP RNIC for one connection, its engine a task of the caller's runtime (the
/// connection's tasks run there too): posting and completing then cost no thread switch. It
/// polls by `poll` after its last work before it sleeps (the connection sets the window by
/// its commands' writes: large writes do not poll while more than two are in flight).
fn software_rnic(poll: PollWindow) -> std::io::Result<Arc<Rnic>> {
    Ok(Arc::new(
        datamover_iser::rnic_task::spawn_software_rnic_polling(poll)?,
    ))
}
