//! The controllers of every subsystem, sans IO: [`Registry::execute`] takes one command
//! of one queue (with the time now) and says what follows: a completion (with data for
//! the host), an NVM I/O for the backend, or nothing yet (an Asynchronous Event Request
//! held until an event).
//!
//! A controller is created by the Connect of an admin queue (QID 0) and given a CNTLID
//! (the dynamic model); the Connects of its I/O queues name that CNTLID, the same host and
//! subsystem. It lives until its admin queue closes or its keep alive timer runs out
//! ([`Registry::expire`]); its I/O queues then find it gone ([`Registry::alive`]).
//! The discovery subsystem's controllers answer Identify and the Discovery log page.

use crate::config::{DISCOVERY_NQN, MAX_NSID};
use crate::io::{self, IoKind, IoOp};
use crate::subsystem::{eui64, nguid, Subsystem};
use bytes::Bytes;
use nvme_tcp::identify::{self, IdentifyController, IdentifyNamespace};
use nvme_tcp::log::{self, DiscoveryEntry, GetLogPage, Smart};
use nvme_tcp::sqe::admin;
use nvme_tcp::sqe::fabrics::{self, reg, Connect, ConnectData, Property};
use nvme_tcp::{Cqe, Sqe, Status, StatusCode};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What the controllers offer and allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries of each submission queue at most (CAP.MQES + 1, MAXCMD).
    pub queue_depth: u16,
    /// Most data of one command, a power of two from 4 KiB (MDTS).
    pub max_transfer: u32,
    /// Most in-capsule data of an I/O command (IOCCSZ).
    pub in_capsule: u32,
    /// Most I/O queues of one controller.
    pub max_io_queues: u16,
    /// Most controllers at once (admin queues), discovery ones included.
    pub max_controllers: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            queue_depth: 128,
            max_transfer: 256 * 1024,
            in_capsule: 8192,
            max_io_queues: 16,
            max_controllers: 64,
        }
    }
}

/// Async event: a notice (type 2), Namespace Attribute Changed (info 0), log page 04h.
pub const AEN_NS_CHANGED: u32 = 0x02 | (0x04 << 16);
/// Outstanding Asynchronous Event Requests per controller (AERL + 1).
pub const MAX_AERS: usize = 4;
/// Async event configuration bit 8: namespace attribute notices enabled.
const AEC_NS_ATTRIBUTE: u32 = 1 << 8;
/// Keep alive granularity reported (KAS, 100 ms units).
const KAS: u16 = 10;
/// Identify CNS: the I/O command set specific Identify Controller (CSI in CDW11 31:24).
const CNS_CSI_CONTROLLER: u8 = 0x06;
/// Command set identifier of the NVM command set.
const CSI_NVM: u32 = 0;
/// Connect's NVMe/TCP admin queue size a discovery entry announces.
const ASQSZ: u16 = 32;

/// What a queue knows of itself once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueBinding {
    /// The controller, after a successful Connect.
    pub cntlid: Option<u16>,
    /// Queue ID (0: admin).
    pub qid: u16,
    /// Submission queue entries granted (SQSIZE + 1).
    pub sq_entries: u16,
    /// The host disabled SQ flow control.
    pub sq_flow_control_disabled: bool,
}

/// What follows a command.
#[derive(Debug)]
pub enum Outcome {
    /// Complete it with `cqe`, sending `data` first (controller to host; cut to the
    /// command's SGL length by the caller).
    Done {
        /// The completion.
        cqe: Cqe,
        /// Data for the host.
        data: Vec<u8>,
    },
    /// Carry out this I/O ([`io::run`]), then complete with its status.
    Io(IoOp),
    /// Nothing yet: an Asynchronous Event Request, completed by [`Registry::take_events`].
    Held,
}

