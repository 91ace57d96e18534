//! `[[subsystem]]` in the target's TOML: an NVM subsystem, who may connect, where it
//! listens, and its namespaces, each one a LUN the iSCSI configuration defines.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// The NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Most bytes of an NQN (NVM Express Base 2.0 4.5).
pub const MAX_NQN_LEN: usize = 223;
/// Highest namespace ID a subsystem here may use.
pub const MAX_NSID: u32 = 1024;

/// One NVM subsystem.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    /// The subsystem's NQN.
    pub nqn: String,
    /// Host NQNs allowed to connect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Any host may connect (`hosts` is then ignored).
    #[serde(default)]
    pub allow_any_host: bool,
    /// Addresses to serve it on, `ADDR` or `ADDR:PORT` (port 4420 when left out).
    #[serde(default = "default_listen")]
    pub listen: Vec<String>,
    /// Where the discovery controller listens; left out: each listen address's IP at port
    /// 8009; `[]`: nowhere (the discovery subsystem still answers on the listen ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_listen: Option<Vec<String>>,
    /// The controller's serial number (Identify SN); left out: derived from the NQN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The namespaces: `[[subsystem.namespace]]`.
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
}

/// A namespace: the LUN `lun` of the iSCSI target `target`, exported as `nsid`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Namespace ID (1 to 1024).
    pub nsid: u32,
    /// The iSCSI target (its IQN) whose LUN this is.
    pub target: String,
    /// The LUN number in that target.
    pub lun: u64,
}

fn default_listen() -> Vec<String> {
    vec![format!("127.0.0.1:{}", nvme_tcp::NVME_TCP_PORT)]
}

/// `ADDR` or `ADDR:PORT` (IPv6 as `[ADDR]:PORT`), `port` when left out.
pub fn parse_listen(text: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip = text.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| format!("{text:?} is not ADDR or ADDR:PORT"))
}

impl SubsystemConfig {
    /// The addresses the subsystem is served on.
    pub fn listen_addrs(&self) -> Result<Vec<SocketAddr>, String> {
        self.listen
            .iter()
            .map(|l| parse_listen(l, nvme_tcp::NVME_TCP_PORT))
            .collect()
    }

    /// The addresses of the discovery controller it asks for.
    pub fn discovery_addrs(&self) -> Result<Vec<SocketAddr>, String> {
        match &self.discovery_listen {
            Some(list) => list
                .iter()
                .map(|l| parse_listen(l, nvme_tcp::NVME_TCP_DISCOVERY_PORT))
                .collect(),
            None => Ok(self
                .listen_addrs()?
                .into_iter()
                .map(|a| SocketAddr::new(a.ip(), nvme_tcp::NVME_TCP_DISCOVERY_PORT))
                .collect()),
        }
    }
}

fn check_nqn(nqn: &str, what: &str) -> Result<(), String> {
    if !nqn.starts_with("nqn.") || nqn.len() > MAX_NQN_LEN || nqn.contains(char::is_whitespace) {
        return Err(format!(
            "{what} {nqn:?} is not an NQN (nqn.YYYY-MM.reverse.domain:name, at most {MAX_NQN_LEN} bytes)"
        ));
    }
    Ok(())
}

/// Checks a configuration's subsystems on their own (the LUNs they name are looked up when
/// the target starts): NQNs well formed and distinct, namespace IDs in range and distinct,
/// someone allowed to connect, addresses that parse.
pub fn validate(subsystems: &[SubsystemConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for s in subsystems {
        let at = format!("[[subsystem]] {}", s.nqn);
        check_nqn(&s.nqn, "[[subsystem]] nqn")?;
        if s.nqn == DISCOVERY_NQN {
            return Err(format!("{at}: that is the discovery subsystem's NQN"));
        }
        if !seen.insert(s.nqn.to_ascii_lowercase()) {
            return Err(format!("{at}: listed twice"));
        }
        for h in &s.hosts {
            check_nqn(h, &format!("{at}: host"))?;
        }
        if s.hosts.is_empty() && !s.allow_any_host {
            return Err(format!(
                "{at}: no host may connect (list hosts, or allow_any_host = true)"
            ));
        }
        if s.listen.is_empty() {
            return Err(format!("{at}: listen is empty"));
        }
        s.listen_addrs().map_err(|e| format!("{at}: listen: {e}"))?;
        s.discovery_addrs()
            .map_err(|e| format!("{at}: discovery_listen: {e}"))?;
        let mut nsids = std::collections::HashSet::new();
        for n in &s.namespaces {
            if n.nsid == 0 || n.nsid > MAX_NSID {
                return Err(format!("{at}: nsid {} is not 1 to {MAX_NSID}", n.nsid));
            }
            if !nsids.insert(n.nsid) {
                return Err(format!("{at}: nsid {} listed twice", n.nsid));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<SubsystemConfig> {
        #[derive(Deserialize)]
        struct F {
            subsystem: Vec<SubsystemConfig>,
        }
        toml::from_str::<F>(text).unwrap().subsystem
    }

    #[test]
    fn defaults_and_addresses() {
        let s = parse(
            "[[subsystem]]\nnqn = \"nqn.2026-01.org.example:a\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\ntarget = \"iqn.x\"\nlun = 0\n",
        );
        assert_eq!(
            s[0].listen_addrs().unwrap(),
            ["127.0.0.1:4420".parse().unwrap()]
        );
        assert_eq!(
            s[0].discovery_addrs().unwrap(),
            ["127.0.0.1:8009".parse().unwrap()]
        );
        assert_eq!(s[0].namespaces[0].lun, 0);
        validate(&s).unwrap();
        assert_eq!(parse_listen("::1", 4420).unwrap().port(), 4420);
        assert_eq!(parse_listen("[::1]:1", 4420).unwrap().port(), 1);
        assert!(parse_listen("nowhere", 1).is_err());
    }

    #[test]
    fn bad_configurations_are_refused() {
        let base = SubsystemConfig {
            nqn: "nqn.2026-01.org.example:a".into(),
            hosts: vec![],
            allow_any_host: true,
            listen: default_listen(),
            discovery_listen: None,
            serial: None,
            namespaces: vec![],
        };
        let ns = |nsid| NamespaceConfig {
            nsid,
            target: "iqn.x".into(),
            lun: 0,
        };
        let cases: Vec<(SubsystemConfig, &str)> = vec![
            (
                SubsystemConfig {
                    nqn: "iqn.x".into(),
                    ..base.clone()
                },
                "not an NQN",
            ),
            (
                SubsystemConfig {
                    nqn: DISCOVERY_NQN.into(),
                    ..base.clone()
                },
                "discovery",
            ),
            (
                SubsystemConfig {
                    allow_any_host: false,
                    ..base.clone()
                },
                "no host",
            ),
            (
                SubsystemConfig {
                    hosts: vec!["h".into()],
                    ..base.clone()
                },
                "not an NQN",
            ),
            (
                SubsystemConfig {
                    listen: vec![],
                    ..base.clone()
                },
                "empty",
            ),
            (
                SubsystemConfig {
                    listen: vec!["x".into()],
                    ..base.clone()
                },
                "listen",
            ),
            (
                SubsystemConfig {
                    namespaces: vec![ns(0)],
                    ..base.clone()
                },
                "nsid 0",
            ),
            (
                SubsystemConfig {
                    namespaces: vec![ns(2), ns(2)],
                    ..base.clone()
                },
                "twice",
            ),
        ];
        for (c, why) in cases {
            let e = validate(&[c]).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        assert!(validate(&[base.clone(), base])
            .unwrap_err()
            .contains("twice"));
    }
}
