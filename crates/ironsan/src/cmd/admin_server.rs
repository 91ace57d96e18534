//! The running target's side of the control socket (`ironsan target --control`): the method
//! table `ironsan admin` calls, each method a few lines over [`iscsi_target::Target`]'s API.
//! docs/admin.md documents every method; adding one is a `methods.add(...)` below and its
//! paragraph there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use control::{codec::RpcError, Methods, Params, Server, ServerConfig};
use iscsi_target::{LunAdminError, PortalSpec, Target};
use serde_json::{json, Value};

/// What every method reaches.
pub struct Admin {
    pub target: Arc<Target>,
    /// The configuration file the target started from (`config.save` writes there by
    /// default); none for the embedded default.
    pub config_path: Option<PathBuf>,
}

/// Binds the control socket at `path` (call it within the target's runtime) and returns
/// what serves it, until dropped (which removes the socket).
pub fn bind(
    path: &Path,
    target: Arc<Target>,
    config_path: Option<PathBuf>,
) -> std::io::Result<(Server, Methods<Admin>)> {
    let server = Server::bind(ServerConfig::new(path))?;
    let admin = Admin {
        target,
        config_path,
    };
    Ok((server, methods(Arc::new(admin))))
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
    .add("alua.show", |a, mut p| async move {
        let name = p.str("target")?;
        p.finish()?;
        alua_show(&a, &name)
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
        autosave(&a)?;
        Ok(json!(info.luns.into_iter().find(|l| l.lun == lun)))
    })
    .add("lun.remove", |a, mut p| async move {
        let name = p.str("target")?;
        let lun = p.u64("lun")?;
        p.finish()?;
        a.target.remove_lun(&name, lun).await.map_err(lun_error)?;
        autosave(&a)?;
        Ok(Value::Null)
    })
    .add("portal.list", |a, p| async move {
        p.finish()?;
        Ok(portals(&a))
    })
    .add("portal.add", |a, mut p| async move {
        let spec = portal_param(&mut p)?;
        p.finish()?;
        let added = add_portal(&a, spec).await?;
        autosave(&a)?;
        Ok(added)
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
        autosave(&a)?;
        Ok(Value::Null)
    })
    .add("sessions.count", |a, p| async move {
        p.finish()?;
        Ok(json!(a.target.session_count()))
    });
    live_methods(&mut m);
    m
}

/// Methods over the target's live administration (`iscsi_target::Target`'s admin API):
/// targets, ACLs, CHAP, LUN flags and sizes, sessions, the running configuration.
fn live_methods(m: &mut Methods<Admin>) {
    m.add("target.add", |a, mut p| async move {
        let config: iscsi_target::config::TargetConfig =
            p.rest("the target's keys as in a [[target]] table (name, initiators, lun, ...)")?;
        let name = config.name.clone();
        a.target
            .add_target(config)
            .await
            .map_err(RpcError::refused)?;
        autosave(&a)?;
        Ok(json!(target_info(&a, &name)?))
    })
    .add("target.remove", |a, mut p| async move {
        let name = p.str("target")?;
        p.finish()?;
        a.target
            .remove_target(&name)
            .await
            .map_err(refused_or_missing)?;
        autosave(&a)?;
        Ok(Value::Null)
    })
    .add("acl.add", |a, mut p| async move {
        let (name, initiator) = (p.str("target")?, p.str("initiator")?);
        p.finish()?;
        let r = a.target.add_initiator(&name, &initiator).await;
        r.map_err(refused_or_missing)?;
        autosave(&a)?;
        Ok(json!(target_info(&a, &name)?.initiators))
    })
    .add("acl.remove", |a, mut p| async move {
        let (name, initiator) = (p.str("target")?, p.str("initiator")?);
        p.finish()?;
        let r = a.target.remove_initiator(&name, &initiator).await;
        r.map_err(refused_or_missing)?;
        autosave(&a)?;
        Ok(json!(target_info(&a, &name)?.initiators))
    })
    .add("acl.set", |a, mut p| async move {
        let name = p.str("target")?;
        let initiators: Vec<String> = p.typed("initiators", "a list of initiator names")?;
        p.finish()?;
        let r = a.target.set_initiators(&name, initiators).await;
        r.map_err(refused_or_missing)?;
        autosave(&a)?;
        Ok(json!(target_info(&a, &name)?.initiators))
    })
    .add("chap.set", |a, mut p| async move {
        let name = p.opt_str("target")?;
        let chap = opt_chap(&mut p, "chap")?;
        let mutual = opt_chap(&mut p, "mutual_chap")?;
        p.finish()?;
        let r = match &name {
            Some(name) => a.target.set_chap(name, chap, mutual).await,
            None => a.target.set_discovery_chap(chap, mutual).await,
        };
        r.map_err(refused_or_missing)?;
        autosave(&a)?;
        Ok(Value::Null)
    })
    .add("lun.set_read_only", |a, mut p| async move {
        let (name, lun) = (p.str("target")?, p.u64("lun")?);
        let read_only = p.bool("read_only")?;
        p.finish()?;
        let r = a.target.set_lun_read_only(&name, lun, read_only).await;
        r.map_err(lun_error)?;
        autosave(&a)?;
        Ok(json!(lun_info(&a, &name, lun)?))
    })
    .add("lun.resize", |a, mut p| async move {
        let (name, lun) = (p.str("target")?, p.u64("lun")?);
        let size: scsi::ByteSize = p.typed("size", "a size in bytes, or text such as \"2GiB\"")?;
        p.finish()?;
        a.target
            .resize_lun(&name, lun, size.0)
            .await
            .map_err(lun_error)?;
        autosave(&a)?;
        Ok(json!(lun_info(&a, &name, lun)?))
    });
    session_methods(m);
    config_methods(m);
}