#[derive(Debug)]
struct Controller {
    /// Index into the registry's subsystems; `None` for a discovery controller.
    subsystem: Option<usize>,
    hostnqn: String,
    cc: u32,
    csts: u32,
    kato: Duration,
    last_seen: Instant,
    aec: u32,
    io_queues_granted: u16,
    io_queues: BTreeSet<u16>,
    aers: VecDeque<u16>,
    events: VecDeque<u32>,
    changed: BTreeSet<u32>,
    /// A namespace notice was sent and the Changed Namespace List not read since.
    notice_masked: bool,
    smart: Smart,
}

/// The subsystems and their live controllers.
#[derive(Debug)]
pub struct Registry {
    subsystems: Vec<Subsystem>,
    controllers: HashMap<u16, Controller>,
    next_cntlid: u16,
    limits: Limits,
    /// Where the discovery controller listens, for its own entries.
    discovery_ports: Vec<SocketAddr>,
}

const CC_EN: u32 = 1;
const CC_SHN_MASK: u32 = 3 << 14;
const CSTS_RDY: u32 = 1;
const CSTS_SHST_COMPLETE: u32 = 2 << 2;

fn done(cid: u16, code: StatusCode) -> Outcome {
    let dnr = code != StatusCode::SUCCESS;
    Outcome::Done {
        cqe: Cqe::new(cid, Status::error(code, dnr)),
        data: Vec::new(),
    }
}

fn ok_dw0(cid: u16, dw0: u32) -> Outcome {
    let mut cqe = Cqe::new(cid, Status::SUCCESS);
    cqe.dw0 = dw0;
    Outcome::Done {
        cqe,
        data: Vec::new(),
    }
}

fn ok_data(cid: u16, data: Vec<u8>) -> Outcome {
    Outcome::Done {
        cqe: Cqe::new(cid, Status::SUCCESS),
        data,
    }
}

/// Connect Invalid Parameters naming the field at fault: in the data (`in_data`) or the
/// command, at byte offset `ipo`.
fn invalid_connect(cid: u16, in_data: bool, ipo: u16, code: StatusCode) -> Outcome {
    let mut cqe = Cqe::new(cid, Status::error(code, true));
    cqe.dw0 = (u32::from(in_data) << 16) | u32::from(ipo);
    Outcome::Done {
        cqe,
        data: Vec::new(),
    }
}

/// Byte offsets of Connect's fields named in Invalid Parameters.
mod ipo {
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CNTLID: u16 = 16;
    pub const SUBNQN: u16 = 256;
    pub const HOSTNQN: u16 = 512;
}

