//! Throttling of failed authentication: after [`ThrottleLimits::per_initiator`] failed logins
//! of one initiator name within [`ThrottleLimits::window`], or [`ThrottleLimits::per_address`]
//! from one source address, logins of that name (or from that address) that must
//! authenticate are refused for [`ThrottleLimits::lockout`], so that a peer cannot guess a CHAP
//! secret at the speed of its connections. Addresses count too because initiator names are
//! only claims: a guesser can change its name at every attempt. IPv6 addresses count by their
//! /64 prefix, which one host usually holds whole.
//!
//! Memory is bounded: each table remembers at most [`ThrottleLimits::capacity`] names (or
//! addresses), and a name is kept to its first [`MAX_NAME_KEY`] bytes. When a table is full,
//! entries whose window has passed unlocked are forgotten first, then the unlocked one idle
//! longest (a locked one only when all are locked).
//!
//! Sans-IO: no clock inside; the caller passes the time of each event.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Longest prefix of an initiator name the throttle keys on (iSCSI names are at most 223
/// bytes, RFC 7143 §4.2.7.1): a longer claimed name costs no more memory.
pub const MAX_NAME_KEY: usize = 223;

/// How many failures lock out a name or an address, within what window, for how long, and
/// how many of each the throttle remembers. The target takes the first four from its
/// configuration (`auth_failures_per_initiator`, ...; the defaults are these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleLimits {
    /// Failed logins of one initiator name within `window` that lock the name out.
    pub per_initiator: u32,
    /// Failed logins from one address within `window` that lock the address out; higher than
    /// `per_initiator`, since many initiators may share an address (NAT, one host).
    pub per_address: u32,
    pub window: Duration,
    /// How long a lockout lasts after the failure that started it.
    pub lockout: Duration,
    /// Most names, and most addresses, remembered.
    pub capacity: usize,
}

impl Default for ThrottleLimits {
    fn default() -> Self {
        ThrottleLimits {
            per_initiator: 5,
            per_address: 20,
            window: Duration::from_secs(60),
            lockout: Duration::from_secs(60),
            capacity: 4096,
        }
    }
}

/// The failures of one name or address.
#[derive(Debug, Clone, Copy)]
struct Failures {
    window_start: Instant,
    count: u32,
    locked_until: Option<Instant>,
    last: Instant,
}

impl Failures {
    fn locked(&self, now: Instant) -> bool {
        self.locked_until.is_some_and(|until| now < until)
    }
}

/// Failures by one kind of key (names or addresses), at most `capacity` keys.
struct FailureTable<K> {
    entries: HashMap<K, Failures>,
}

impl<K: Eq + Hash + Clone> FailureTable<K> {
    fn new() -> Self {
        FailureTable {
            entries: HashMap::new(),
        }
    }

    fn locked(&self, key: &K, now: Instant) -> bool {
        self.entries.get(key).is_some_and(|f| f.locked(now))
    }

