//! The target's transports: every portal of a configuration bound (iSCSI/TCP, iSER on the
//! software RNIC and its reactor or on an rdma-core device, one port shared by both when an
//! address is listed for both), and the device RAM LUNs' images are registered with, handed
//! to [`Target::serve`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use datamover::TransportKind;
use datamover_iser::TargetDevice;
use iscsi_target::{Bound, Config, IserProvider, PortalSpec, Target, DEFAULT_PORTAL};

/// Opens every LUN's backend and binds every portal of the configuration (the default portal
/// when it lists none).
pub async fn bind_target(mut config: Config) -> Result<Bound, String> {
    if config.portals.is_empty() {
        config.portals.push(DEFAULT_PORTAL.to_string());
    }
    let specs = config
        .portals
        .iter()
        .map(|p| PortalSpec::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let (portals, images) = bind_portals(&specs, &config).await?;
    let register = config
        .iser_register_ram_luns
        .unwrap_or(config.iser_provider == IserProvider::Software);
    let images = images.filter(|_| register);
    Target::serve(config, portals, images.map(Arc::from))
}

/// Binds every listed portal. An address listed for iSER serves iSER over the software RNIC,
/// and iSCSI/TCP too when it is also listed for TCP (one listener, the protocol told by the
/// first bytes); with `iser_provider = "rdma-core"`, over the first rdma-core device instead
/// (its listener owns the port).
/// Also returns where RAM LUNs' images can be registered: the software RNIC's device when an
/// iSER portal uses it, else the first rdma-core portal's.
async fn bind_portals(
    specs: &[PortalSpec],
    config: &Config,
) -> Result<
    (
        Vec<Arc<dyn datamover::Portal>>,
        Option<Box<scsi::ImageProvider>>,
    ),
    String,
> {
    use TransportKind::{Iser, Tcp};
    let listed = |kind, address| specs.iter().any(|s| s.kind == kind && s.address == address);
    let mut rnic: Option<SoftwareRnic> = None;
    let mut images = None;
    let mut portals: Vec<Arc<dyn datamover::Portal>> = Vec::new();
    let mut bound = HashSet::new();
    for spec in specs {
        if !bound.insert(spec.address) {
            continue;
        }
        let cannot = |e: std::io::Error| format!("cannot listen on {}: {e}", spec.address);
        if listed(Iser, spec.address) {
            let also_tcp = listed(Tcp, spec.address);
            let cfg = datamover_iser::AcceptConfig {
                crc: config.iser_mpa_crc,
                max_sorting: config.max_pending_logins as usize,
                ..datamover_iser::AcceptConfig::for_queue_depth(config.queue_depth)
            };
            if config.iser_provider == IserProvider::RdmaCore {
                if also_tcp {
                    return Err(format!(
                        "{}: with iser_provider = \"rdma-core\" the RDMA device's listener owns the port; list tcp:// on another port",
                        spec.address
                    ));
                }
                let (portal, device_images) = rdma_core_portal(spec.address, cfg)?;
                portals.push(portal);
                images = images.or(Some(device_images));
                continue;
            }
            let (dev, reactor) = match &rnic {
                Some(d) => d.clone(),
                None => {
                    let d = software_rnic(config)?;
                    rnic = Some(d.clone());
                    d
                }
            };
            let tcp_poll = Duration::from_micros(config.tcp_poll_us);
            let tcp = also_tcp.then(|| datamover_tcp::login_channels_polling(tcp_poll));
            let p = datamover_iser::IserPortal::bind_on(spec.address, dev, reactor, cfg, tcp)
                .await
                .map_err(cannot)?;
            portals.push(Arc::new(p));
        } else {
            let p = datamover_tcp::TcpPortal::bind(spec.address)
                .await
                .map_err(cannot)?
                .with_poll(Duration::from_micros(config.tcp_poll_us));
            portals.push(Arc::new(p));
        }
    }
    // The software RNIC's device comes first: it serves every software iser:// portal.
    let images = rnic.map(|(d, _)| image_provider(d)).or(images);
    Ok((portals, images))
}

/// The software RNIC iSER portals share, and the reactor it runs on (none: its own thread).
type SoftwareRnic = (
    Arc<TargetDevice<rnic::Rnic>>,
    Option<Arc<datamover_iser::rnic_task::Reactor>>,
);

/// Starts the software RNIC: on a reactor thread with the connections (`iser_reactor`), or
/// with an engine thread of its own while connections run on the target's runtime.
fn software_rnic(config: &Config) -> Result<SoftwareRnic, String> {
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot start the software RNIC for iSER: {e}");
    let (d, reactor) = if config.iser_reactor {
        let poll = Duration::from_micros(config.iser_poll_us);
        let (reactor, d) = datamover_iser::rnic_task::Reactor::start("iser-reactor", poll)
            .map_err(|e| cannot(&e))?;
        (d, Some(reactor))
    } else {
        (rnic::Rnic::new().map_err(|e| cannot(&e))?, None)
    };
    d.align_fpdus_on_loopback(config.iser_align_loopback);
    let d = TargetDevice::new(Arc::new(d)).map_err(|e| cannot(&e))?;
    Ok((d, reactor))
}

/// Registers a RAM LUN's image with `dev` (a LUN whose image cannot be registered lives in
/// ordinary memory, and the log says why).
fn image_provider<P: datamover_iser::endpoint::Device>(
    dev: Arc<TargetDevice<P>>,
) -> Box<scsi::ImageProvider> {
    Box::new(move |lun, size| {
        let len = usize::try_from(size).ok()?;
        match dev.register_image(len) {
            Ok(image) => Some(image as Arc<dyn storage::ImageMemory>),
            Err(e) => {
                tracing::warn!(
                    lun,
                    "the {size}-byte image of RAM LUN {lun} could not be registered with {} ({e}); it lives in ordinary memory and iSER reads copy it (on an RDMA device registration pins memory: raise the memlock limit, or set iser_register_ram_luns = false)",
                    dev.dev().name()
                );
                None
            }
        }
    })
}

/// An iser:// portal on the first rdma-core device (librdmacm's listener on `address`), and
/// where RAM LUNs' images can be registered on it.
#[cfg(feature = "rdma-core")]
fn rdma_core_portal(
    address: std::net::SocketAddr,
    cfg: datamover_iser::AcceptConfig,
) -> Result<(Arc<dyn datamover::Portal>, Box<scsi::ImageProvider>), String> {
    let dev = verbs::Verbs::open().map_err(|e| format!("no rdma-core device for iSER: {e}"))?;
    let dev =
        TargetDevice::new(Arc::new(dev)).map_err(|e| format!("rdma-core device for iSER: {e}"))?;
    let p = datamover_iser::DevicePortal::bind(address, dev.clone(), cfg)
        .map_err(|e| format!("cannot listen on {address} through rdma-core: {e}"))?;
    Ok((Arc::new(p), image_provider(dev)))
}

#[cfg(not(feature = "rdma-core"))]
fn rdma_core_portal(
    _address: std::net::SocketAddr,
    _cfg: datamover_iser::AcceptConfig,
) -> Result<(Arc<dyn datamover::Portal>, Box<scsi::ImageProvider>), String> {
    Err("iser_provider = \"rdma-core\" needs ironsan built with the rdma-core feature (cargo build --release --features rdma-core; Debian: libibverbs-dev librdmacm-dev)".into())
}

#[cfg(test)]
mod iser_provider_tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, "t.toml").expect("a valid config")
    }

    #[tokio::test]
    async fn rdma_core_iser_and_tcp_on_one_port_is_refused_in_one_line() {
        let c = config(
            "portals = [\"tcp://127.0.0.1:0\", \"iser://127.0.0.1:0\"]\niser_provider = \"rdma-core\"\n",
        );
        assert_eq!(c.iser_provider, IserProvider::RdmaCore);
        let e = bind_target(c).await.err().expect("refused");
        assert!(e.contains("owns the port") && !e.contains('\n'), "{e}");
    }

    #[cfg(not(feature = "rdma-core"))]
    #[tokio::test]
    async fn rdma_core_without_the_feature_says_how_to_build_it() {
        let c = config("portals = [\"iser://127.0.0.1:0\"]\niser_provider = \"rdma-core\"\n");
        let e = bind_target(c).await.err().expect("refused");
        assert!(
            e.contains("--features rdma-core") && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_provider_is_a_config_error() {
        assert!(Config::parse("iser_provider = \"infiniband\"\n", "t.toml").is_err());
        assert_eq!(config("").iser_provider, IserProvider::Software);
    }
}
