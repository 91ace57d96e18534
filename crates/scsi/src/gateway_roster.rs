//! The gateways of a shared LUN check each other's target port ids at run time, through the
//! storage they share: each gateway's `[gateway]` section can only check its own peer list,
//! and two gateways that each believe they hold relative target port 1 would give hosts two
//! paths with one identity (SCSI-3 reservations and ALUA keyed to the wrong port).
//!
//! A *roster* ([`SharedBlob`]: a file beside the owner lock) lists every gateway that served
//! the LUN, one line each: `gateway NAME PORT-GROUP RELATIVE-PORT GROUP`. [`RosteredOwner`]
//! wraps the LUN's [`ExclusiveOwner`]: before its first ownership call goes through, the
//! gateway enters its line (replacing an earlier line of its own name, so a gateway whose ids
//! changed re-registers). When another gateway's line already claims this gateway's port group
//! or relative port, nothing is written: the gateway logs one error line naming both gateways
//! and the fix, and every ownership call fails with that message, which the ALUA layer reports
//! as *unavailable* (medium commands refused with 04h/0Ch). The later gateway thus never
//! takes the lock nor touches the medium; the earlier one serves on. The roster is read again
//! at each of the failing gateway's checks, so a roster emptied of a gateway that left (the
//! fix the message gives when the clash is with a stale line) is seen without a restart.

use std::io;
use std::sync::{Arc, Mutex};

use storage::{ExclusiveOwner, SharedBlob};

use crate::config::GatewayConfig;

/// Compare-and-write races lost before a registration counts as failed (for this check).
const CAS_TRIES: usize = 8;

/// One gateway's line in the roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub name: String,
    pub port_group: u16,
    pub relative_port: u16,
    pub group: String,
}

impl Member {
    pub fn of(gateway: &GatewayConfig) -> Member {
        Member {
            name: gateway.name.clone(),
            port_group: gateway.port_group,
            relative_port: gateway.relative_port,
            group: gateway.group.clone(),
        }
    }

    fn line(&self) -> String {
        format!(
            "gateway {} {} {} {}",
            self.name, self.port_group, self.relative_port, self.group
        )
    }

    fn parse(line: &str) -> Option<Member> {
        let mut words = line.splitn(5, ' ');
        if words.next()? != "gateway" {
            return None;
        }
        Some(Member {
            name: words.next()?.to_string(),
            port_group: words.next()?.parse().ok()?,
            relative_port: words.next()?.parse().ok()?,
            group: words.next().unwrap_or("").to_string(),
        })
    }

    /// What `other` (another gateway) claims that is this gateway's, if anything.
    fn clash(&self, other: &Member) -> Option<String> {
        if other.name == self.name {
            return None;
        }
        if other.relative_port == self.relative_port {
            Some(format!("relative target port {}", self.relative_port))
        } else if other.port_group == self.port_group {
            Some(format!("target port group {}", self.port_group))
        } else {
            None
        }
    }
}

/// The roster's members; lines that are not members are kept as they are.
fn parse_roster(data: &[u8]) -> Vec<Member> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(Member::parse)
        .collect()
}

/// The roster with `me` entered: every line of another name kept, `me`'s line last.
fn with_member(data: &[u8], me: &Member) -> Vec<u8> {
    let mut out = String::new();
    for line in String::from_utf8_lossy(data).lines() {
        if Member::parse(line).is_some_and(|m| m.name == me.name) || line.trim().is_empty() {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&me.line());
    out.push('\n');
    out.into_bytes()
}

/// The error line: both gateways, what they share, and the fix.
fn conflict_message(me: &Member, other: &Member, what: &str, roster: &str) -> String {
    format!(
        "gateway {} (group {:?}) and gateway {} (group {:?}) both claim {what} for this LUN: \
         this gateway does not serve it (unavailable); fix: give each gateway its own \
         port_group and relative_port in [gateway] and restart this one, or, if {} no longer \
         serves the LUN, stop every gateway of the LUN, delete {roster} and start them again",
        me.name, me.group, other.name, other.group, other.name
    )
}

#[derive(Debug, Default)]
struct State {
    registered: bool,
    /// The conflict last logged, so that each is logged once.
    logged: Option<String>,
}

/// A LUN's [`ExclusiveOwner`] whose calls go through only once this gateway is entered in
/// the LUN's roster without a clash (see the module doc).
#[derive(Debug)]
pub(crate) struct RosteredOwner {
    inner: Arc<dyn ExclusiveOwner>,
    roster: Arc<dyn SharedBlob>,
    /// Where the roster lives, for the fix in the error line.
    roster_name: String,
    me: Member,
    lun: u64,
    state: Mutex<State>,
}

impl RosteredOwner {
    pub fn new(
        inner: Arc<dyn ExclusiveOwner>,
        roster: Arc<dyn SharedBlob>,
        roster_name: String,
        me: Member,
        lun: u64,
    ) -> RosteredOwner {
        RosteredOwner {
            inner,
            roster,
            roster_name,
            me,
            lun,
            state: Mutex::new(State::default()),
        }
    }

    /// Enters this gateway in the roster unless done already; the clash's message if
    /// another gateway claims its ids.
    fn check(&self) -> io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.registered {
            return Ok(());
        }
        for _ in 0..CAS_TRIES {
            let (version, data) = self.roster.read()?;
            let members = parse_roster(&data);
            let clash = members
                .iter()
                .find_map(|m| self.me.clash(m).map(|what| (m, what)));
            if let Some((other, what)) = clash {
                let msg = conflict_message(&self.me, other, &what, &self.roster_name);
                if state.logged.as_deref() != Some(&msg) {
                    tracing::error!(lun = self.lun, "{msg}");
                    state.logged = Some(msg.clone());
                }
                return Err(io::Error::other(msg));
            }
            if members.contains(&self.me) {
                state.registered = true;
                state.logged = None;
                return Ok(());
            }
            let next = with_member(&data, &self.me);
            if self.roster.compare_and_write(version, &next)?.is_some() {
                state.registered = true;
                state.logged = None;
                return Ok(());
            }
        }
        Err(io::Error::other(format!(
            "{}: the gateway roster kept changing under {CAS_TRIES} tries",
            self.roster_name
        )))
    }
}

