//! The NVM subsystems served and the namespaces in them: each namespace is a LUN the SCSI
//! layer built ([`scsi::LunExport`]), so iSCSI and NVMe/TCP serve the same storage, and its
//! NGUID and EUI-64 come from the LUN's NAA designator, the identity iSCSI reports.

use scsi::LunExport;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One NVM subsystem.
#[derive(Debug, Clone)]
pub struct Subsystem {
    /// Its NQN.
    pub nqn: String,
    /// Host NQNs allowed to connect.
    pub hosts: Vec<String>,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Serial number of its controllers.
    pub serial: String,
    /// Namespaces by ID.
    pub namespaces: BTreeMap<u32, LunExport>,
    /// Where it is served (the discovery log page lists these).
    pub ports: Vec<SocketAddr>,
}

impl Subsystem {
    /// A subsystem with no ports yet; the serial is derived from the NQN when `None`.
    pub fn new(
        nqn: &str,
        hosts: Vec<String>,
        allow_any_host: bool,
        serial: Option<String>,
        namespaces: BTreeMap<u32, LunExport>,
    ) -> Subsystem {
        Subsystem {
            serial: serial.unwrap_or_else(|| format!("{:016x}", fnv(nqn.as_bytes()))),
            nqn: nqn.to_string(),
            hosts,
            allow_any_host,
            namespaces,
            ports: Vec::new(),
        }
    }

    /// Whether `hostnqn` may connect.
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }
}

fn fnv(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in b {
        h ^= u64::from(c);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The namespace's EUI-64: the first 8 bytes of the LUN's NAA designator (all of a type 2,
/// 3 or 5 NAA), so one LUN has one identity over both protocols.
pub fn eui64(naa: &[u8]) -> [u8; 8] {
    let mut e = [0; 8];
    let n = naa.len().min(8);
    e[..n].copy_from_slice(&naa[..n]);
    e
}

/// The namespace's NGUID: a 16-byte NAA (type 6) as it is; an 8-byte one followed by its
/// bytes' complement, so the NGUID is unique where the NAA is.
pub fn nguid(naa: &[u8]) -> [u8; 16] {
    let mut g = [0; 16];
    if naa.len() >= 16 {
        g.copy_from_slice(&naa[..16]);
    } else {
        let e = eui64(naa);
        g[..8].copy_from_slice(&e);
        for i in 0..8 {
            g[8 + i] = !e[i];
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_follow_the_naa() {
        let naa8 = [0x30, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(eui64(&naa8), naa8);
        let g = nguid(&naa8);
        assert_eq!(&g[..8], &naa8);
        assert_eq!(g[8], !0x30);
        let naa16: Vec<u8> = (0x60..0x70).collect();
        assert_eq!(nguid(&naa16).to_vec(), naa16);
        assert_eq!(eui64(&naa16).to_vec(), naa16[..8].to_vec());
        let s = Subsystem::new(
            "nqn.a:b",
            vec!["nqn.h:1".into()],
            false,
            None,
            BTreeMap::new(),
        );
        assert!(s.allows("nqn.h:1") && !s.allows("nqn.h:2"));
        assert_eq!(s.serial.len(), 16);
    }
}
