//! The running target's side of the control socket (`ironsan target --control`): the method
//! table `ironsan admin` calls, each method a few lines over [`iscsi_target::Target`]'s API.
//! docs/admin.md documents every method; adding one is a `methods.add(...)` below and its
//! paragraph there.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use control::{codec::RpcError, Methods, Params, Server, ServerConfig};
use iscsi_target::{LunAdminError, PortalSpec, Target};
use serde_json::{json, Value};

/// What every method reaches.
pub struct Admin {
    pub target: Arc<Target>,
}

/// Binds the control socket at `path` (call it within the target's runtime) and returns
/// what serves it, until dropped (which removes the socket).
pub fn bind(path: &Path, target: Arc<Target>) -> std::io::Result<(Server, Methods<Admin>)> {
    let server = Server::bind(ServerConfig::new(path))?;
    Ok((server, methods(Arc::new(Admin { target }))))
}

/// The method table.
pub fn methods(admin: Arc<Admin>) -> Methods<Admin> {
    let mut m = Methods::new(admin);
    m.add("targets.list", |a, p| async move {
        p.finish()?;
        let names = a.target.target_names();
        Ok(names
            .iter()
            .filter_map(|n| a.target.target_info(n))
            .map(|t| {
                json!({
                    "name": t.name,
                    "alias": t.alias,
                    "luns": t.luns.iter().map(|l| l.lun).collect::<Vec<_>>(),
                    "initiators": t.initiators,
                    "chap": t.chap,
                })
            })
            .collect())
    })
    .add("target.show", |a, mut p| async move {
        let name = p.str("target")?;
        p.finish()?;
        Ok(json!(target_info(&a, &name)?))
    })
    .add("lun.list", |a, mut p| async move {
        let name = p.str("target")?;
        p.finish()?;
        Ok(json!(target_info(&a, &name)?.luns))
    })
    .add("lun.add", |a, mut p| async move {
        let name = p.str("target")?;
        let lun = p.u64("lun")?;
        let config: scsi::LunConfig =
            p.rest("the LUN's keys as in a [target.lun.N] table (backend, size, ...)")?;
        a.target
            .add_lun(&name, lun, config)
            .await
            .map_err(lun_error)?;
        let info = target_info(&a, &name)?;
        Ok(json!(info.luns.into_iter().find(|l| l.lun == lun)))
    })
    .add("lun.remove", |a, mut p| async move {
        let name = p.str("target")?;
        let lun = p.u64("lun")?;
        p.finish()?;
        a.target.remove_lun(&name, lun).await.map_err(lun_error)?;
        Ok(Value::Null)
    })
    .add("portal.list", |a, p| async move {
        p.finish()?;
        Ok(portals(&a))
    })
    .add("portal.add", |a, mut p| async move {
        let spec = portal_param(&mut p)?;
        p.finish()?;
        add_portal(&a, spec).await
    })
    .add("portal.remove", |a, mut p| async move {
        let spec = portal_param(&mut p)?;
        p.finish()?;
        if !a.target.remove_portal(spec.address) {
            return Err(RpcError::not_found(format!(
                "no portal is bound to {} (portal.list shows them)",
                spec.address
            )));
        }
        Ok(Value::Null)
    })
    .add("sessions.count", |a, p| async move {
        p.finish()?;
        Ok(json!(a.target.session_count()))
    });
    m
}

fn target_info(a: &Admin, name: &str) -> Result<iscsi_target::inspect::TargetInfo, RpcError> {
    a.target.target_info(name).ok_or_else(|| no_target(name))
}

fn no_target(name: &str) -> RpcError {
    RpcError::not_found(format!(
        "no target is named {name} (targets.list shows them)"
    ))
}

fn lun_error(e: LunAdminError) -> RpcError {
    match e {
        LunAdminError::NoSuchTarget(name) => no_target(&name),
        LunAdminError::Lun(scsi::LunChangeError::NotFound(n)) => {
            RpcError::not_found(format!("there is no LUN {n} (lun.list shows them)"))
        }
        LunAdminError::Lun(scsi::LunChangeError::InUse(n)) => RpcError::refused(format!(
            "LUN {n} is already in use: choose another number, or remove it first"
        )),
        LunAdminError::Lun(e) => RpcError::refused(e.to_string()),
    }
}

fn portals(a: &Admin) -> Value {
    a.target
        .portals()
        .into_iter()
        .map(|(address, serves)| json!({"address": address, "serves": serves}))
        .collect()
}

fn portal_param(p: &mut Params) -> Result<PortalSpec, RpcError> {
    let text = p.str("portal")?;
    PortalSpec::parse(&text)
        .map_err(|why| RpcError::invalid_params(format!("params.portal: {why}")))
}

/// Binds a tcp:// portal and serves it; iSER portals need the RNIC or device chosen at start,
/// so they are refused.
async fn add_portal(a: &Admin, spec: PortalSpec) -> Result<Value, RpcError> {
    if spec.kind != datamover::TransportKind::Tcp {
        return Err(RpcError::refused(
            "only tcp:// portals can be added while the target runs; list iser:// portals in the configuration",
        ));
    }
    let portal = datamover_tcp::TcpPortal::bind(spec.address)
        .await
        .map_err(|e| RpcError::refused(format!("cannot listen on {}: {e}", spec.address)))?;
    let address: SocketAddr = datamover::Portal::local_addr(&portal);
    a.target.add_portal(Arc::new(portal));
    Ok(json!({"address": address, "serves": "iSCSI/TCP"}))
}