impl ExclusiveOwner for RosteredOwner {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn acquire(&self, force: bool) -> io::Result<bool> {
        self.check()?;
        self.inner.acquire(force)
    }

    /// Releases whatever this gateway holds, registered or not.
    fn release(&self) -> io::Result<()> {
        self.inner.release()
    }

    fn is_owner(&self) -> io::Result<bool> {
        self.check()?;
        self.inner.is_owner()
    }

    fn owner(&self) -> io::Result<Option<String>> {
        self.check()?;
        self.inner.owner()
    }
}

/// `owner` checked against the roster in the file beside the lock file `lock`
/// (`LOCK.gateways`).
pub(crate) fn beside_lock_file(
    owner: Arc<dyn ExclusiveOwner>,
    lock: &std::path::Path,
    gateway: &GatewayConfig,
    lun: u64,
) -> Arc<dyn ExclusiveOwner> {
    let mut path = lock.as_os_str().to_owned();
    path.push(".gateways");
    let path = std::path::PathBuf::from(path);
    let name = path.display().to_string();
    let roster = Arc::new(storage::shared_blob_file::FileBlob::new(path));
    Arc::new(RosteredOwner::new(
        owner,
        roster,
        name,
        Member::of(gateway),
        lun,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::owner_file::FileOwner;
    use storage::shared_blob_file::FileBlob;

    fn member(name: &str, port_group: u16, relative_port: u16) -> Member {
        Member {
            name: name.into(),
            port_group,
            relative_port,
            group: "g 1".into(),
        }
    }

    fn gateway(dir: &std::path::Path, me: Member) -> RosteredOwner {
        let lock = dir.join("lun0.owner");
        let inner = Arc::new(FileOwner::open(&lock, &me.name).unwrap());
        let roster = dir.join("lun0.owner.gateways");
        let name = roster.display().to_string();
        RosteredOwner::new(inner, Arc::new(FileBlob::new(roster)), name, me, 0)
    }

    #[test]
    fn lines_round_trip_and_foreign_lines_are_kept() {
        let m = member("gw-a", 1, 2);
        assert_eq!(Member::parse(&m.line()), Some(m.clone()));
        let data = b"# a note\ngateway gw-a 9 9 old\ngateway gw-b 2 3 g 1\n";
        let next = String::from_utf8(with_member(data, &m)).unwrap();
        assert_eq!(
            next,
            "# a note\ngateway gw-b 2 3 g 1\ngateway gw-a 1 2 g 1\n"
        );
        assert_eq!(parse_roster(next.as_bytes()).len(), 2);
    }

    #[test]
    fn the_later_gateway_claiming_a_port_is_refused_and_takes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let a = gateway(dir.path(), member("gw-a", 1, 1));
        assert!(a.acquire(false).unwrap());
        // Same relative port, another group id: refused with both names and the fix.
        let c = gateway(dir.path(), member("gw-c", 3, 1));
        let e = c.acquire(true).unwrap_err().to_string();
        assert!(e.contains("gw-c") && e.contains("gw-a"), "{e}");
        assert!(
            e.contains("relative target port 1") && e.contains("fix:"),
            "{e}"
        );
        assert!(c.owner().is_err() && c.is_owner().is_err());
        // It asked for nothing: A still owns the LUN, and C's line is not in the roster.
        assert!(a.is_owner().unwrap());
        let (_, roster) = FileBlob::new(dir.path().join("lun0.owner.gateways"))
            .read()
            .unwrap();
        let roster = String::from_utf8(roster).unwrap();
        assert!(
            roster.contains("gw-a") && !roster.contains("gw-c"),
            "{roster}"
        );
        // Same port group, another relative port: refused too.
        let d = gateway(dir.path(), member("gw-d", 1, 4));
        let e = d.acquire(false).unwrap_err().to_string();
        assert!(e.contains("target port group 1"), "{e}");
        // A gateway with ids of its own joins, and A restarted with the same ids is welcome.
        let b = gateway(dir.path(), member("gw-b", 2, 2));
        assert!(!b.acquire(false).unwrap());
        assert_eq!(b.owner().unwrap().as_deref(), Some("gw-a"));
        drop(a);
        let a2 = gateway(dir.path(), member("gw-a", 1, 1));
        assert!(a2.acquire(false).unwrap());
    }

    #[test]
    fn a_corrected_roster_is_seen_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let a = gateway(dir.path(), member("gw-a", 1, 1));
        assert!(a.acquire(false).unwrap());
        let c = gateway(dir.path(), member("gw-c", 3, 1));
        assert!(c.owner().is_err());
        // gw-a leaves the group and the roster is emptied (as deleting it does).
        a.release().unwrap();
        drop(a);
        let blob = FileBlob::new(dir.path().join("lun0.owner.gateways"));
        let (v, _) = blob.read().unwrap();
        assert!(blob.compare_and_write(v, b"").unwrap().is_some());
        assert!(c.acquire(false).unwrap());
    }
}
