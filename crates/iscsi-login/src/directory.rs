//! What the target side needs to know about its targets: names, ACLs,
//! authentication and portals. The runtime implements [`TargetDirectory`].

use std::net::SocketAddr;

use crate::chap::ChapCredentials;

/// The authentication a target (or discovery) requires.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AuthRequirement {
    /// No authentication (AuthMethod=None).
    #[default]
    None,
    /// CHAP: the initiator must prove `credentials`; if `mutual` is set the
    /// target can also prove itself when the initiator asks (mutual CHAP).
    Chap {
        credentials: ChapCredentials,
        mutual: Option<ChapCredentials>,
    },
}

/// A network portal of a target: address, port and portal group tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Portal {
    pub address: SocketAddr,
    pub tpgt: u16,
}

impl Portal {
    /// The `TargetAddress` value: `addr:port,tpgt` (IPv6 in brackets).
    pub fn target_address(&self) -> String {
        format!("{},{}", self.address, self.tpgt)
    }
}

/// The target's view of its configuration, consulted during login and
/// SendTargets.
pub trait TargetDirectory {
    /// Does a target with this exact name exist?
    fn target_exists(&self, target: &str) -> bool;
    /// May `initiator` log in to (and discover) `target`?
    fn initiator_allowed(&self, target: &str, initiator: &str) -> bool;
    /// Authentication required for a Normal session to `target`.
    fn target_auth(&self, target: &str) -> AuthRequirement;
    /// Authentication required for Discovery sessions.
    fn discovery_auth(&self) -> AuthRequirement {
        AuthRequirement::None
    }
    /// The target's alias, declared as `TargetAlias` if set.
    fn target_alias(&self, _target: &str) -> Option<String> {
        None
    }
    /// Every target name, in the order SendTargets=All lists them.
    fn target_names(&self) -> Vec<String>;
    /// Every portal the target is reachable through.
    fn portals(&self, target: &str) -> Vec<Portal>;
}

/// A simple in-memory directory, handy for tests and small configurations.
#[derive(Debug, Clone, Default)]
pub struct StaticDirectory {
    pub targets: Vec<StaticTarget>,
    pub discovery_auth: AuthRequirement,
}

/// One target of a [`StaticDirectory`].
#[derive(Debug, Clone, Default)]
pub struct StaticTarget {
    pub name: String,
    pub alias: Option<String>,
    /// Initiator names allowed; empty = everyone.
    pub allowed_initiators: Vec<String>,
    pub auth: AuthRequirement,
    pub portals: Vec<Portal>,
}

impl StaticDirectory {
    fn find(&self, name: &str) -> Option<&StaticTarget> {
        self.targets.iter().find(|t| t.name == name)
    }
}

impl TargetDirectory for StaticDirectory {
    fn target_exists(&self, target: &str) -> bool {
        self.find(target).is_some()
    }
    fn initiator_allowed(&self, target: &str, initiator: &str) -> bool {
        self.find(target).is_some_and(|t| {
            t.allowed_initiators.is_empty() || t.allowed_initiators.iter().any(|i| i == initiator)
        })
    }
    fn target_auth(&self, target: &str) -> AuthRequirement {
        self.find(target)
            .map(|t| t.auth.clone())
            .unwrap_or_default()
    }
    fn discovery_auth(&self) -> AuthRequirement {
        self.discovery_auth.clone()
    }
    fn target_alias(&self, target: &str) -> Option<String> {
        self.find(target).and_then(|t| t.alias.clone())
    }
    fn target_names(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.name.clone()).collect()
    }
    fn portals(&self, target: &str) -> Vec<Portal> {
        self.find(target)
            .map(|t| t.portals.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_address_formats() {
        let p = Portal {
            address: "192.0.2.1:3260".parse().unwrap(),
            tpgt: 1,
        };
        assert_eq!(p.target_address(), "192.0.2.1:3260,1");
        let p = Portal {
            address: "[2001:db8::1]:3261".parse().unwrap(),
            tpgt: 7,
        };
        assert_eq!(p.target_address(), "[2001:db8::1]:3261,7");
    }
}
