//! An iSER portal on any provider of the `rdma` API that listens by itself: an rdma-core device
//! (`rdma_cm` owns the port, as with the kernel's iSER targets, so iSCSI/TCP needs a port of its
//! own) or the software RNIC's own listener. A thread waits for connection requests; each is
//! accepted (the iSER word both ways, receives posted) in a task of its own, so a slow peer
//! delays no other login.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datamover::{LoginChannel, Portal, TransportKind};
use pcap_trace::PduTrace;
use rdma::{ConnectRequest, Listener};
use tokio::sync::{mpsc, Mutex};

use crate::endpoint::Device;
use crate::target::{accept, AcceptConfig};
use crate::target_device::TargetDevice;

/// How long the listening thread waits for a request before it checks whether the portal
/// is still wanted.
const POLL: Duration = Duration::from_millis(500);

/// An iSER-only portal on a provider's own listener.
pub struct DevicePortal {
    local: SocketAddr,
    device: String,
    arrivals: Mutex<mpsc::Receiver<Box<dyn LoginChannel>>>,
}

impl DevicePortal {
    /// Listens on `addr` through `dev`. Call from within a tokio runtime: accepted connections
    /// are set up in its tasks.
    pub fn bind<P>(
        addr: SocketAddr,
        dev: Arc<TargetDevice<P>>,
        cfg: AcceptConfig,
    ) -> io::Result<DevicePortal>
    where
        P: Device,
        P::Listener: 'static,
        <P::Listener as Listener>::Request: ConnectRequest<Qp = P::Qp> + 'static,
    {
        let listener = dev.dev().listen(addr).map_err(io::Error::other)?;
        let local = listener.local_addr();
        let device = dev.dev().name();
        let (tx, rx) = mpsc::channel(64);
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name(format!("iser-listen-{}", local.port()))
            .spawn(move || listen_loop(listener, dev, cfg, tx, runtime))?;
        Ok(DevicePortal {
            local,
            device,
            arrivals: Mutex::new(rx),
        })
    }
}

fn listen_loop<P>(
    listener: P::Listener,
    dev: Arc<TargetDevice<P>>,
    cfg: AcceptConfig,
    tx: mpsc::Sender<Box<dyn LoginChannel>>,
    runtime: tokio::runtime::Handle,
) where
    P: Device,
    <P::Listener as Listener>::Request: ConnectRequest<Qp = P::Qp> + 'static,
{
    while !tx.is_closed() {
        let req = match listener.get_request(POLL) {
            Ok(Some(req)) => req,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("iSER portal on {}: {e}", listener.local_addr());
                std::thread::sleep(POLL);
                continue;
            }
        };
        let (dev, arrivals) = (dev.clone(), tx.clone());
        runtime.spawn(async move {
            let peer = req.peer_addr();
            match accept(dev, req, cfg).await {
                Ok(login) => {
                    let _ = arrivals.send(Box::new(login)).await;
                }
                Err(why) => tracing::info!(%peer, "iSER connection refused: {why}"),
            }
        });
    }
}

#[async_trait]
impl Portal for DevicePortal {
    fn kind(&self) -> TransportKind {
        TransportKind::Iser
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn describe(&self) -> String {
        format!("iSER on {}", self.device)
    }

    async fn accept(&self, _trace: Option<&PduTrace>) -> io::Result<Box<dyn LoginChannel>> {
        self.arrivals
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| io::Error::other(format!("the iSER portal on {} stopped", self.local)))
    }
}
