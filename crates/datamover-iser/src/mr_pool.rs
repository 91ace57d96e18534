//! A pool of registered memory regions, kept by size class (powers of two from 4 KiB), so that an
//! RDMA operation takes a region registered earlier instead of registering one of its own (the
//! pre-registered buffers of tgt's and OSC's iSER targets). A region goes back to its class when
//! its lease ends; what the pool keeps is bounded, and regions beyond the bound are released.
//! Regions a peer may reach (remote access) are invalidated when they come back and taken
//! again under a fresh STag, so a peer can never use a key it was given for an earlier command,
//! and that STag reaches only the command's length, not the rest of its size class.

use std::sync::{Arc, Mutex};

use rdma::{Access, MemoryRegion, Provider};

/// The smallest size class.
const MIN_CLASS: usize = 4096;

/// Registered regions of one access kind, by size class.
pub struct MrPool<P: Provider> {
    dev: Arc<P>,
    pd: P::Pd,
    access: Access,
    /// Bytes the pool may keep idle; a returned region past this is released.
    max_idle_bytes: usize,
    idle: Mutex<Idle<P>>,
}

struct Idle<P: Provider> {
    /// classes[i]: idle regions of MIN_CLASS << i bytes.
    classes: Vec<Vec<P::Mr>>,
    bytes: usize,
}

/// A region taken from the pool; it returns when dropped.
pub struct PooledMr<P: Provider> {
    mr: Option<P::Mr>,
    class: usize,
    pool: Arc<MrPool<P>>,
}

impl<P: Provider> MrPool<P> {
    pub fn new(dev: Arc<P>, pd: P::Pd, access: Access, max_idle_bytes: usize) -> Arc<Self> {
        Arc::new(MrPool {
            dev,
            pd,
            access,
            max_idle_bytes,
            idle: Mutex::new(Idle {
                classes: Vec::new(),
                bytes: 0,
            }),
        })
    }

    /// A region of at least `len` bytes: an idle one of its class, or a new registration.
    pub fn take(self: &Arc<Self>, len: usize) -> rdma::Result<PooledMr<P>> {
        let class = class_of(len);
        let idle = {
            let mut idle = self.idle.lock().expect("pool");
            let mr = idle.classes.get_mut(class).and_then(Vec::pop);
            if mr.is_some() {
                idle.bytes -= MIN_CLASS << class;
            }
            mr
        };
        let mr = match idle {
            Some(mr) if self.remote() => {
                crate::stats::POOL_HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                mr.revalidate_bounded(len);
                mr
            }
            Some(mr) => {
                crate::stats::POOL_HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                mr
            }
            None => {
                crate::stats::REGISTRATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mr = self.dev.reg_mr(&self.pd, MIN_CLASS << class, self.access)?;
                if self.remote() && len < mr.len() {
                    mr.revalidate_bounded(len);
                }
                mr
            }
        };
        Ok(PooledMr {
            mr: Some(mr),
            class,
            pool: self.clone(),
        })
    }

    /// A pool of `access` regions on the same device and protection domain.
    pub fn sibling(&self, access: Access, max_idle_bytes: usize) -> Arc<Self> {
        MrPool::new(self.dev.clone(), self.pd.clone(), access, max_idle_bytes)
    }

    /// A registration cache for the caller's write data on the same device and protection
    /// domain.
    pub fn write_registrations(
        &self,
        max_idle_bytes: usize,
    ) -> Arc<crate::write_regs::WriteRegistrations<P>> {
        crate::write_regs::WriteRegistrations::new(
            self.dev.clone(),
            self.pd.clone(),
            max_idle_bytes,
        )
    }

    fn remote(&self) -> bool {
        self.access.contains(Access::REMOTE_READ) || self.access.contains(Access::REMOTE_WRITE)
    }

    /// Bytes of idle regions kept.
    pub fn idle_bytes(&self) -> usize {
        self.idle.lock().expect("pool").bytes
    }

