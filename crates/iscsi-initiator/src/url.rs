//! iSCSI URLs in libiscsi's form, so the strings users paste into `iscsi-ls` or `qemu-img`
//! work here too:
//!
//! ```text
//! iscsi://[user[%password]@]host[:port]/target-iqn/lun     a logical unit
//! iscsi://[user[%password]@]host[:port][/]                 a portal (discovery)
//! iser://...                                                the same over iSER (RDMA)
//! ```
//!
//! IPv6 hosts go in brackets. Several portals of one logical unit (gateways exporting the
//! same LUN, see [`crate::multipath`]) are listed comma-separated in place of the host:
//! `iscsi://host1:3260,[fd00::2]:3261/iqn.x/0`, each with its own port; every other part
//! (credentials, target, LUN, query) is shared. A part made of digits only is the portal
//! group tag of the portal before it (SendTargets' `host:port,tpgt`), ignored as libiscsi
//! ignores it, so every libiscsi URL means here what it means there; libiscsi, given a list,
//! cuts it at its last comma and connects to what is before. Optional query arguments (`?a=b&c=d`): `target_user` and
//! `target_password` (mutual CHAP), `header_digest` and `data_digest` (`none`, `crc32c`,
//! `crc32c-none`, `none-crc32c`, as libiscsi spells them), `error_recovery_level`
//! (`0` or `1`) and `tcp_poll_us` (microseconds an iSCSI/TCP connection polls its socket
//! after each PDU; `0`: never).

use std::fmt;

use iscsi_login::{DigestPreference, TransportKind};

/// The well-known iSCSI port.
pub const DEFAULT_PORT: u16 = 3260;

/// A parsed `iscsi://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host name or address, without IPv6 brackets (the first portal's when the URL lists
    /// several).
    pub host: String,
    pub port: u16,
    /// The further portals of a URL that lists several (`host1,host2:3261`), in order;
    /// empty for one.
    pub more_portals: Vec<(String, u16)>,
    /// CHAP user and secret (`user%password@`).
    pub user: Option<String>,
    pub password: Option<String>,
    /// Mutual CHAP: the name and secret the target must prove.
    pub target_user: Option<String>,
    pub target_password: Option<String>,
    /// `None` for a portal URL.
    pub target: Option<String>,
    /// `None` for a portal URL; the LUN otherwise.
    pub lun: Option<u16>,
    pub header_digest: Option<DigestPreference>,
    pub data_digest: Option<DigestPreference>,
    /// `error_recovery_level=0|1|2`: the highest level offered.
    pub error_recovery_level: Option<u8>,
    /// `tcp_poll_us=N`: how long an iSCSI/TCP connection polls its socket after each PDU.
    pub tcp_poll_us: Option<u64>,
    /// The transport the scheme names: `iscsi://` is iSCSI over TCP, `iser://` iSCSI over
    /// RDMA (libiscsi's convention).
    pub transport: TransportKind,
}

/// A malformed URL or portal, with a one-line explanation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad iSCSI URL {input:?}: {why}")]
pub struct UrlError {
    pub input: String,
    pub why: String,
}

fn err(input: &str, why: impl Into<String>) -> UrlError {
    UrlError {
        input: input.to_string(),
        why: why.into(),
    }
}

const FORM: &str = "expected iscsi://[user[%password]@]host[:port]/target-iqn/lun";

/// Most portals one URL may list.
pub const MAX_PORTALS: usize = 16;