fn session_methods(m: &mut Methods<Admin>) {
    m.add("sessions.list", |a, p| async move {
        p.finish()?;
        Ok(json!(a.target.sessions()))
    })
    .add("session.logout", |a, mut p| async move {
        let tsih = tsih(&mut p)?;
        let grace = p.opt_u64("grace_secs")?.unwrap_or(5).clamp(1, 3600);
        p.finish()?;
        let r = a
            .target
            .logout_session(tsih, Duration::from_secs(grace))
            .await;
        r.map_err(RpcError::not_found)?;
        Ok(Value::Null)
    })
    .add("session.drop", |a, mut p| async move {
        let tsih = tsih(&mut p)?;
        p.finish()?;
        a.target.drop_session(tsih).map_err(RpcError::not_found)?;
        Ok(Value::Null)
    });
}

fn config_methods(m: &mut Methods<Admin>) {
    m.add("config.show", |a, p| async move {
        p.finish()?;
        Ok(json!(a.target.running_config().to_toml()))
    })
    .add("config.save", |a, mut p| async move {
        let path = p.opt_str("path")?.map(PathBuf::from);
        p.finish()?;
        let Some(path) = path.or_else(|| a.config_path.clone()) else {
            return Err(RpcError::invalid_params(
                "params.path: the target started without --config: say where to save",
            ));
        };
        let config = a.target.running_config();
        iscsi_target::config::save_atomic(&path, &config)
            .map_err(|e| RpcError::refused(format!("{}: {}", path.display(), e.0)))?;
        Ok(json!({ "path": path }))
    });
}

/// With `save_on_change`, writes the running configuration to the file the target started
/// from after a change. A failed save leaves the change made and says so.
fn autosave(a: &Admin) -> Result<(), RpcError> {
    let config = a.target.running_config();
    let (true, Some(path)) = (config.save_on_change, &a.config_path) else {
        return Ok(());
    };
    iscsi_target::config::save_atomic(path, &config).map_err(|e| {
        RpcError::refused(format!(
            "the change was made but not saved ({}: {}): fix that, then run `ironsan admin save`",
            path.display(),
            e.0
        ))
    })
}

fn tsih(p: &mut Params) -> Result<u16, RpcError> {
    let v = p.u64("tsih")?;
    u16::try_from(v).map_err(|_| RpcError::invalid_params("params.tsih: a TSIH is 1 to 65535"))
}

fn opt_chap(
    p: &mut Params,
    name: &'static str,
) -> Result<Option<iscsi_target::config::Chap>, RpcError> {
    p.opt_typed(name, "an object {\"user\": ..., \"secret\": ...}")
}

fn lun_info(a: &Admin, name: &str, lun: u64) -> Result<iscsi_target::inspect::LunInfo, RpcError> {
    target_info(a, name)?
        .luns
        .into_iter()
        .find(|l| l.lun == lun)
        .ok_or_else(|| RpcError::not_found(format!("there is no LUN {lun} (lun.list shows them)")))
}

/// The admin API's errors are sentences; the ones about a missing target are "not found".
fn refused_or_missing(why: String) -> RpcError {
    if why.starts_with("no target") {
        RpcError::not_found(why)
    } else {
        RpcError::refused(why)
    }
}

fn target_info(a: &Admin, name: &str) -> Result<iscsi_target::inspect::TargetInfo, RpcError> {
    a.target.target_info(name).ok_or_else(|| no_target(name))
}

/// `alua.show`: this gateway's `[gateway]` identity and its ALUA state for each LUN.
fn alua_show(a: &Admin, name: &str) -> Result<Value, RpcError> {
    let luns = a.target.alua_status(name).ok_or_else(|| no_target(name))?;
    let config = a.target.running_config();
    let gateway = config.gateway.as_ref().map(|g| {
        json!({
            "group": g.group,
            "name": g.name,
            "port_group": g.port_group,
            "relative_port": g.relative_port,
        })
    });
    let luns: Vec<Value> = luns
        .into_iter()
        .map(|(lun, s)| {
            json!({
                "lun": lun,
                "state": s.state.name(),
                "shared": s.shared,
                "owner": s.owner,
                "acquired": s.acquired,
                "lost": s.lost,
                "failbacks": s.failbacks,
                "last_error": s.last_error,
            })
        })
        .collect();
    Ok(json!({ "gateway": gateway, "luns": luns }))
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

async fn add_portal(a: &Admin, spec: PortalSpec) -> Result<Value, RpcError> {
    let address = bind_tcp_portal(&a.target, spec)
        .await
        .map_err(RpcError::refused)?;
    Ok(json!({"address": address, "serves": "iSCSI/TCP"}))
}

/// Binds a tcp:// portal and serves it on `target` (which lists it in its running
/// configuration); iSER portals need the RNIC or device chosen at start, so they are
/// refused. The address bound.
pub async fn bind_tcp_portal(target: &Arc<Target>, spec: PortalSpec) -> Result<SocketAddr, String> {
    if spec.kind != datamover::TransportKind::Tcp {
        return Err(format!(
            "{spec}: only tcp:// portals can be added while the target runs; iser:// portals are bound at start"
        ));
    }
    let portal = datamover_tcp::TcpPortal::bind(spec.address)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", spec.address))?;
    let address: SocketAddr = datamover::Portal::local_addr(&portal);
    target.add_portal(Arc::new(portal));
    Ok(address)
}