    fn give_back(&self, class: usize, mr: P::Mr) {
        if self.remote() && mr.is_valid() {
            mr.invalidate();
        }
        let mut idle = self.idle.lock().expect("pool");
        let size = MIN_CLASS << class;
        if idle.bytes + size > self.max_idle_bytes {
            return; // released as `mr` drops
        }
        if idle.classes.len() <= class {
            idle.classes.resize_with(class + 1, Vec::new);
        }
        idle.classes[class].push(mr);
        idle.bytes += size;
    }
}

impl<P: Provider> PooledMr<P> {
    pub fn mr(&self) -> &P::Mr {
        self.mr.as_ref().expect("leased region")
    }
}

impl<P: Provider> Drop for PooledMr<P> {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            self.pool.give_back(self.class, mr);
        }
    }
}

/// The class index of a `len`-byte request: the smallest power of two from 4 KiB holding it.
fn class_of(len: usize) -> usize {
    let size = len.max(MIN_CLASS).next_power_of_two();
    (size / MIN_CLASS).trailing_zeros() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::MemoryRegion;
    use rnic::Rnic;

    #[test]
    fn classes_are_powers_of_two_from_4k() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(4096), 0);
        assert_eq!(class_of(4097), 1);
        assert_eq!(class_of(1 << 20), 8);
    }

    #[test]
    fn a_returned_region_is_taken_again_and_the_bound_holds() {
        let dev = Arc::new(Rnic::new().unwrap());
        let pd = dev.alloc_pd().unwrap();
        let pool = MrPool::new(dev, pd, Access::LOCAL_WRITE, 64 << 10);
        let a = pool.take(5000).unwrap();
        assert_eq!(a.mr().len(), 8192);
        let rkey = a.mr().rkey();
        drop(a);
        assert_eq!(pool.idle_bytes(), 8192);
        let b = pool.take(8000).unwrap();
        assert_eq!(b.mr().rkey(), rkey, "the idle region is reused");
        assert_eq!(pool.idle_bytes(), 0);
        // 128 KiB exceeds the 64 KiB bound: released, not kept.
        drop(pool.take(100 << 10).unwrap());
        assert_eq!(pool.idle_bytes(), 0);
        drop(b);
        assert_eq!(pool.idle_bytes(), 8192);
    }

    #[test]
    fn a_remote_region_comes_back_invalid_and_is_taken_again_under_a_new_stag() {
        let dev = Arc::new(Rnic::new().unwrap());
        let pd = dev.alloc_pd().unwrap();
        let pool = MrPool::new(dev, pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 1 << 20);
        let a = pool.take(4096).unwrap();
        let first = a.mr().rkey();
        let addr = a.mr().addr();
        drop(a);
        let b = pool.take(4096).unwrap();
        assert_eq!(b.mr().addr(), addr, "the same region");
        assert_ne!(b.mr().rkey(), first, "under a new STag");
        assert!(b.mr().is_valid());
    }

    /// A command's STag reaches its length, not its region's size class: a peer's RDMA Write
    /// one byte past it is refused, fresh region or reused.
    #[test]
    fn a_remote_stag_reaches_only_the_length_taken() {
        let dev = Arc::new(Rnic::new().unwrap());
        let pd = dev.alloc_pd().unwrap();
        let pool = MrPool::new(
            dev.clone(),
            pd.clone(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            1 << 20,
        );
        let pd_id = pd.id();
        for _ in 0..2 {
            let a = pool.take(5000).unwrap();
            assert_eq!(a.mr().len(), 8192);
            let (stag, base) = (a.mr().rkey(), a.mr().addr());
            let t = dev.stags();
            assert!(t
                .check(stag, pd_id, Access::REMOTE_WRITE, base, 5000)
                .is_ok());
            assert_eq!(
                t.check(stag, pd_id, Access::REMOTE_WRITE, base + 4999, 2)
                    .err(),
                Some(rnic::AccessError::Bounds)
            );
            drop(a); // and again, reused from the idle list
        }
    }
}
