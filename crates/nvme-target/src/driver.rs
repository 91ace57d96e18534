//! The tokio driver: listeners, and one task per TCP connection, which is one queue (admin
//! or I/O). The task feeds the bytes read to `nvme_tcp::queue::ControllerQueue`, hands
//! each whole command to the [`Registry`] (under a lock never held across an await), runs
//! the NVM I/O it returns concurrently with the connection's other commands, and writes
//! the PDUs back. A malformed PDU is answered with a C2HTermReq and ends only its own
//! connection.
//!
//! Budget: what a host can make this side hold is bounded per connection by the queue's
//! entries (at most [`Limits::queue_depth`]) times the largest transfer
//! ([`Limits::max_transfer`], MDTS), the in-capsule data by [`Limits::in_capsule`], one
//! H2CData PDU by `maxh2cdata`, the read buffer by [`READ_CHUNK`]; and connections by
//! [`DriverConfig::max_connections`] (more are closed at once). A connection that does not
//! finish its IC exchange and Connect within [`DriverConfig::connect_timeout`] is closed.

use crate::controller::{Limits, Outcome, QueueBinding, Registry};
use crate::subsystem::Subsystem;
use bytes::Bytes;
use nvme_tcp::queue::{Action, CloseReason, Command, ControllerQueue, QueueConfig};
use nvme_tcp::sqe::DataDirection;
use nvme_tcp::{Cqe, Status, StatusCode};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Bytes read from a socket at once.
pub const READ_CHUNK: usize = 64 * 1024;

/// How the driver serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverConfig {
    /// The controllers' limits.
    pub limits: Limits,
    /// Header digests are enabled when a host asks.
    pub allow_header_digest: bool,
    /// Data digests are enabled when a host asks.
    pub allow_data_digest: bool,
    /// MAXH2CDATA announced: the most data of one H2CData PDU.
    pub maxh2cdata: u32,
    /// Connections at once (all listeners).
    pub max_connections: usize,
    /// Time for a connection's ICReq and Connect.
    pub connect_timeout: Duration,
    /// How often each connection looks at its controller (keep alive, events).
    pub tick: Duration,
}

impl Default for DriverConfig {
    fn default() -> DriverConfig {
        DriverConfig {
            limits: Limits::default(),
            allow_header_digest: true,
            allow_data_digest: true,
            maxh2cdata: 128 * 1024,
            max_connections: 256,
            connect_timeout: Duration::from_secs(10),
            tick: Duration::from_millis(200),
        }
    }
}

impl DriverConfig {
    fn queue_config(&self) -> QueueConfig {
        let l = &self.limits;
        QueueConfig {
            allow_hdgst: self.allow_header_digest,
            allow_ddgst: self.allow_data_digest,
            cpda: 0,
            maxh2cdata: self.maxh2cdata,
            // The admin queue's Connect brings 1 KiB in its capsule.
            max_in_capsule: l
                .in_capsule
                .max(nvme_tcp::sqe::fabrics::CONNECT_DATA_LEN as u32),
            max_transfer: l.max_transfer,
            max_r2t_len: l.max_transfer,
            c2h_cut: self.maxh2cdata,
            sq_entries: l.queue_depth,
        }
    }
}

/// A bound NVMe/TCP target, not yet serving.
pub struct NvmeTarget {
    registry: Arc<Mutex<Registry>>,
    listeners: Vec<TcpListener>,
    config: DriverConfig,
}

