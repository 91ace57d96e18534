//! The portals a running target serves, in one list: what SendTargets lists (through the
//! login directory), what [`crate::Target::portals`] reports, and each portal's accept
//! loop, which ends in one way only, by being aborted (the portal removed, or the target
//! shut down).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use iscsi_login::directory::Portal as Entry;
use tokio::task::JoinHandle;

/// Every portal the target has, in the order they were bound or added.
#[derive(Default)]
pub struct Portals {
    list: Mutex<List>,
}

#[derive(Default)]
struct List {
    served: Vec<Served>,
    /// The target shut down: portals added from now on accept nothing.
    closed: bool,
}

struct Served {
    portal: Arc<dyn datamover::Portal>,
    /// Its accept loop, once serving has started.
    accepting: Option<JoinHandle<()>>,
}

/// A portal's entry in the login directory (SendTargets, the portal group tag a login
/// reports).
pub fn entry(portal: &dyn datamover::Portal) -> Entry {
    Entry {
        address: portal.local_addr(),
        tpgt: 1,
    }
}

impl Portals {
    fn list(&self) -> std::sync::MutexGuard<'_, List> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Portals bound before serving starts: listed, not accepting yet.
    pub fn new(portals: Vec<Arc<dyn datamover::Portal>>) -> Portals {
        let served = portals
            .into_iter()
            .map(|portal| Served {
                portal,
                accepting: None,
            })
            .collect();
        Portals {
            list: Mutex::new(List {
                served,
                closed: false,
            }),
        }
    }

    /// Starts `accept` on every portal that has no accept loop yet.
    pub fn start(&self, accept: impl Fn(Arc<dyn datamover::Portal>) -> JoinHandle<()>) {
        let mut list = self.list();
        if list.closed {
            return;
        }
        for s in list.served.iter_mut().filter(|s| s.accepting.is_none()) {
            s.accepting = Some(accept(s.portal.clone()));
        }
    }

    /// Adds `portal` and starts `accept` on it, unless the target has shut down.
    pub fn add(
        &self,
        portal: Arc<dyn datamover::Portal>,
        accept: impl FnOnce(Arc<dyn datamover::Portal>) -> JoinHandle<()>,
    ) {
        let mut list = self.list();
        if list.closed {
            return;
        }
        let accepting = Some(accept(portal.clone()));
        list.served.push(Served { portal, accepting });
    }

    /// Removes the portal bound to `address` and aborts its accept loop (which drops the
    /// portal, closing its listener). Whether there was one.
    pub fn remove(&self, address: SocketAddr) -> bool {
        let removed = {
            let mut list = self.list();
            let at = list
                .served
                .iter()
                .position(|s| s.portal.local_addr() == address);
            at.map(|i| list.served.remove(i))
        };
        let Some(removed) = removed else {
            return false;
        };
        if let Some(task) = removed.accepting {
            task.abort();
        }
        true
    }

    /// Shutdown: every portal goes and its accept loop is aborted; what to await for the
    /// loops to have ended.
    pub fn close(&self) -> Vec<JoinHandle<()>> {
        let served = {
            let mut list = self.list();
            list.closed = true;
            std::mem::take(&mut list.served)
        };
        let tasks: Vec<_> = served.into_iter().filter_map(|s| s.accepting).collect();
        for t in &tasks {
            t.abort();
        }
        tasks
    }

    /// The directory entries of every portal.
    pub fn entries(&self) -> Vec<Entry> {
        self.list()
            .served
            .iter()
            .map(|s| entry(&*s.portal))
            .collect()
    }

    /// Each portal's address and what it serves.
    pub fn describe(&self) -> Vec<(SocketAddr, String)> {
        self.list()
            .served
            .iter()
            .map(|s| (s.portal.local_addr(), s.portal.describe()))
            .collect()
    }
}