impl Registry {
    /// The controllers of `subsystems` (none yet), within `limits`.
    pub fn new(subsystems: Vec<Subsystem>, limits: Limits) -> Registry {
        Registry {
            subsystems,
            controllers: HashMap::new(),
            next_cntlid: 1,
            limits,
            discovery_ports: Vec::new(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The subsystems served.
    pub fn subsystems(&self) -> &[Subsystem] {
        &self.subsystems
    }

    /// Records where subsystem `nqn` is served (for the discovery log page).
    pub fn set_ports(&mut self, nqn: &str, ports: Vec<SocketAddr>) {
        if let Some(s) = self.subsystems.iter_mut().find(|s| s.nqn == nqn) {
            s.ports = ports;
        }
    }

    /// Records where the discovery controller is served.
    pub fn set_discovery_ports(&mut self, ports: Vec<SocketAddr>) {
        self.discovery_ports = ports;
    }

    /// Live controllers.
    pub fn controller_count(&self) -> usize {
        self.controllers.len()
    }

    /// Whether controller `cntlid` still lives.
    pub fn alive(&self, cntlid: u16) -> bool {
        self.controllers.contains_key(&cntlid)
    }

    /// Ends the controllers whose keep alive timer ran out (no command for KATO); returns
    /// their CNTLIDs.
    pub fn expire(&mut self, now: Instant) -> Vec<u16> {
        let gone: Vec<u16> = self
            .controllers
            .iter()
            .filter(|(_, c)| {
                !c.kato.is_zero() && now.saturating_duration_since(c.last_seen) > c.kato
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.controllers.remove(id);
        }
        gone
    }

    /// A queue's connection ended: an admin queue takes its controller with it, an I/O
    /// queue frees its QID.
    pub fn queue_closed(&mut self, q: &QueueBinding) {
        let Some(id) = q.cntlid else { return };
        if q.qid == 0 {
            self.controllers.remove(&id);
        } else if let Some(c) = self.controllers.get_mut(&id) {
            c.io_queues.remove(&q.qid);
        }
    }

    /// Replaces the namespaces of subsystem `nqn`; every controller of it hears which
    /// changed (Changed Namespace List, and an event if enabled).
    pub fn set_namespaces(
        &mut self,
        nqn: &str,
        namespaces: std::collections::BTreeMap<u32, scsi::LunExport>,
    ) -> bool {
        let Some(ix) = self.subsystems.iter().position(|s| s.nqn == nqn) else {
            return false;
        };
        let old = std::mem::replace(&mut self.subsystems[ix].namespaces, namespaces);
        let new = &self.subsystems[ix].namespaces;
        let changed: Vec<u32> = old
            .keys()
            .chain(new.keys())
            .copied()
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .filter(|n| {
                old.get(n).map(|l| l.naa().to_vec()) != new.get(n).map(|l| l.naa().to_vec())
            })
            .collect();
        for c in self.controllers.values_mut() {
            if c.subsystem != Some(ix) || changed.is_empty() {
                continue;
            }
            c.changed.extend(changed.iter().copied());
            if c.aec & AEC_NS_ATTRIBUTE != 0 && !c.notice_masked {
                c.notice_masked = true;
                c.events.push_back(AEN_NS_CHANGED);
            }
        }
        true
    }

    /// The completions of held Asynchronous Event Requests that now have an event.
    pub fn take_events(&mut self, cntlid: u16) -> Vec<Cqe> {
        let Some(c) = self.controllers.get_mut(&cntlid) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while !c.aers.is_empty() && !c.events.is_empty() {
            let (Some(cid), Some(ev)) = (c.aers.pop_front(), c.events.pop_front()) else {
                break;
            };
            let mut cqe = Cqe::new(cid, Status::SUCCESS);
            cqe.dw0 = ev;
            out.push(cqe);
        }
        out
    }

    /// Executes one command of queue `q`. `data` is the host's data for it.
    pub fn execute(
        &mut self,
        q: &mut QueueBinding,
        sqe: &Sqe,
        data: &Bytes,
        now: Instant,
    ) -> Outcome {
        let cid = sqe.cid();
        if sqe.opcode() == fabrics::OPCODE {
            return self.fabrics(q, sqe, data, now);
        }
        let Some(id) = q.cntlid else {
            return done(cid, StatusCode::COMMAND_SEQUENCE_ERROR);
        };
        let Some(c) = self.controllers.get_mut(&id) else {
            return done(cid, StatusCode::COMMAND_SEQUENCE_ERROR);
        };
        c.last_seen = now;
        if c.cc & CC_EN == 0 {
            return done(cid, StatusCode::COMMAND_SEQUENCE_ERROR);
        }
        if q.qid == 0 {
            self.admin(id, sqe)
        } else {
            self.nvm(id, sqe, data)
        }
    }

    fn fabrics(&mut self, q: &mut QueueBinding, sqe: &Sqe, data: &Bytes, now: Instant) -> Outcome {
        let cid = sqe.cid();
        match sqe.fctype() {
            fabrics::CONNECT if q.cntlid.is_some() => done(cid, StatusCode::COMMAND_SEQUENCE_ERROR),
            fabrics::CONNECT => self.connect(q, sqe, data, now),
            _ if q.cntlid.is_none() => done(cid, StatusCode::COMMAND_SEQUENCE_ERROR),
            fabrics::PROPERTY_GET | fabrics::PROPERTY_SET if q.qid != 0 => {
                done(cid, StatusCode::INVALID_FIELD)
            }
            fabrics::PROPERTY_GET => self.property_get(q, sqe),
            fabrics::PROPERTY_SET => self.property_set(q, sqe),
            fabrics::DISCONNECT => done(cid, StatusCode::SUCCESS),
            _ => done(cid, StatusCode::INVALID_OPCODE),
        }
    }

    fn connect(&mut self, q: &mut QueueBinding, sqe: &Sqe, data: &Bytes, now: Instant) -> Outcome {
        let cid = sqe.cid();
        let c = Connect::parse(sqe);
        if c.recfmt != 0 {
            return done(cid, StatusCode::CONNECT_INCOMPATIBLE_FORMAT);
        }
        let d = match ConnectData::parse(data) {
            Ok(d) => d,
            Err(fabrics::ConnectDataError::Nqn("host NQN")) => {
                return invalid_connect(
                    cid,
                    true,
                    ipo::HOSTNQN,
                    StatusCode::CONNECT_INVALID_PARAMETERS,
                )
            }
            Err(fabrics::ConnectDataError::Nqn(_)) => {
                return invalid_connect(
                    cid,
                    true,
                    ipo::SUBNQN,
                    StatusCode::CONNECT_INVALID_PARAMETERS,
                )
            }
            Err(_) => return done(cid, StatusCode::SGL_LENGTH_INVALID),
        };
        let entries = u32::from(c.sqsize) + 1;
        if c.sqsize == 0 || entries > u32::from(self.limits.queue_depth) {
            return invalid_connect(
                cid,
                false,
                ipo::SQSIZE,
                StatusCode::CONNECT_INVALID_PARAMETERS,
            );
        }
        let subsystem = if d.subnqn == DISCOVERY_NQN {
            None
        } else {
            match self.subsystems.iter().position(|s| s.nqn == d.subnqn) {
                Some(ix) => Some(ix),
                None => {
                    return invalid_connect(
                        cid,
                        true,
                        ipo::SUBNQN,
                        StatusCode::CONNECT_INVALID_PARAMETERS,
                    )
                }
            }
        };
        if let Some(ix) = subsystem {
            if !self.subsystems[ix].allows(&d.hostnqn) {
                return invalid_connect(cid, true, ipo::HOSTNQN, StatusCode::CONNECT_INVALID_HOST);
            }
        }
        let id = if c.qid == 0 {
            if d.cntlid != fabrics::CNTLID_DYNAMIC && d.cntlid < 0xFFF0 {
                return invalid_connect(
                    cid,
                    true,
                    ipo::CNTLID,
                    StatusCode::CONNECT_INVALID_PARAMETERS,
                );
            }
            match self.new_controller(subsystem, &d.hostnqn, c.kato, now) {
                Some(id) => id,
                None => return done(cid, StatusCode::CONNECT_CONTROLLER_BUSY),
            }
        } else {
            let fits = self.controllers.get(&d.cntlid).is_some_and(|ctl| {
                ctl.subsystem == subsystem && subsystem.is_some() && ctl.hostnqn == d.hostnqn
            });
            if !fits {
                return invalid_connect(
                    cid,
                    true,
                    ipo::CNTLID,
                    StatusCode::CONNECT_INVALID_PARAMETERS,
                );
            }
            let ctl = self.controllers.get_mut(&d.cntlid).expect("checked above");
            let granted = ctl.io_queues_granted.max(1);
            if c.qid > granted || ctl.io_queues.contains(&c.qid) || ctl.cc & CC_EN == 0 {
                return invalid_connect(
                    cid,
                    false,
                    ipo::QID,
                    StatusCode::CONNECT_INVALID_PARAMETERS,
                );
            }
            ctl.io_queues.insert(c.qid);
            ctl.last_seen = now;
            d.cntlid
        };
        *q = QueueBinding {
            cntlid: Some(id),
            qid: c.qid,
            sq_entries: entries as u16,
            sq_flow_control_disabled: c.sq_flow_control_disabled(),
        };
        ok_dw0(cid, u32::from(id))
    }

    fn new_controller(
        &mut self,
        subsystem: Option<usize>,
        hostnqn: &str,
        kato_ms: u32,
        now: Instant,
    ) -> Option<u16> {
        if self.controllers.len() >= self.limits.max_controllers {
            return None;
        }
        // CNTLIDs 1 to FFEFh; the next free one after the last given.
        let mut id = self.next_cntlid;
        for _ in 0..0xFFEF {
            if !self.controllers.contains_key(&id) {
                break;
            }
            id = if id >= 0xFFEF { 1 } else { id + 1 };
        }
        self.next_cntlid = if id >= 0xFFEF { 1 } else { id + 1 };
        self.controllers.insert(
            id,
            Controller {
                subsystem,
                hostnqn: hostnqn.to_string(),
                cc: 0,
                csts: 0,
                kato: Duration::from_millis(u64::from(kato_ms)),
                last_seen: now,
                aec: 0,
                io_queues_granted: self.limits.max_io_queues,
                io_queues: BTreeSet::new(),
                aers: VecDeque::new(),
                events: VecDeque::new(),
                changed: BTreeSet::new(),
                notice_masked: false,
                smart: Smart {
                    temperature: 300,
                    available_spare: 100,
                    spare_threshold: 10,
                    ..Smart::default()
                },
            },
        );
        Some(id)
    }

    /// CAP: MQES, contiguous queues required, timeout 7.5 s, the NVM command set.
    fn cap(&self) -> u64 {
        u64::from(self.limits.queue_depth.max(2) - 1) | (1 << 16) | (15 << 24) | (1 << 37)
    }

    fn property_get(&mut self, q: &QueueBinding, sqe: &Sqe) -> Outcome {
        let cid = sqe.cid();
        let p = Property::parse(sqe);
        let Some(c) = q.cntlid.and_then(|id| self.controllers.get(&id)) else {
            return done(cid, StatusCode::COMMAND_SEQUENCE_ERROR);
        };
        let v = match (p.offset, p.eight_bytes) {
            (reg::CAP, true) => self.cap(),
            (reg::VS, false) => u64::from(identify::VERSION_1_3),
            (reg::CC, false) => u64::from(c.cc),
            (reg::CSTS, false) => u64::from(c.csts),
            _ => return done(cid, StatusCode::INVALID_FIELD),
        };
        let mut cqe = Cqe::new(cid, Status::SUCCESS);
        cqe.dw0 = v as u32;
        cqe.dw1 = (v >> 32) as u32;
        Outcome::Done {
            cqe,
            data: Vec::new(),
        }
    }

    fn property_set(&mut self, q: &QueueBinding, sqe: &Sqe) -> Outcome {
        let cid = sqe.cid();
        let p = Property::parse(sqe);
        let Some(c) = q.cntlid.and_then(|id| self.controllers.get_mut(&id)) else {
            return done(cid, StatusCode::COMMAND_SEQUENCE_ERROR);
        };
        if p.offset != reg::CC || p.eight_bytes {
            return done(cid, StatusCode::INVALID_FIELD);
        }
        let cc = p.value as u32;
        if cc & CC_SHN_MASK != 0 {
            c.csts = (c.csts & !(3 << 2)) | CSTS_SHST_COMPLETE;
        }
        if cc & CC_EN != 0 {
            c.csts |= CSTS_RDY;
        } else {
            // Disabling resets the controller: its queue state and events go.
            c.csts &= !CSTS_RDY;
            c.aers.clear();
            c.events.clear();
            c.notice_masked = false;
        }
        c.cc = cc;
        done(cid, StatusCode::SUCCESS)
    }

    fn admin(&mut self, id: u16, sqe: &Sqe) -> Outcome {
        let cid = sqe.cid();
        let discovery = self.controllers[&id].subsystem.is_none();
        match sqe.opcode() {
            admin::IDENTIFY => self.identify(id, sqe),
            admin::GET_LOG_PAGE => self.get_log_page(id, sqe),
            admin::GET_FEATURES | admin::SET_FEATURES => self.features(id, sqe),
            admin::KEEP_ALIVE => done(cid, StatusCode::SUCCESS),
            admin::ASYNC_EVENT_REQUEST => {
                let c = self
                    .controllers
                    .get_mut(&id)
                    .expect("looked up by the caller");
                if c.aers.len() >= MAX_AERS {
                    return done(cid, StatusCode::AER_LIMIT_EXCEEDED);
                }
                c.aers.push_back(cid);
                Outcome::Held
            }
            // Nothing is ever aborted: DW0 bit 0 says the command was not.
            admin::ABORT if !discovery => ok_dw0(cid, 1),
            _ => done(cid, StatusCode::INVALID_OPCODE),
        }
    }

    fn identify(&self, id: u16, sqe: &Sqe) -> Outcome {
        let cid = sqe.cid();
        let c = &self.controllers[&id];
        let cns = sqe.cdw(10) as u8;
        let nsid = sqe.nsid();
        let Some(ix) = c.subsystem else {
            return match cns {
                admin::CNS_CONTROLLER => ok_data(cid, self.identify_controller(id, None)),
                _ => done(cid, StatusCode::INVALID_FIELD),
            };
        };
        let s = &self.subsystems[ix];
        match cns {
            admin::CNS_CONTROLLER => ok_data(cid, self.identify_controller(id, Some(s))),
            admin::CNS_NAMESPACE if nsid == 0 || nsid == 0xFFFF_FFFF => {
                done(cid, StatusCode::INVALID_NAMESPACE)
            }
            admin::CNS_NAMESPACE => match s.namespaces.get(&nsid) {
                Some(ns) => ok_data(cid, identify_namespace(ns)),
                // An inactive NSID: a zero-filled structure.
                None => ok_data(cid, vec![0; identify::IDENTIFY_LEN]),
            },
            admin::CNS_ACTIVE_NSIDS if nsid >= 0xFFFF_FFFE => {
                done(cid, StatusCode::INVALID_NAMESPACE)
            }
            admin::CNS_ACTIVE_NSIDS => ok_data(
                cid,
                identify::active_ns_list(s.namespaces.keys().copied(), nsid),
            ),
            // The NVM command set's own Identify Controller: all zeroes, no further limits.
            CNS_CSI_CONTROLLER if sqe.cdw(11) >> 24 == CSI_NVM => {
                ok_data(cid, vec![0; identify::IDENTIFY_LEN])
            }
            admin::CNS_NS_DESCRIPTORS => match s.namespaces.get(&nsid) {
                Some(ns) => {
                    let (e, g) = (eui64(ns.naa()), nguid(ns.naa()));
                    ok_data(
                        cid,
                        identify::ns_descriptors(&[
                            (identify::NIDT_EUI64, &e),
                            (identify::NIDT_NGUID, &g),
                            (identify::NIDT_CSI, &[0]),
                        ]),
                    )
                }
                None => done(cid, StatusCode::INVALID_NAMESPACE),
            },
            _ => done(cid, StatusCode::INVALID_FIELD),
        }
    }

    fn identify_controller(&self, id: u16, s: Option<&Subsystem>) -> Vec<u8> {
        let l = &self.limits;
        let mdts = (l.max_transfer / 4096).max(1).ilog2() as u8;
        let common = IdentifyController {
            vid: 0,
            mn: "ironsan".into(),
            fr: env!("CARGO_PKG_VERSION").into(),
            mdts,
            cntlid: id,
            ver: identify::VERSION_1_3,
            acl: 3,
            aerl: (MAX_AERS - 1) as u8,
            lpa: 1 << 2,
            kas: KAS,
            maxcmd: l.queue_depth,
            sgls: identify::SGLS_SUPPORTED | identify::SGLS_OFFSET,
            ioccsz: (64 + l.in_capsule) / 16,
            iorcsz: 1,
            msdbd: 1,
            ..Default::default()
        };
        let c = match s {
            Some(s) => IdentifyController {
                sn: s.serial.clone(),
                oaes: identify::OAES_NS_ATTRIBUTE,
                cntrltype: identify::cntrltype::IO,
                nn: MAX_NSID,
                oncs: identify::ONCS_COMPARE | identify::ONCS_DSM | identify::ONCS_WRITE_ZEROES,
                vwc: 1,
                subnqn: s.nqn.clone(),
                ..common
            },
            None => IdentifyController {
                sn: "discovery".into(),
                cntrltype: identify::cntrltype::DISCOVERY,
                subnqn: DISCOVERY_NQN.into(),
                ..common
            },
        };
        c.to_bytes()
    }

    fn get_log_page(&mut self, id: u16, sqe: &Sqe) -> Outcome {
        let cid = sqe.cid();
        let g = GetLogPage::parse(sqe);
        let discovery = self.controllers[&id].subsystem.is_none();
        let page = match (g.lid, discovery) {
            (log::LID_DISCOVERY, true) => self.discovery_page(id),
            (log::LID_ERROR, _) => vec![0; log::ERROR_ENTRY_LEN],
            (log::LID_SMART, false) => self.controllers[&id].smart.to_bytes(),
            (log::LID_CHANGED_NS, false) => {
                let c = self
                    .controllers
                    .get_mut(&id)
                    .expect("looked up by the caller");
                let list: Vec<u32> = c.changed.iter().copied().collect();
                if !g.rae {
                    c.changed.clear();
                    c.notice_masked = false;
                }
                log::changed_ns_list(&list)
            }
            _ => return done(cid, StatusCode::INVALID_LOG_PAGE),
        };
        if g.offset > page.len() as u64 || !g.offset.is_multiple_of(4) {
            return done(cid, StatusCode::INVALID_FIELD);
        }
        let from = g.offset as usize;
        let to = (from as u64 + g.len).min(page.len() as u64) as usize;
        ok_data(cid, page[from..to].to_vec())
    }

    /// One entry per subsystem the host may connect to and per port it is served on.
    fn discovery_page(&self, id: u16) -> Vec<u8> {
        let host = &self.controllers[&id].hostnqn;
        let mut ports: Vec<SocketAddr> = self
            .subsystems
            .iter()
            .flat_map(|s| s.ports.iter().copied())
            .collect();
        ports.sort();
        ports.dedup();
        let mut entries = Vec::new();
        for s in self.subsystems.iter().filter(|s| s.allows(host)) {
            for p in &s.ports {
                let portid = ports.iter().position(|x| x == p).unwrap_or(0) as u16 + 1;
                entries.push(DiscoveryEntry {
                    trtype: log::TRTYPE_TCP,
                    adrfam: if p.is_ipv4() {
                        log::ADRFAM_IPV4
                    } else {
                        log::ADRFAM_IPV6
                    },
                    subtype: log::SUBTYPE_NVME,
                    treq: log::TREQ_NOT_REQUIRED,
                    portid,
                    cntlid: fabrics::CNTLID_DYNAMIC,
                    asqsz: ASQSZ,
                    trsvcid: p.port().to_string(),
                    subnqn: s.nqn.clone(),
                    traddr: p.ip().to_string(),
                });
            }
        }
        log::discovery_page(0, &entries)
    }

    fn features(&mut self, id: u16, sqe: &Sqe) -> Outcome {
        let cid = sqe.cid();
        let set = sqe.opcode() == admin::SET_FEATURES;
        let fid = sqe.cdw(10) as u8;
        let cdw11 = sqe.cdw(11);
        if set && sqe.cdw(10) & (1 << 31) != 0 {
            return done(cid, StatusCode::FEATURE_NOT_SAVEABLE);
        }
        let max_q = self.limits.max_io_queues;
        let c = self
            .controllers
            .get_mut(&id)
            .expect("looked up by the caller");
        let io = c.subsystem.is_some();
        match fid {
            admin::FEAT_NUMBER_OF_QUEUES if io => {
                if set {
                    if cdw11 & 0xFFFF == 0xFFFF || cdw11 >> 16 == 0xFFFF {
                        return done(cid, StatusCode::INVALID_FIELD);
                    }
                    let asked = (cdw11 & 0xFFFF).max(cdw11 >> 16) as u16 + 1;
                    c.io_queues_granted = asked.min(max_q);
                }
                let n = u32::from(c.io_queues_granted - 1);
                ok_dw0(cid, n | (n << 16))
            }
            admin::FEAT_ASYNC_EVENT_CONFIG => {
                if set {
                    c.aec = cdw11;
                }
                ok_dw0(cid, c.aec)
            }
            admin::FEAT_KEEP_ALIVE_TIMER => {
                if set {
                    c.kato = Duration::from_millis(u64::from(cdw11));
                }
                ok_dw0(cid, c.kato.as_millis() as u32)
            }
            // The backend's page cache is a volatile write cache, always on.
            admin::FEAT_VOLATILE_WRITE_CACHE if io => {
                if set && cdw11 & 1 == 0 {
                    return done(cid, StatusCode::FEATURE_NOT_CHANGEABLE);
                }
                ok_dw0(cid, 1)
            }
            _ => done(cid, StatusCode::INVALID_FIELD),
        }
    }

    fn nvm(&mut self, id: u16, sqe: &Sqe, data: &Bytes) -> Outcome {
        let cid = sqe.cid();
        let c = self
            .controllers
            .get_mut(&id)
            .expect("looked up by the caller");
        let Some(ix) = c.subsystem else {
            return done(cid, StatusCode::INVALID_OPCODE);
        };
        if !io::is_io_opcode(sqe.opcode()) {
            return done(cid, StatusCode::INVALID_OPCODE);
        }
        let s = &self.subsystems[ix];
        let nsid = sqe.nsid();
        let ns = if sqe.opcode() == nvme_tcp::sqe::nvm::FLUSH && nsid == 0xFFFF_FFFF {
            s.namespaces.values().next()
        } else {
            s.namespaces.get(&nsid)
        };
        let Some(ns) = ns else {
            return done(cid, StatusCode::INVALID_NAMESPACE);
        };
        match io::prepare(ns, sqe, data) {
            Ok(kind) => {
                count(&mut c.smart, &kind);
                Outcome::Io(IoOp {
                    backend: ns.backend(),
                    kind,
                })
            }
            Err(code) => done(cid, code),
        }
    }
}

/// Counts a command into the SMART page (data units of 1000 × 512 bytes).
fn count(s: &mut Smart, kind: &IoKind) {
    match kind {
        IoKind::Read { len, .. } => {
            s.host_reads += 1;
            s.data_units_read += (*len as u64).div_ceil(512_000);
        }
        IoKind::Write { data, .. } => {
            s.host_writes += 1;
            s.data_units_written += (data.len() as u64).div_ceil(512_000);
        }
        _ => {}
    }
}

fn identify_namespace(ns: &scsi::LunExport) -> Vec<u8> {
    let blocks = ns.num_blocks();
    IdentifyNamespace {
        nsze: blocks,
        ncap: blocks,
        nuse: blocks,
        nsfeat: if ns.thin() { identify::NSFEAT_THIN } else { 0 },
        nmic: 1,
        dlfeat: if ns.thin() {
            identify::DLFEAT_ZEROES
        } else {
            0
        },
        nsattr: if ns.write_protected() {
            identify::NSATTR_WRITE_PROTECTED
        } else {
            0
        },
        nguid: nguid(ns.naa()),
        eui64: eui64(ns.naa()),
        lbads: ns.block_size().trailing_zeros() as u8,
    }
    .to_bytes()
}
