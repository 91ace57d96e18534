//! What a control client reads of a running target ([`Target::target_names`],
//! [`Target::target_info`]): each target's name, alias, ACL, whether CHAP is set (never the
//! secrets) and its LUNs as they are now, live additions and removals included.

use serde::Serialize;

use crate::Target;

/// One target as a control client sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TargetInfo {
    pub name: String,
    pub alias: Option<String>,
    /// Initiator names allowed to log in; empty allows all.
    pub initiators: Vec<String>,
    /// Whether initiators must authenticate with CHAP.
    pub chap: bool,
    /// Whether the target authenticates itself to initiators too.
    pub mutual_chap: bool,
    pub luns: Vec<LunInfo>,
}

/// One LUN as a control client sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LunInfo {
    pub lun: u64,
    /// "memory", "file", "block", "osd" or "rbd".
    pub backend: &'static str,
    /// The file, device or directory (pool/image for rbd); none for memory.
    pub path: Option<String>,
    /// Capacity in bytes (block LUNs).
    pub size: Option<u64>,
    pub block_size: Option<u32>,
    pub read_only: bool,
}

fn describe(lun: u64, cfg: &scsi::LunConfig, capacity: Option<(u64, u32)>) -> LunInfo {
    use scsi::BackendConfig as B;
    let (backend, path) = match &cfg.backend {
        B::Memory => ("memory", None),
        B::File { path, .. } => ("file", Some(path.display().to_string())),
        B::Block { path } => ("block", Some(path.display().to_string())),
        B::Osd { path } => ("osd", Some(path.display().to_string())),
        B::Rbd(spec) => ("rbd", Some(format!("{}/{}", spec.pool, spec.image))),
    };
    LunInfo {
        lun,
        backend,
        path,
        size: capacity.map(|(blocks, bs)| blocks.saturating_mul(u64::from(bs))),
        block_size: capacity.map(|(_, bs)| bs),
        read_only: cfg.read_only,
    }
}

impl Target {
    /// The configured targets' names, in configuration order.
    pub fn target_names(&self) -> Vec<String> {
        self.config()
            .targets
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    /// The target named `name` (any case) as it is now; `None` when there is none.
    pub fn target_info(&self, name: &str) -> Option<TargetInfo> {
        let config = self.config();
        let t = config
            .targets
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))?;
        let device = self.device(&t.name).ok()?;
        // The device keeps every LUN's configuration as it runs (object LUNs' too); one
        // removed between the two calls is left out.
        let luns = device
            .luns()
            .into_iter()
            .filter_map(|lun| {
                Some(describe(
                    lun,
                    &device.lun_config(lun)?,
                    device.capacity(lun),
                ))
            })
            .collect();
        Some(TargetInfo {
            name: t.name.clone(),
            alias: t.alias.clone(),
            initiators: t.initiators.clone(),
            chap: t.chap.is_some(),
            mutual_chap: t.mutual_chap.is_some(),
            luns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[tokio::test]
    async fn a_target_is_described_with_its_luns_and_without_secrets() {
        let config = Config::parse(
            r#"
portals = ["127.0.0.1:0"]
[[target]]
name = "iqn.2026-11.org.ironsan:a"
alias = "first"
initiators = ["iqn.2026-11.org.example:host"]
chap = { user = "u", secret = "s3cret-s3cret" }
[target.lun.0]
size = "1MiB"
backend = "memory"
read_only = true
"#,
            "t.toml",
        )
        .unwrap();
        let target = Target::with_portals(config, Vec::new()).unwrap().target();
        assert_eq!(target.target_names(), vec!["iqn.2026-11.org.ironsan:a"]);
        let info = target
            .target_info("IQN.2026-11.org.ironsan:A")
            .expect("found");
        assert_eq!(info.alias.as_deref(), Some("first"));
        assert!(info.chap && !info.mutual_chap);
        assert_eq!(info.initiators, vec!["iqn.2026-11.org.example:host"]);
        assert_eq!(
            info.luns,
            vec![LunInfo {
                lun: 0,
                backend: "memory",
                path: None,
                size: Some(1 << 20),
                block_size: Some(512),
                read_only: true,
            }]
        );
        let json = format!("{info:?}");
        assert!(!json.contains("s3cret"), "{json}");
        assert!(target.target_info("iqn.2026-11.org.ironsan:b").is_none());
    }
}
