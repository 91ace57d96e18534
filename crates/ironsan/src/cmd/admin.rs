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
    /// One target: show, add or remove it.
    #[command(subcommand)]
    Target(TargetCommand),
    /// A target's ACL: the initiator names allowed to log in.
    #[command(subcommand)]
    Acl(AclCommand),
    /// Set or clear CHAP of a target (or, without --target, of discovery sessions).
    Chap(ChapArgs),
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
    /// The sessions logged in: initiator, TSIH, connections with their addresses.
    Sessions,
    /// Ask a session to log out (Async Message), or drop it now.
    #[command(subcommand)]
    Session(SessionCommand),
    /// The configuration as it runs now, as TOML.
    Config,
    /// Write the running configuration to the target's --config file (or PATH), atomically,
    /// the previous one kept as FILE.bak.
    Save { path: Option<PathBuf> },
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
    /// Add a target with no LUNs (add them with `lun add`), open to any initiator unless
    /// --initiator names some.
    Add {
        name: String,
        #[arg(long)]
        alias: Option<String>,
        /// An initiator name allowed to log in (repeatable).
        #[arg(long = "initiator", value_name = "IQN")]
        initiators: Vec<String>,
    },
    /// Remove a target: its sessions are closed.
    Rm { name: String },
}

#[derive(clap::Subcommand)]
pub enum AclCommand {
    /// Allow an initiator to log in to TARGET.
    Add { target: String, initiator: String },
    /// Stop allowing an initiator: its sessions with TARGET are closed.
    Rm { target: String, initiator: String },
}

#[derive(clap::Args)]
pub struct ChapArgs {
    /// The target (default: discovery sessions).
    #[arg(long)]
    pub target: Option<String>,
    /// The user initiators authenticate as (with --secret); leave both out to clear CHAP.
    #[arg(long, requires = "secret")]
    pub user: Option<String>,
    #[arg(long, requires = "user")]
    pub secret: Option<String>,
    /// Mutual CHAP: the name and secret the target answers with.
    #[arg(long, requires_all = ["mutual_secret", "user"])]
    pub mutual_user: Option<String>,
    #[arg(long, requires = "mutual_user")]
    pub mutual_secret: Option<String>,
}

#[derive(clap::Subcommand)]
pub enum SessionCommand {
    /// Ask the initiator to log out within GRACE seconds, then drop the session.
    Logout {
        tsih: u16,
        #[arg(long, value_name = "SECS", default_value_t = 5)]
        grace: u64,
    },
    /// Close the session's connections now.
    Drop { tsih: u16 },
}

