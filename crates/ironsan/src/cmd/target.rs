//! `ironsan target`: serve iSCSI targets.

#[derive(clap::Args)]
pub struct TargetArgs {
    /// Portal to listen on (repeatable). Default 127.0.0.1:3260.
    #[arg(long = "portal", value_name = "ADDR:PORT")]
    pub portals: Vec<String>,
    /// TOML configuration file (portals, targets, LUNs, ACLs, CHAP).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

pub fn run(_args: TargetArgs) -> anyhow::Result<()> {
    anyhow::bail!("the target runtime is not built yet")
}