/// Parses the comma-separated portals of a URL's authority.
fn parse_portal_list(input: &str, list: &str) -> Result<Vec<(String, u16)>, UrlError> {
    let mut out: Vec<(String, u16)> = Vec::new();
    for part in list.split(',') {
        if is_tag(part) {
            // The portal group tag of the portal before it: not needed to log in.
            if out.is_empty() || part.parse::<u16>().is_err() {
                return Err(err(
                    input,
                    format!(
                        "portal group tag {part:?} does not follow a host[:port] (host:port,tpgt)"
                    ),
                ));
            }
            continue;
        }
        let p = parse_portal(part).map_err(|e| {
            if part.is_empty() {
                err(input, "empty host in the list of portals")
            } else {
                err(input, e.why)
            }
        })?;
        if out.contains(&p) {
            return Err(err(input, format!("portal {part} is listed twice")));
        }
        if out.len() == MAX_PORTALS {
            return Err(err(
                input,
                format!("more than {MAX_PORTALS} portals listed"),
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// A part of digits only: SendTargets' portal group tag, never a host here.
fn is_tag(part: &str) -> bool {
    !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit())
}

/// Parses `host`, `host:port`, `[v6]` or `[v6]:port` (port defaults to 3260).
pub fn parse_portal(s: &str) -> Result<(String, u16), UrlError> {
    let bad = |why: &str| err(s, why);
    if s.is_empty() {
        return Err(bad("empty host"));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("IPv6 address without closing ']'"))?;
        match after {
            "" => (h, None),
            p if p.starts_with(':') => (h, Some(&p[1..])),
            _ => return Err(bad("unexpected text after ']'")),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err(bad("IPv6 addresses must be in brackets, e.g. [::1]:3260")),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c == '/' || c == '@' || c == ',')
    {
        return Err(bad("host contains '/', '@', ',' or a space"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(bad("port must be a number 1..65535")),
        },
    };
    Ok((host.to_string(), port))
}

fn parse_digest(input: &str, v: &str) -> Result<DigestPreference, UrlError> {
    Ok(match v.to_ascii_lowercase().as_str() {
        "none" => DigestPreference::None,
        "crc32c" => DigestPreference::Crc32c,
        "crc32c-none" | "crc32c,none" => DigestPreference::PreferCrc32c,
        "none-crc32c" | "none,crc32c" => DigestPreference::PreferNone,
        _ => {
            return Err(err(
                input,
                format!("digest {v:?} is not none, crc32c, crc32c-none or none-crc32c"),
            ))
        }
    })
}

impl IscsiUrl {
    /// Parses a URL that names a logical unit (target and LUN required).
    pub fn parse_lun(s: &str) -> Result<IscsiUrl, UrlError> {
        let u: IscsiUrl = s.parse()?;
        if u.target.is_none() {
            return Err(err(s, format!("no target name and LUN: {FORM}")));
        }
        Ok(u)
    }

    /// Parses a URL that names a portal (a target part is allowed and ignored by callers
    /// that only need the portal).
    pub fn parse_portal_url(s: &str) -> Result<IscsiUrl, UrlError> {
        s.parse()
    }

    /// A portal URL from `HOST[:PORT]` or an `iscsi://` URL.
    pub fn from_portal_or_url(s: &str) -> Result<IscsiUrl, UrlError> {
        if s.starts_with("iscsi://") || s.starts_with("iser://") {
            return s.parse();
        }
        let (host, port) = parse_portal(s)?;
        Ok(IscsiUrl::portal(host, port))
    }

    /// A portal URL without credentials.
    pub fn portal(host: impl Into<String>, port: u16) -> IscsiUrl {
        IscsiUrl {
            host: host.into(),
            port,
            more_portals: Vec::new(),
            user: None,
            password: None,
            target_user: None,
            target_password: None,
            target: None,
            lun: None,
            header_digest: None,
            data_digest: None,
            error_recovery_level: None,
            tcp_poll_us: None,
            transport: TransportKind::Tcp,
        }
    }

    /// `host:port` with IPv6 brackets, for connecting (the first portal's).
    pub fn host_port(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// Every portal the URL lists, the first one first.
    pub fn portals(&self) -> Vec<(String, u16)> {
        std::iter::once((self.host.clone(), self.port))
            .chain(self.more_portals.iter().cloned())
            .collect()
    }

    /// Whether the URL lists more than one portal (a multipath session).
    pub fn is_multipath(&self) -> bool {
        !self.more_portals.is_empty()
    }

    /// One URL per listed portal, each with this URL's other parts.
    pub fn path_urls(&self) -> Vec<IscsiUrl> {
        self.portals()
            .into_iter()
            .map(|(host, port)| IscsiUrl {
                host,
                port,
                more_portals: Vec::new(),
                ..self.clone()
            })
            .collect()
    }

    /// This URL with another target and LUN.
    pub fn with_target(&self, target: &str, lun: u16) -> IscsiUrl {
        IscsiUrl {
            target: Some(target.to_string()),
            lun: Some(lun),
            ..self.clone()
        }
    }
}

/// `host:port`, IPv6 hosts in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl std::str::FromStr for IscsiUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<IscsiUrl, UrlError> {
        let (transport, rest) = match (s.strip_prefix("iscsi://"), s.strip_prefix("iser://")) {
            (Some(rest), _) => (TransportKind::Tcp, rest),
            (_, Some(rest)) => (TransportKind::Iser, rest),
            _ => {
                return Err(err(
                    s,
                    format!("must start with iscsi:// or iser:// ({FORM})"),
                ))
            }
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (creds, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, password) = match creds {
            None => (None, None),
            Some(c) => {
                let (u, p) = match c.split_once('%') {
                    Some((u, p)) => (u, Some(p)),
                    None => (c, None),
                };
                if u.is_empty() {
                    return Err(err(s, "empty user name before '@'"));
                }
                (Some(u.to_string()), p.map(str::to_string))
            }
        };
        let mut portals = parse_portal_list(s, hostport)?.into_iter();
        let (host, port) = portals.next().expect("split yields one part at least");
        let (target, lun) = if path.is_empty() {
            (None, None)
        } else {
            let (t, l) = path
                .split_once('/')
                .ok_or_else(|| err(s, format!("no LUN after the target name: {FORM}")))?;
            if t.is_empty() {
                return Err(err(s, "empty target name"));
            }
            if l.is_empty() {
                return Err(err(s, format!("no LUN after the target name: {FORM}")));
            }
            let lun: u16 = l
                .parse()
                .ok()
                .filter(|n| *n < 16384)
                .ok_or_else(|| err(s, format!("LUN {l:?} is not a number 0..16383")))?;
            (Some(t.to_string()), Some(lun))
        };
        let mut url = IscsiUrl {
            user,
            password,
            target,
            lun,
            transport,
            more_portals: portals.collect(),
            ..IscsiUrl::portal(host, port)
        };
        for arg in query.unwrap_or("").split('&').filter(|a| !a.is_empty()) {
            let (k, v) = arg
                .split_once('=')
                .ok_or_else(|| err(s, format!("query argument {arg:?} is not key=value")))?;
            match k {
                "target_user" => url.target_user = Some(v.to_string()),
                "target_password" => url.target_password = Some(v.to_string()),
                "header_digest" => url.header_digest = Some(parse_digest(s, v)?),
                "data_digest" => url.data_digest = Some(parse_digest(s, v)?),
                "error_recovery_level" => {
                    url.error_recovery_level = Some(match v {
                        "0" => 0,
                        "1" => 1,
                        "2" => 2,
                        _ => return Err(err(s, format!(
                            "error_recovery_level {v:?}: write 0 (reconnect on errors), 1 (digest errors recovered with SNACK) or 2 (also a lost connection logged in again and its commands reassigned)"
                        ))),
                    })
                }
                "tcp_poll_us" => {
                    url.tcp_poll_us = Some(v.parse().map_err(|_| {
                        err(s, format!("tcp_poll_us {v:?}: microseconds, a whole number (0: no polling)"))
                    })?)
                }
                _ => return Err(err(s, format!("unknown query argument {k:?}"))),
            }
        }
        if url.user.is_some() && url.password.is_none() {
            return Err(err(s, "a CHAP user needs a password: user%password@host"));
        }
        if url.target_user.is_some() != url.target_password.is_some() {
            return Err(err(
                s,
                "mutual CHAP needs both target_user and target_password",
            ));
        }
        if url.target_user.is_some() && url.user.is_none() {
            return Err(err(s, "mutual CHAP needs CHAP first: user%password@host"));
        }
        Ok(url)
    }
}

impl fmt::Display for IscsiUrl {
    /// The URL with passwords masked (safe for logs and tables).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transport {
            TransportKind::Tcp => write!(f, "iscsi://")?,
            TransportKind::Iser => write!(f, "iser://")?,
        }
        if let Some(u) = &self.user {
            write!(f, "{u}%***@")?;
        }
        let portals: Vec<String> = self
            .portals()
            .iter()
            .map(|(h, p)| join_host_port(h, *p))
            .collect();
        write!(f, "{}", portals.join(","))?;
        if let (Some(t), Some(l)) = (&self.target, self.lun) {
            write!(f, "/{t}/{l}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IscsiUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_scheme_names_the_transport() {
        let u: IscsiUrl = "iser://10.0.0.2/iqn.2026-11.org.x:disk/1".parse().unwrap();
        assert_eq!(u.transport, TransportKind::Iser);
        assert_eq!(
            u.to_string(),
            "iser://10.0.0.2:3260/iqn.2026-11.org.x:disk/1"
        );
        let t: IscsiUrl = "iscsi://10.0.0.2/iqn.2026-11.org.x:disk/1".parse().unwrap();
        assert_eq!(t.transport, TransportKind::Tcp);
        assert_eq!(
            IscsiUrl::from_portal_or_url("iser://h/").unwrap().transport,
            TransportKind::Iser
        );
        assert_eq!(
            IscsiUrl::from_portal_or_url("h:3261").unwrap().transport,
            TransportKind::Tcp
        );
    }

    #[test]
    fn full_url() {
        let u: IscsiUrl = "iscsi://alice%s3cret@10.0.0.1:3261/iqn.2026-11.org.x:disk/3"
            .parse()
            .unwrap();
        assert_eq!(u.host, "10.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password.as_deref(), Some("s3cret"));
        assert_eq!(u.target.as_deref(), Some("iqn.2026-11.org.x:disk"));
        assert_eq!(u.lun, Some(3));
        assert_eq!(
            u.to_string(),
            "iscsi://alice%***@10.0.0.1:3261/iqn.2026-11.org.x:disk/3"
        );
    }

    #[test]
    fn portal_forms() {
        let u: IscsiUrl = "iscsi://storage.example".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.target),
            ("storage.example", 3260, None)
        );
        let u: IscsiUrl = "iscsi://[::1]:3999/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 3999));
        assert_eq!(u.host_port(), "[::1]:3999");
        let u = IscsiUrl::from_portal_or_url("127.0.0.1:4000").unwrap();
        assert_eq!(u.host_port(), "127.0.0.1:4000");
        assert_eq!(parse_portal("host").unwrap(), ("host".into(), 3260));
    }

    #[test]
    fn query_arguments() {
        let u: IscsiUrl =
            "iscsi://a%b@h/iqn.x:y/0?target_user=t&target_password=tp&header_digest=crc32c"
                .parse()
                .unwrap();
        assert_eq!(u.target_user.as_deref(), Some("t"));
        assert_eq!(u.target_password.as_deref(), Some("tp"));
        assert_eq!(u.header_digest, Some(DigestPreference::Crc32c));
        assert_eq!(u.data_digest, None);
        assert_eq!(u.error_recovery_level, None);
        let u: IscsiUrl = "iscsi://h/iqn.x:y/0?error_recovery_level=1"
            .parse()
            .unwrap();
        assert_eq!(u.error_recovery_level, Some(1));
        let u: IscsiUrl = "iscsi://h/iqn.x:y/0?tcp_poll_us=0".parse().unwrap();
        assert_eq!(u.tcp_poll_us, Some(0));
        assert!("iscsi://h/iqn.x:y/0?tcp_poll_us=soon"
            .parse::<IscsiUrl>()
            .is_err());
        let u: IscsiUrl = "iscsi://h/iqn.x:y/0?error_recovery_level=2"
            .parse()
            .unwrap();
        assert_eq!(u.error_recovery_level, Some(2));
        let e = "iscsi://h/iqn.x:y/0?error_recovery_level=3"
            .parse::<IscsiUrl>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("write 0") && e.contains("or 2"), "{e}");
    }

    #[test]
    fn errors_are_one_line_and_say_why() {
        for (bad, why) in [
            ("http://h/t/0", "must start with iscsi://"),
            ("iscsi://h/iqn.x:y", "no LUN"),
            ("iscsi://h/iqn.x:y/", "no LUN"),
            ("iscsi://h/iqn.x:y/abc", "not a number"),
            ("iscsi://h/iqn.x:y/99999", "not a number"),
            ("iscsi://h:0/iqn.x:y/0", "port"),
            ("iscsi://h:99999/", "port"),
            ("iscsi:///iqn.x:y/0", "empty host"),
            ("iscsi://::1/t/0", "brackets"),
            ("iscsi://u@h/t/0", "needs a password"),
            ("iscsi://h/t/0?x=1", "unknown query"),
            ("iscsi://h//0", "empty target"),
        ] {
            let e = bad.parse::<IscsiUrl>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
        assert!(IscsiUrl::parse_lun("iscsi://h/").is_err());
    }

    #[test]
    fn several_portals() {
        let u = IscsiUrl::parse_lun(
            "iscsi://a%b@h1,h2:3261,[fd00::2]:3262/iqn.x:y/4?header_digest=crc32c",
        )
        .unwrap();
        assert!(u.is_multipath());
        assert_eq!(
            u.portals(),
            vec![
                ("h1".to_string(), 3260),
                ("h2".to_string(), 3261),
                ("fd00::2".to_string(), 3262)
            ]
        );
        assert_eq!(u.host_port(), "h1:3260");
        let paths = u.path_urls();
        assert_eq!(paths.len(), 3);
        for p in &paths {
            assert!(!p.is_multipath());
            assert_eq!(p.target.as_deref(), Some("iqn.x:y"));
            assert_eq!(p.lun, Some(4));
            assert_eq!(p.user.as_deref(), Some("a"));
            assert_eq!(p.header_digest, Some(DigestPreference::Crc32c));
        }
        assert_eq!(paths[2].host_port(), "[fd00::2]:3262");
        assert_eq!(
            u.to_string(),
            "iscsi://a%***@h1:3260,h2:3261,[fd00::2]:3262/iqn.x:y/4"
        );
        let one = IscsiUrl::parse_lun("iscsi://h/iqn.x:y/0").unwrap();
        assert!(!one.is_multipath());
        assert_eq!(one.path_urls(), vec![one.clone()]);
    }

    #[test]
    fn bad_portal_lists() {
        let many = (0..=MAX_PORTALS)
            .map(|i| format!("h{i}"))
            .collect::<Vec<_>>()
            .join(",");
        for (bad, why) in [
            ("iscsi://h1,/t/0", "empty host"),
            ("iscsi://,h2/t/0", "empty host"),
            ("iscsi://h1,,h2/t/0", "empty host"),
            ("iscsi://1,h2/t/0", "portal group tag"),
            ("iscsi://h1,99999/t/0", "portal group tag"),
            ("iscsi://h1:3260,h1/t/0", "listed twice"),
            ("iscsi://h1,h2:0/t/0", "port"),
            ("iscsi://h1,h2:x/t/0", "port"),
            ("iscsi://h1,::1/t/0", "brackets"),
            ("iscsi://h1,[::1/t/0", "closing"),
            ("iscsi://h1,h2 x/t/0", "space"),
            (&format!("iscsi://{many}/t/0"), "more than"),
        ] {
            let e = bad.parse::<IscsiUrl>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
        assert!(parse_portal("h1,h2").is_err());
        // libiscsi's host:port,tpgt: the tag is ignored, as there.
        let u = IscsiUrl::parse_lun("iscsi://10.0.0.1:3260,1/t/0").unwrap();
        assert!(!u.is_multipath());
        assert_eq!(u.host_port(), "10.0.0.1:3260");
        let u = IscsiUrl::parse_lun("iscsi://h1:3260,1,h2:3261,2/t/0").unwrap();
        assert_eq!(
            u.portals(),
            vec![("h1".to_string(), 3260), ("h2".to_string(), 3261)]
        );
        assert!(IscsiUrl::from_portal_or_url("h1,h2:3261").is_err());
    }

    proptest! {
        #[test]
        fn several_portals_round_trip(hosts in proptest::collection::btree_set("[a-z][a-z0-9]{0,8}", 1..5),
                                      port in 1u16..) {
            let list: Vec<String> = hosts.iter().map(|h| format!("{h}:{port}")).collect();
            let s = format!("iscsi://{}/iqn.x:y/0", list.join(","));
            let u: IscsiUrl = s.parse().unwrap();
            prop_assert_eq!(u.portals().len(), hosts.len());
            prop_assert_eq!(u.to_string(), s);
        }

        #[test]
        fn never_panics(s in ".{0,80}") {
            let _ = s.parse::<IscsiUrl>();
            let _ = format!("iscsi://{s}").parse::<IscsiUrl>();
        }

        #[test]
        fn round_trip(host in "[a-z][a-z0-9.-]{0,20}", port in 1u16.., lun in 0u16..16384,
                      target in "iqn\\.[0-9]{4}-[0-9]{2}\\.[a-z.]{1,10}:[a-z0-9]{1,10}") {
            let s = format!("iscsi://{host}:{port}/{target}/{lun}");
            let u: IscsiUrl = s.parse().unwrap();
            prop_assert_eq!(u.to_string(), s);
        }
    }
}