fn lock(r: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

impl NvmeTarget {
    /// Binds each subsystem's addresses and the discovery addresses (an address listed
    /// several times is bound once; every listener serves every subsystem and discovery,
    /// the Connect's NQN choosing). Port 0 binds a free port.
    pub async fn bind(
        subsystems: Vec<(Subsystem, Vec<SocketAddr>)>,
        discovery: Vec<SocketAddr>,
        config: DriverConfig,
    ) -> std::io::Result<NvmeTarget> {
        let mut bound: Vec<(SocketAddr, SocketAddr)> = Vec::new();
        let mut listeners = Vec::new();
        let mut bind = |asked: SocketAddr| -> std::io::Result<SocketAddr> {
            if let Some((_, got)) = bound.iter().find(|(a, _)| *a == asked && a.port() != 0) {
                return Ok(*got);
            }
            let std = std::net::TcpListener::bind(asked).map_err(|e| {
                std::io::Error::new(e.kind(), format!("NVMe/TCP listen {asked}: {e}"))
            })?;
            std.set_nonblocking(true)?;
            let l = TcpListener::from_std(std)?;
            let got = l.local_addr()?;
            listeners.push(l);
            bound.push((asked, got));
            Ok(got)
        };
        let mut subs = Vec::new();
        let mut ports = Vec::new();
        for (s, addrs) in subsystems {
            let mut got = Vec::new();
            for a in addrs {
                got.push(bind(a)?);
            }
            ports.push((s.nqn.clone(), got));
            subs.push(s);
        }
        let mut disc = Vec::new();
        for a in discovery {
            disc.push(bind(a)?);
        }
        let mut registry = Registry::new(subs, config.limits);
        for (nqn, got) in ports {
            registry.set_ports(&nqn, got);
        }
        registry.set_discovery_ports(disc);
        Ok(NvmeTarget {
            registry: Arc::new(Mutex::new(registry)),
            listeners,
            config,
        })
    }

    /// Binds the subsystems of a configuration, each namespace the LUN `lun_export` finds
    /// (target name, LUN number); the discovery controller on every subsystem's discovery
    /// addresses. Errors name the subsystem and namespace, or the address.
    pub async fn from_config(
        configs: &[crate::SubsystemConfig],
        lun_export: impl Fn(&str, u64) -> Option<scsi::LunExport>,
        config: DriverConfig,
    ) -> Result<NvmeTarget, String> {
        crate::config::validate(configs)?;
        let mut subsystems = Vec::new();
        let mut discovery: Vec<SocketAddr> = Vec::new();
        for c in configs {
            let mut namespaces = std::collections::BTreeMap::new();
            for n in &c.namespaces {
                let lun = lun_export(&n.target, n.lun).ok_or_else(|| {
                    format!(
                        "[[subsystem]] {} nsid {}: target {:?} has no block LUN {}",
                        c.nqn, n.nsid, n.target, n.lun
                    )
                })?;
                namespaces.insert(n.nsid, lun);
            }
            let s = Subsystem::new(
                &c.nqn,
                c.hosts.clone(),
                c.allow_any_host,
                c.serial.clone(),
                namespaces,
            );
            subsystems.push((s, c.listen_addrs()?));
            for a in c.discovery_addrs()? {
                if !discovery.contains(&a) {
                    discovery.push(a);
                }
            }
        }
        NvmeTarget::bind(subsystems, discovery, config)
            .await
            .map_err(|e| e.to_string())
    }

    /// The addresses bound, in order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The controllers, shared with the connections.
    pub fn registry(&self) -> Arc<Mutex<Registry>> {
        self.registry.clone()
    }

    /// Accepts and serves connections on every listener until dropped.
    pub async fn serve(self) {
        let slots = Arc::new(Semaphore::new(self.config.max_connections));
        let mut accepts = JoinSet::new();
        for l in self.listeners {
            let (reg, cfg, slots) = (self.registry.clone(), self.config, slots.clone());
            accepts.spawn(accept_loop(l, reg, cfg, slots));
        }
        while accepts.join_next().await.is_some() {}
    }
}

async fn accept_loop(
    l: TcpListener,
    reg: Arc<Mutex<Registry>>,
    cfg: DriverConfig,
    slots: Arc<Semaphore>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((stream, peer)) => {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        tracing::warn!("nvme: {peer}: refused, {} connections already", cfg.max_connections);
                        continue;
                    };
                    let reg = reg.clone();
                    conns.spawn(async move {
                        let _ = stream.set_nodelay(true);
                        serve_connection(stream, reg, cfg).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!("nvme: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// One connection's state while it runs.
struct Conn {
    queue: ControllerQueue,
    binding: QueueBinding,
    reg: Arc<Mutex<Registry>>,
    /// NVM I/O running: (CID, its data direction, result).
    jobs: JoinSet<(u16, bool, Result<Option<Bytes>, StatusCode>)>,
    out: Vec<u8>,
}

/// Serves one connection until it closes, fails, or its controller ends.
pub async fn serve_connection(mut stream: TcpStream, reg: Arc<Mutex<Registry>>, cfg: DriverConfig) {
    let peer = stream.peer_addr().ok();
    let mut c = Conn {
        queue: ControllerQueue::new(cfg.queue_config()),
        binding: QueueBinding::default(),
        reg,
        jobs: JoinSet::new(),
        out: Vec::new(),
    };
    let started = Instant::now();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut tick = tokio::time::interval(cfg.tick);
    let why = loop {
        let go_on = tokio::select! {
            r = stream.read(&mut buf) => match r {
                Ok(0) => Err("closed by the host".to_string()),
                Ok(n) => c.received(&buf[..n]),
                Err(e) => Err(format!("read failed: {e}")),
            },
            Some(j) = c.jobs.join_next(), if !c.jobs.is_empty() => match j {
                Ok((cid, read, r)) => c.io_done(cid, read, r),
                Err(e) => Err(format!("I/O task failed: {e}")),
            },
            _ = tick.tick() => c.on_tick(started, &cfg),
        };
        let flushed = if c.out.is_empty() {
            Ok(())
        } else {
            let r = stream.write_all(&c.out).await;
            c.out.clear();
            r
        };
        match (go_on, flushed) {
            (Err(why), _) => break why,
            (_, Err(e)) => break format!("write failed: {e}"),
            _ => {}
        }
    };
    let _ = stream.shutdown().await;
    lock(&c.reg).queue_closed(&c.binding);
    tracing::debug!(
        "nvme: connection {peer:?} (controller {:?}, queue {}) ended: {why}",
        c.binding.cntlid,
        c.binding.qid
    );
}

impl Conn {
    fn received(&mut self, bytes: &[u8]) -> Result<(), String> {
        for a in self.queue.receive(bytes) {
            match a {
                Action::Send(b) => self.out.extend_from_slice(&b),
                Action::Execute(cmd) => self.execute(cmd)?,
                Action::Close(CloseReason::Fatal(e)) => return Err(format!("bad PDU: {e}")),
                Action::Close(CloseReason::HostTerminated(t)) => {
                    return Err(format!("host terminated (FES {:#x})", t.fes))
                }
            }
        }
        Ok(())
    }

    fn execute(&mut self, cmd: Command) -> Result<(), String> {
        let connected = self.binding.cntlid.is_some();
        let outcome =
            lock(&self.reg).execute(&mut self.binding, &cmd.sqe, &cmd.data, Instant::now());
        if !connected && self.binding.cntlid.is_some() {
            self.queue.set_sq(
                self.binding.sq_entries,
                self.binding.sq_flow_control_disabled,
            );
        }
        let read = cmd.sqe.direction() == DataDirection::ControllerToHost;
        let cid = cmd.sqe.cid();
        match outcome {
            Outcome::Done { cqe, mut data } => {
                data.truncate(cmd.sqe.sgl().length as usize);
                self.respond(cqe, read, &data)
            }
            Outcome::Io(op) => {
                self.jobs
                    .spawn(async move { (cid, read, crate::io::run(op).await) });
                Ok(())
            }
            Outcome::Held => Ok(()),
        }
    }

    fn io_done(
        &mut self,
        cid: u16,
        read: bool,
        r: Result<Option<Bytes>, StatusCode>,
    ) -> Result<(), String> {
        match r {
            Ok(data) => {
                let data = data.unwrap_or_default();
                self.respond(Cqe::new(cid, Status::SUCCESS), read, &data)
            }
            Err(code) => self.respond(Cqe::new(cid, Status::error(code, true)), read, &[]),
        }
    }

    fn respond(&mut self, mut cqe: Cqe, read: bool, data: &[u8]) -> Result<(), String> {
        cqe.sqid = self.binding.qid;
        if read {
            let pdus = self
                .queue
                .respond_with_data(cqe, &[data])
                .map_err(|e| e.to_string())?;
            for p in pdus {
                p.write_to(&mut self.out);
            }
        } else {
            let p = self.queue.respond(cqe).map_err(|e| e.to_string())?;
            p.write_to(&mut self.out);
        }
        Ok(())
    }

    /// Keep alive and events: the controller may have expired, held event requests may
    /// have their event; a queue that never connected is given up on.
    fn on_tick(&mut self, started: Instant, cfg: &DriverConfig) -> Result<(), String> {
        let Some(id) = self.binding.cntlid else {
            if started.elapsed() > cfg.connect_timeout {
                return Err("no Connect in time".into());
            }
            return Ok(());
        };
        let events = {
            let mut reg = lock(&self.reg);
            for gone in reg.expire(Instant::now()) {
                tracing::info!("nvme: controller {gone}: keep alive timer expired, torn down");
            }
            if !reg.alive(id) {
                return Err(format!("controller {id} ended"));
            }
            if self.binding.qid == 0 {
                reg.take_events(id)
            } else {
                Vec::new()
            }
        };
        for cqe in events {
            self.respond(cqe, false, &[])?;
        }
        Ok(())
    }
}
