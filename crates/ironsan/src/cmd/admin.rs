//! `ironsan admin`: watch and change a running target through its control socket
//! (`ironsan target --control`; the protocol in docs/admin.md). Readable tables by default,
//! the method's JSON result with `--json`; an error is one line saying what to fix, and a
//! nonzero exit status.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use control::client::Client;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct AdminArgs {
    /// The target's control socket (default: $XDG_RUNTIME_DIR/ironsan/control.sock; root:
    /// /run/ironsan/control.sock).
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// Print the method's result as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for the target's answer.
    #[arg(long, value_name = "SECS", default_value_t = 90, global = true)]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// The targets with their LUN numbers, ACL and whether CHAP is set.
    Targets,
    /// One target.
    #[command(subcommand)]
    Target(TargetCommand),
    /// A target's LUNs.
    Luns { target: String },
    /// Add or remove a LUN while the target runs.
    #[command(subcommand)]
    Lun(LunCommand),
    /// The portals the target listens on.
    Portals,
    /// Add or remove a portal while the target runs.
    #[command(subcommand)]
    Portal(PortalCommand),
    /// How many sessions are logged in.
    Sessions,
    /// Any method, its params as a JSON object; prints the JSON result.
    Call {
        method: String,
        #[arg(value_name = "JSON")]
        params: Option<String>,
    },
}

#[derive(clap::Subcommand)]
pub enum TargetCommand {
    /// Name, alias, ACL, CHAP (set or not; never the secret) and LUNs of a target.
    Show { name: String },
}

#[derive(clap::Subcommand)]
pub enum LunCommand {
    /// Add LUN number LUN to TARGET: a RAM disk (--ram SIZE), a file (--file PATH) or a
    /// block device (--block PATH).
    Add(LunAddArgs),
    /// Remove LUN number LUN from TARGET (once the commands running on it finish).
    Rm { target: String, lun: u64 },
}

#[derive(clap::Args)]
pub struct LunAddArgs {
    pub target: String,
    pub lun: u64,
    /// A RAM LUN of this size ("64MiB", "1GiB").
    #[arg(long, value_name = "SIZE", required_unless_present_any = ["file", "block"], conflicts_with_all = ["file", "block"])]
    pub ram: Option<String>,
    /// A LUN in this file.
    #[arg(long, value_name = "PATH", conflicts_with = "block")]
    pub file: Option<PathBuf>,
    /// A LUN on this block device.
    #[arg(long, value_name = "PATH")]
    pub block: Option<PathBuf>,
    /// Size of a file LUN (default: the file's); with --create, the new file's.
    #[arg(long, value_name = "SIZE", conflicts_with = "ram")]
    pub size: Option<String>,
    /// Create the --file if it does not exist.
    #[arg(long, requires = "file")]
    pub create: bool,
    /// 512 or 4096.
    #[arg(long, value_name = "BYTES")]
    pub block_size: Option<u32>,
    /// Writes fail with DATA PROTECT.
    #[arg(long)]
    pub read_only: bool,
}