#[derive(clap::Subcommand)]
pub enum LunCommand {
    /// Add LUN number LUN to TARGET: a RAM disk (--ram SIZE), a file (--file PATH) or a
    /// block device (--block PATH).
    Add(LunAddArgs),
    /// Remove LUN number LUN from TARGET (once the commands running on it finish).
    Rm { target: String, lun: u64 },
    /// Make a LUN read-only (on) or writable (off).
    ReadOnly {
        target: String,
        lun: u64,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Grow or shrink a LUN to SIZE ("2GiB"); its sessions hear CAPACITY DATA HAS CHANGED.
    Resize {
        target: String,
        lun: u64,
        size: String,
    },
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
        AdminCommand::Target(TargetCommand::Add {
            name,
            alias,
            initiators,
        }) => (
            "target.add",
            Some(json!({ "name": name, "alias": alias, "initiators": initiators })),
        ),
        AdminCommand::Target(TargetCommand::Rm { name }) => {
            ("target.remove", Some(json!({ "target": name })))
        }
        AdminCommand::Acl(AclCommand::Add { target, initiator }) => (
            "acl.add",
            Some(json!({ "target": target, "initiator": initiator })),
        ),
        AdminCommand::Acl(AclCommand::Rm { target, initiator }) => (
            "acl.remove",
            Some(json!({ "target": target, "initiator": initiator })),
        ),
        AdminCommand::Chap(c) => ("chap.set", Some(chap_params(c))),
        AdminCommand::Lun(LunCommand::ReadOnly { target, lun, state }) => (
            "lun.set_read_only",
            Some(json!({ "target": target, "lun": lun, "read_only": state == "on" })),
        ),
        AdminCommand::Lun(LunCommand::Resize { target, lun, size }) => (
            "lun.resize",
            Some(json!({ "target": target, "lun": lun, "size": size })),
        ),
        AdminCommand::Sessions => ("sessions.list", None),
        AdminCommand::Session(SessionCommand::Logout { tsih, grace }) => (
            "session.logout",
            Some(json!({ "tsih": tsih, "grace_secs": grace })),
        ),
        AdminCommand::Session(SessionCommand::Drop { tsih }) => {
            ("session.drop", Some(json!({ "tsih": tsih })))
        }
        AdminCommand::Config => ("config.show", None),
        AdminCommand::Save { path } => {
            let path =
                match path {
                    Some(p) => Some(std::path::absolute(p).with_context(|| {
                        format!("{}: cannot make the path absolute", p.display())
                    })?),
                    None => None,
                };
            ("config.save", Some(json!({ "path": path })))
        }
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

fn chap_params(c: &ChapArgs) -> Value {
    let pair = |user: &Option<String>, secret: &Option<String>| match (user, secret) {
        (Some(u), Some(s)) => json!({ "user": u, "secret": s }),
        _ => Value::Null,
    };
    json!({
        "target": c.target,
        "chap": pair(&c.user, &c.secret),
        "mutual_chap": pair(&c.mutual_user, &c.mutual_secret),
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
        AdminCommand::Target(TargetCommand::Show { .. }) => {
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
        AdminCommand::Sessions => sessions_table(result),
        AdminCommand::Target(TargetCommand::Add { name, .. }) => format!("added target {name}\n"),
        AdminCommand::Target(TargetCommand::Rm { name }) => format!("removed target {name}\n"),
        AdminCommand::Acl(AclCommand::Add { target, .. } | AclCommand::Rm { target, .. }) => {
            format!("acl of {target}: {}\n", acl(result))
        }
        AdminCommand::Chap(c) => match (&c.target, &c.user) {
            (Some(t), Some(_)) => format!("CHAP set on {t}\n"),
            (Some(t), None) => format!("CHAP cleared on {t}\n"),
            (None, Some(_)) => "CHAP set for discovery sessions\n".into(),
            (None, None) => "CHAP cleared for discovery sessions\n".into(),
        },
        AdminCommand::Lun(LunCommand::ReadOnly { .. } | LunCommand::Resize { .. }) => {
            lun_table(&json!([result]))
        }
        AdminCommand::Session(SessionCommand::Logout { tsih, grace }) => {
            format!("session {tsih} asked to log out within {grace} s\n")
        }
        AdminCommand::Session(SessionCommand::Drop { tsih }) => format!("session {tsih} dropped\n"),
        AdminCommand::Config => s(result),
        AdminCommand::Save { .. } => format!("saved {}\n", s(&result["path"])),
        AdminCommand::Call { .. } => format!("{result}\n"),
    }
}

fn sessions_table(result: &Value) -> String {
    let mut rows = Vec::new();
    for sess in result.as_array().into_iter().flatten() {
        for c in sess["connections"].as_array().into_iter().flatten() {
            rows.push(vec![
                sess["tsih"].to_string(),
                sess["initiator_name"].as_str().unwrap_or("-").to_string(),
                sess["target_name"]
                    .as_str()
                    .unwrap_or("(discovery)")
                    .to_string(),
                c["cid"].to_string(),
                c["peer"].as_str().unwrap_or("-").to_string(),
                c["transport"].as_str().unwrap_or("-").to_string(),
                c["commands"].to_string(),
            ]);
        }
    }
    table(
        &[
            "TSIH",
            "INITIATOR",
            "TARGET",
            "CID",
            "PEER",
            "TRANSPORT",
            "COMMANDS",
        ],
        rows,
    )
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
