//! `ironsan target`'s NVMe/TCP front end: the configuration's `[[subsystem]]` tables served
//! by `nvme_target` over the LUNs the iSCSI target opened, so one LUN is reachable over
//! both protocols at once.

use std::sync::Arc;

/// Binds the subsystems (none: nothing) and starts serving them; prints where, with the
/// nvme-cli commands to try. The task ends the NVMe/TCP front end when aborted.
pub async fn start(
    subsystems: &[nvme_target::SubsystemConfig],
    target: Arc<iscsi_target::Target>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    if subsystems.is_empty() {
        return Ok(None);
    }
    let t = target.clone();
    let nvme = nvme_target::NvmeTarget::from_config(
        subsystems,
        move |name, lun| t.lun_export(name, lun),
        nvme_target::DriverConfig::default(),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    for a in nvme.local_addrs() {
        println!("ironsan: serving NVMe/TCP on {a}");
    }
    if let Some(s) = subsystems.first() {
        if let Some(d) = s.discovery_addrs().ok().and_then(|d| d.first().copied()) {
            println!("    nvme discover -t tcp -a {} -s {}", d.ip(), d.port());
        }
        if let Some(a) = s.listen_addrs().ok().and_then(|l| l.first().copied()) {
            println!(
                "    nvme connect -t tcp -a {} -s {} -n {}",
                a.ip(),
                a.port(),
                s.nqn
            );
        }
    }
    Ok(Some(tokio::spawn(nvme.serve())))
}