#[derive(clap::Subcommand)]
pub enum PortalCommand {
    /// Listen on tcp://ADDR:PORT too (port 0: any free one; the answer says which).
    Add { portal: String },
    /// Stop listening on a portal (its sessions carry on).
    Rm { portal: String },
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let socket = match args.socket.clone().or_else(control::default_socket_path) {
        Some(p) => p,
        None => anyhow::bail!(
            "no control socket given and XDG_RUNTIME_DIR is not set: pass --socket PATH (the target's --control PATH)"
        ),
    };
    let (method, params) = request(&args.command)?;
    let mut client = Client::connect(&socket, Duration::from_secs(args.timeout.max(1)))?;
    let result = client.call(method, params)?;
    if args.json || matches!(args.command, AdminCommand::Call { .. }) {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    print!("{}", show(&args.command, &result));
    Ok(())
}

/// The method and params a subcommand calls.
fn request(command: &AdminCommand) -> anyhow::Result<(&str, Option<Value>)> {
    Ok(match command {
        AdminCommand::Targets => ("targets.list", None),
        AdminCommand::Target(TargetCommand::Show { name }) => {
            ("target.show", Some(json!({ "target": name })))
        }
        AdminCommand::Luns { target } => ("lun.list", Some(json!({ "target": target }))),
        AdminCommand::Lun(LunCommand::Add(a)) => ("lun.add", Some(lun_add_params(a)?)),
        AdminCommand::Lun(LunCommand::Rm { target, lun }) => {
            ("lun.remove", Some(json!({ "target": target, "lun": lun })))
        }
        AdminCommand::Portals => ("portal.list", None),
        AdminCommand::Portal(PortalCommand::Add { portal }) => {
            ("portal.add", Some(json!({ "portal": portal })))
        }
        AdminCommand::Portal(PortalCommand::Rm { portal }) => {
            ("portal.remove", Some(json!({ "portal": portal })))
        }
        AdminCommand::Sessions => ("sessions.count", None),
        AdminCommand::Call { method, params } => {
            let params = match params {
                Some(text) => Some(serde_json::from_str(text).with_context(|| {
                    format!("{method}: the params are not JSON (write an object such as '{{\"target\": \"iqn...\"}}')")
                })?),
                None => None,
            };
            (method.as_str(), params)
        }
    })
}

fn lun_add_params(a: &LunAddArgs) -> anyhow::Result<Value> {
    // The target resolves paths from its own directory: send them absolute.
    let absolute = |p: &PathBuf| {
        std::path::absolute(p)
            .map(|p| p.display().to_string())
            .with_context(|| format!("{}: cannot make the path absolute", p.display()))
    };
    let mut p = json!({ "target": a.target, "lun": a.lun });
    if let Some(size) = &a.ram {
        p["backend"] = "memory".into();
        p["size"] = size.as_str().into();
    } else if let Some(file) = &a.file {
        p["backend"] = json!({ "type": "file", "path": absolute(file)?, "create": a.create });
    } else if let Some(block) = &a.block {
        p["backend"] = json!({ "type": "block", "path": absolute(block)? });
    }
    if let Some(size) = &a.size {
        p["size"] = size.as_str().into();
    }
    if let Some(bs) = a.block_size {
        p["block_size"] = bs.into();
    }
    if a.read_only {
        p["read_only"] = true.into();
    }
    Ok(p)
}

/// The readable form of a result.
fn show(command: &AdminCommand, result: &Value) -> String {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    match command {
        AdminCommand::Targets => table(
            &["TARGET", "ALIAS", "LUNS", "ACL", "CHAP"],
            list(result)
                .iter()
                .map(|t| {
                    let luns: Vec<String> = list(&t["luns"]).iter().map(s).collect();
                    vec![
                        s(&t["name"]),
                        s(&t["alias"]),
                        luns.join(","),
                        acl(&t["initiators"]),
                        yes_no(&t["chap"]),
                    ]
                })
                .collect(),
        ),
        AdminCommand::Target(_) => {
            let chap = match (result["chap"].as_bool(), result["mutual_chap"].as_bool()) {
                (Some(true), Some(true)) => "yes (mutual)",
                (Some(true), _) => "yes",
                _ => "no",
            };
            format!(
                "target  {}\nalias   {}\nacl     {}\nchap    {chap}\n\n{}",
                s(&result["name"]),
                s(&result["alias"]),
                acl(&result["initiators"]),
                lun_table(&result["luns"])
            )
        }
        AdminCommand::Luns { .. } => lun_table(result),
        AdminCommand::Lun(LunCommand::Add(a)) => {
            format!(
                "added LUN {} to {}\n{}",
                a.lun,
                a.target,
                lun_table(&json!([result]))
            )
        }
        AdminCommand::Lun(LunCommand::Rm { target, lun }) => {
            format!("removed LUN {lun} from {target}\n")
        }
        AdminCommand::Portals => table(
            &["PORTAL", "SERVES"],
            list(result)
                .iter()
                .map(|p| vec![s(&p["address"]), s(&p["serves"])])
                .collect(),
        ),
        AdminCommand::Portal(PortalCommand::Add { .. }) => {
            format!(
                "listening on {} ({})\n",
                s(&result["address"]),
                s(&result["serves"])
            )
        }
        AdminCommand::Portal(PortalCommand::Rm { portal }) => format!("removed portal {portal}\n"),
        AdminCommand::Sessions => format!("{} sessions\n", s(result)),
        AdminCommand::Call { .. } => format!("{result}\n"),
    }
}

fn yes_no(v: &Value) -> String {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
    .into()
}

fn acl(v: &Value) -> String {
    let names: Vec<&str> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        "any initiator".into()
    } else {
        names.join(", ")
    }
}

fn lun_table(luns: &Value) -> String {
    let rows = luns
        .as_array()
        .map(|a| a.iter().filter(|l| !l.is_null()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|l| {
            vec![
                l["lun"].to_string(),
                l["backend"].as_str().unwrap_or("?").to_string(),
                l["size"]
                    .as_u64()
                    .map(byte_size::format_size)
                    .unwrap_or_else(|| "-".into()),
                l["block_size"]
                    .as_u64()
                    .map(|b| b.to_string())
                    .unwrap_or_else(|| "-".into()),
                yes_no(&l["read_only"]),
                l["path"].as_str().unwrap_or("-").to_string(),
            ]
        })
        .collect();
    table(&["LUN", "BACKEND", "SIZE", "BLOCK", "RO", "PATH"], rows)
}

/// Columns padded to their widest cell, two spaces apart.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let t = table(
            &["A", "BB"],
            vec![vec!["xyz".into(), "1".into()], vec!["q".into(), "".into()]],
        );
        assert_eq!(t, "A    BB\nxyz  1\nq\n");
    }

    #[test]
    fn a_ram_lun_is_asked_for_with_the_config_s_keys() {
        let a = LunAddArgs {
            target: "t".into(),
            lun: 3,
            ram: Some("64MiB".into()),
            file: None,
            block: None,
            size: None,
            create: false,
            block_size: Some(4096),
            read_only: true,
        };
        let p = lun_add_params(&a).unwrap();
        assert_eq!(
            p,
            json!({"target": "t", "lun": 3, "backend": "memory", "size": "64MiB", "block_size": 4096, "read_only": true})
        );
        let mut rest = p.as_object().unwrap().clone();
        rest.remove("target");
        rest.remove("lun");
        let cfg: scsi::LunConfig = serde_json::from_value(Value::Object(rest)).unwrap();
        assert_eq!(cfg.size, Some(scsi::ByteSize(64 << 20)));
        assert!(cfg.read_only);
    }
}
