//! Registrations of write data the caller holds (zero-copy writes): a command's Write STag
//! names the caller's own bytes ([`rdma::Provider::reg_bytes`]), so the target's RDMA Reads
//! take them from where they lie, and bytes that recur (a buffer written again, the same data
//! to many blocks) take a registration made earlier: a registration cache.
//!
//! Each command in flight has a registration of its own, with its own STag: a target ends a
//! command by invalidating that command's STag, which must not cut off another command's
//! reads of the same bytes. A registration that comes back is invalidated at once (the peer
//! can never use a key it was given for an earlier command) and gets a fresh STag when taken
//! again. An idle registration holds its bytes, so a cached address always names the same,
//! unchanged bytes (`Bytes` are immutable, and memory held cannot be freed and reused). The
//! bytes of the buffers the cache keeps are bounded; the least recently used buffer goes
//! first, with all its registrations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datamover::RegistrationStats;
use rdma::{Access, MemoryRegion, Provider};

/// Where a buffer lies and how long it is: what a cached registration is found by.
type Key = (usize, usize);

/// The registration cache of one protection domain.
pub struct WriteRegistrations<P: Provider> {
    dev: Arc<P>,
    pd: P::Pd,
    /// Bytes the cache may keep registered while no command uses them.
    max_idle_bytes: usize,
    idle: Mutex<Idle<P>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

struct Idle<P: Provider> {
    /// Idle registrations of each buffer, and the tick the last of them came back at.
    by_key: HashMap<Key, (u64, Vec<Registered<P>>)>,
    /// Bytes of the buffers with idle registrations, each counted once however many
    /// registrations it has (they name the same memory).
    bytes: usize,
    tick: u64,
}

/// A registration and the bytes it names (held so they stay put and unchanged).
struct Registered<P: Provider> {
    mr: P::Mr,
    _data: Bytes,
}

/// A registration taken for one command; it goes back to the cache when dropped.
pub struct WriteReg<P: Provider> {
    reg: Option<Registered<P>>,
    key: Key,
    cache: Arc<WriteRegistrations<P>>,
}

impl<P: Provider> WriteRegistrations<P> {
    pub fn new(dev: Arc<P>, pd: P::Pd, max_idle_bytes: usize) -> Arc<Self> {
        Arc::new(WriteRegistrations {
            dev,
            pd,
            max_idle_bytes,
            idle: Mutex::new(Idle {
                by_key: HashMap::new(),
                bytes: 0,
                tick: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// A registration of `data` for the peer's RDMA Reads, under an STag no one else holds.
    pub fn take(self: &Arc<Self>, data: &Bytes) -> rdma::Result<WriteReg<P>> {
        let key = (data.as_ptr() as usize, data.len());
        let cached = {
            let mut idle = self.idle.lock().expect("registration cache");
            let (found, emptied) = match idle.by_key.get_mut(&key) {
                Some((_, regs)) => (regs.pop(), regs.is_empty()),
                None => (None, false),
            };
            if emptied {
                idle.by_key.remove(&key);
                idle.bytes -= key.1;
            }
            found
        };
        let reg = match cached {
            Some(reg) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                reg.mr.revalidate();
                reg
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                Registered {
                    mr: self
                        .dev
                        .reg_bytes(&self.pd, data.clone(), Access::REMOTE_READ)?,
                    _data: data.clone(),
                }
            }
        };
        Ok(WriteReg {
            reg: Some(reg),
            key,
            cache: self.clone(),
        })
    }

    pub fn stats(&self) -> RegistrationStats {
        RegistrationStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Bytes registered and idle now.
    pub fn idle_bytes(&self) -> usize {
        self.idle.lock().expect("registration cache").bytes
    }

    fn give_back(&self, key: Key, reg: Registered<P>) {
        reg.mr.invalidate();
        let mut evicted = Vec::new();
        {
            let mut idle = self.idle.lock().expect("registration cache");
            idle.tick += 1;
            let tick = idle.tick;
            let (last, regs) = idle.by_key.entry(key).or_default();
            *last = tick;
            regs.push(reg);
            if regs.len() == 1 {
                idle.bytes += key.1;
            }
            while idle.bytes > self.max_idle_bytes {
                let Some(oldest) = idle.oldest() else { break };
                let (_, regs) = idle.by_key.remove(&oldest).expect("oldest key");
                evicted.extend(regs);
                idle.bytes -= oldest.1;
            }
        }
        // Deregistered outside the lock (a device call on rdma-core).
        drop(evicted);
    }
}

impl<P: Provider> Idle<P> {
    /// The buffer whose registration came back longest ago.
    fn oldest(&self) -> Option<Key> {
        self.by_key
            .iter()
            .min_by_key(|(_, (last, _))| *last)
            .map(|(k, _)| *k)
    }
}

impl<P: Provider> WriteReg<P> {
    pub fn mr(&self) -> &P::Mr {
        &self.reg.as_ref().expect("held until dropped").mr
    }
}

impl<P: Provider> Drop for WriteReg<P> {
    fn drop(&mut self) {
        if let Some(reg) = self.reg.take() {
            self.cache.give_back(self.key, reg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic::Rnic;

    fn cache(max_idle: usize) -> (Arc<Rnic>, Arc<WriteRegistrations<Rnic>>) {
        let dev = Arc::new(Rnic::new().unwrap());
        let pd = dev.alloc_pd().unwrap();
        (dev.clone(), WriteRegistrations::new(dev, pd, max_idle))
    }

    #[test]
    fn recurring_bytes_hit_under_a_fresh_stag_each_time() {
        let (dev, cache) = cache(1 << 20);
        let data = Bytes::from(vec![0x5a; 64 << 10]);
        let first = cache.take(&data).unwrap();
        assert_eq!(first.mr().addr(), data.as_ptr() as u64, "no copy");
        let stag = first.mr().rkey();
        assert!(dev.stags().lookup(stag).is_some());
        drop(first);
        assert!(dev.stags().lookup(stag).is_none(), "invalidated once back");
        let again = cache.take(&data.clone()).unwrap();
        assert_eq!(again.mr().addr(), data.as_ptr() as u64);
        assert_ne!(again.mr().rkey(), stag, "an earlier command's key is dead");
        assert!(dev.stags().lookup(again.mr().rkey()).is_some());
        assert_eq!(cache.stats(), RegistrationStats { hits: 1, misses: 1 });
    }

    #[test]
    fn commands_in_flight_on_the_same_bytes_get_stags_of_their_own() {
        let (dev, cache) = cache(1 << 20);
        let data = Bytes::from(vec![1; 8192]);
        let a = cache.take(&data).unwrap();
        let b = cache.take(&data).unwrap();
        assert_ne!(a.mr().rkey(), b.mr().rkey());
        // The target invalidates a's STag with its status: b's reads go on.
        let a_stag = a.mr().rkey();
        a.mr().invalidate();
        assert!(dev.stags().lookup(a_stag).is_none());
        assert!(dev.stags().lookup(b.mr().rkey()).is_some());
        drop((a, b));
        let c = cache.take(&data).unwrap();
        let d = cache.take(&data).unwrap();
        assert_eq!(cache.stats(), RegistrationStats { hits: 2, misses: 2 });
        assert_ne!(c.mr().rkey(), d.mr().rkey());
    }

    #[test]
    fn other_bytes_at_a_cached_length_are_not_taken_for_cached_ones() {
        let (_, cache) = cache(1 << 20);
        let a = Bytes::from(vec![1; 4096]);
        let b = Bytes::from(vec![2; 4096]);
        drop(cache.take(&a).unwrap());
        let reg = cache.take(&b).unwrap();
        assert_eq!(reg.mr().addr(), b.as_ptr() as u64);
        assert_eq!(reg.mr().bytes_at(0, 1), &[2]);
        assert_eq!(cache.stats().misses, 2);
        // A slice of a cached buffer is other bytes too (another length or address).
        drop(cache.take(&a.slice(0..2048)).unwrap());
        assert_eq!(cache.stats().misses, 3);
    }

    #[test]
    fn idle_registrations_are_bounded_least_recently_used_first() {
        let (dev, cache) = cache(3 * 4096);
        let bufs: Vec<Bytes> = (0..5u8).map(|i| Bytes::from(vec![i; 4096])).collect();
        for b in &bufs {
            drop(cache.take(b).unwrap());
        }
        assert_eq!(cache.idle_bytes(), 3 * 4096);
        assert_eq!(
            dev.stags().registered(),
            3,
            "the two oldest were deregistered"
        );
        // Registrations of one buffer count its bytes once.
        let held: Vec<_> = (0..4).map(|_| cache.take(&bufs[3]).unwrap()).collect();
        drop(held);
        assert_eq!(cache.idle_bytes(), 3 * 4096);
        assert_eq!(dev.stags().registered(), 6);
        assert_eq!(cache.stats(), RegistrationStats { hits: 1, misses: 8 });
        drop(cache.take(&bufs[4]).unwrap());
        drop(cache.take(&bufs[0]).unwrap());
        assert_eq!(cache.stats(), RegistrationStats { hits: 2, misses: 9 });
        assert_eq!(cache.idle_bytes(), 3 * 4096);
        assert_eq!(
            dev.stags().registered(),
            6,
            "bufs[2] went, with its one registration"
        );
    }
}