    fn record(&mut self, key: K, limit: u32, limits: &ThrottleLimits, now: Instant) {
        let window = limits.window;
        if !self.entries.contains_key(&key) && self.entries.len() >= limits.capacity.max(1) {
            self.entries.retain(|_, f| {
                f.locked(now) || now.saturating_duration_since(f.window_start) < window
            });
            if self.entries.len() >= limits.capacity.max(1) {
                // Unlocked entries go before locked ones, so that a flood of new keys does
                // not lift a lockout.
                let idle_longest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, f)| (f.locked(now), f.last))
                    .map(|(k, _)| k.clone());
                if let Some(k) = idle_longest {
                    self.entries.remove(&k);
                }
            }
        }
        let f = self.entries.entry(key).or_insert(Failures {
            window_start: now,
            count: 0,
            locked_until: None,
            last: now,
        });
        f.last = now;
        let lock_until = now.checked_add(limits.lockout).unwrap_or(now);
        if f.locked(now) {
            // A login that was under way when the lockout began failed too: the lockout
            // runs from this failure.
            f.locked_until = Some(lock_until);
            return;
        }
        if now.saturating_duration_since(f.window_start) >= window {
            f.window_start = now;
            f.count = 0;
        }
        f.count = f.count.saturating_add(1);
        if f.count >= limit.max(1) {
            f.locked_until = Some(lock_until);
            f.window_start = now;
            f.count = 0;
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Failed authentications by initiator name and by source address (see the module doc).
pub struct AuthThrottle {
    limits: ThrottleLimits,
    by_initiator: FailureTable<String>,
    by_address: FailureTable<IpAddr>,
}

impl AuthThrottle {
    pub fn new(limits: ThrottleLimits) -> Self {
        AuthThrottle {
            limits,
            by_initiator: FailureTable::new(),
            by_address: FailureTable::new(),
        }
    }

    pub fn limits(&self) -> &ThrottleLimits {
        &self.limits
    }

    /// Whether a login of `initiator` from `address` that must authenticate is refused at
    /// `now`: its name or its address is locked out.
    pub fn refuses(&self, initiator: &str, address: IpAddr, now: Instant) -> bool {
        self.by_initiator.locked(&name_key(initiator), now)
            || self.by_address.locked(&address_key(address), now)
    }

    /// Counts a failed authentication of `initiator` from `address` at `now`.
    pub fn failed(&mut self, initiator: &str, address: IpAddr, now: Instant) {
        let limits = self.limits;
        self.by_initiator
            .record(name_key(initiator), limits.per_initiator, &limits, now);
        self.by_address
            .record(address_key(address), limits.per_address, &limits, now);
    }

    /// Names and addresses remembered (for tests of the bound).
    pub fn remembered(&self) -> (usize, usize) {
        (self.by_initiator.len(), self.by_address.len())
    }
}

/// iSCSI names compare without regard to ASCII case; only their first [`MAX_NAME_KEY`] bytes
/// count.
fn name_key(name: &str) -> String {
    let mut end = name.len().min(MAX_NAME_KEY);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_ascii_lowercase()
}

/// IPv4 (also when mapped into IPv6) by address, IPv6 by its /64 prefix.
fn address_key(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "iqn.2026-11.org.example:host";
    const OTHER: &str = "iqn.2026-11.org.example:other";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn five_failures_within_the_window_lock_the_name_out_for_the_lockout() {
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        let t0 = Instant::now();
        let addr = ip("192.0.2.1");
        for i in 0..4 {
            t.failed(NAME, addr, secs(t0, i));
            assert!(
                !t.refuses(NAME, addr, secs(t0, i)),
                "after {} failures",
                i + 1
            );
        }
        t.failed(NAME, addr, secs(t0, 10));
        assert!(t.refuses(NAME, addr, secs(t0, 10)));
        assert!(t.refuses(&NAME.to_ascii_uppercase(), addr, secs(t0, 10)));
        assert!(
            t.refuses(NAME, ip("198.51.100.7"), secs(t0, 69)),
            "any address"
        );
        // Another name from the same address is not locked out (5 < 20 failures).
        assert!(!t.refuses(OTHER, addr, secs(t0, 10)));
        // The lockout ends 60 s after the failure that started it.
        assert!(!t.refuses(NAME, addr, secs(t0, 70)));
    }

    #[test]
    fn failures_spread_beyond_the_window_do_not_lock_out() {
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        let t0 = Instant::now();
        let addr = ip("192.0.2.1");
        // One failure every 20 s: windows start at 0, 60, 120 and 180 s, 3 failures each.
        for i in 0..10 {
            t.failed(NAME, addr, secs(t0, i * 20));
            assert!(!t.refuses(NAME, addr, secs(t0, i * 20)), "at {} s", i * 20);
        }
    }

    #[test]
    fn a_failure_during_the_lockout_extends_it() {
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        let t0 = Instant::now();
        let addr = ip("192.0.2.1");
        for i in 0..5 {
            t.failed(NAME, addr, secs(t0, i));
        }
        t.failed(NAME, addr, secs(t0, 50));
        assert!(t.refuses(NAME, addr, secs(t0, 100)));
        assert!(!t.refuses(NAME, addr, secs(t0, 110)));
    }

    #[test]
    fn an_address_is_locked_out_past_a_higher_count_whatever_the_names() {
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        let t0 = Instant::now();
        let addr = ip("192.0.2.1");
        for i in 0..19 {
            t.failed(&format!("{NAME}{i}"), addr, t0);
        }
        assert!(!t.refuses(OTHER, addr, t0));
        t.failed("iqn.2026-11.org.example:twentieth", addr, t0);
        assert!(t.refuses(OTHER, addr, t0), "a fresh name from that address");
        assert!(!t.refuses(OTHER, ip("192.0.2.2"), t0), "another address");
    }

    #[test]
    fn ipv6_addresses_count_by_their_64_prefix() {
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        let t0 = Instant::now();
        for i in 0..20u32 {
            let a = format!("2001:db8:1:2::{:x}", i + 1);
            t.failed(&format!("{NAME}{i}"), ip(&a), t0);
        }
        assert!(t.refuses(OTHER, ip("2001:db8:1:2:ffff::1"), t0));
        assert!(!t.refuses(OTHER, ip("2001:db8:1:3::1"), t0));
        // An IPv4-mapped address counts as the IPv4 address.
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        for i in 0..20u32 {
            t.failed(&format!("{NAME}{i}"), ip("::ffff:192.0.2.9"), t0);
        }
        assert!(t.refuses(OTHER, ip("192.0.2.9"), t0));
    }

    #[test]
    fn memory_is_bounded_and_locked_entries_outlive_idle_ones() {
        let limits = ThrottleLimits {
            capacity: 64,
            per_address: u32::MAX,
            ..ThrottleLimits::default()
        };
        let mut t = AuthThrottle::new(limits);
        let t0 = Instant::now();
        let addr = ip("192.0.2.1");
        for i in 0..5 {
            t.failed(NAME, addr, secs(t0, i));
        }
        // Many one-off names, each newer than the last: the table stays at its capacity, and
        // the locked name, though idle longest, is kept.
        for i in 0..1000u64 {
            t.failed(
                &format!("{OTHER}{i}"),
                addr,
                secs(t0, 5) + Duration::from_millis(i),
            );
            assert!(t.remembered().0 <= 64);
        }
        assert_eq!(t.remembered(), (64, 1));
        assert!(t.refuses(NAME, addr, secs(t0, 6)));
        // Names idle past the window are forgotten before any entry still counting.
        let mut t = AuthThrottle::new(limits);
        for i in 0..64u64 {
            t.failed(&format!("{OTHER}{i}"), addr, t0);
        }
        for i in 0..5 {
            t.failed(NAME, addr, secs(t0, 100 + i));
        }
        assert!(t.refuses(NAME, addr, secs(t0, 105)));
        assert_eq!(t.remembered().0, 1, "the 64 stale names were dropped");
    }

    #[test]
    fn a_long_name_costs_no_more_than_its_prefix() {
        let mut t = AuthThrottle::new(ThrottleLimits::default());
        let t0 = Instant::now();
        let long = "é".repeat(40_000);
        for _ in 0..5 {
            t.failed(&long, ip("192.0.2.1"), t0);
        }
        assert!(t.refuses(&long, ip("192.0.2.1"), t0));
        assert!(t
            .by_initiator
            .entries
            .keys()
            .all(|k| k.len() <= MAX_NAME_KEY));
    }
}
