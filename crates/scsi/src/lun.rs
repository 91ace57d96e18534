//! One logical unit: its backend, mode/reservation/unit-attention state, and the
//! execution pipeline every command goes through (task admission, unit attention,
//! reservation and readiness checks, dispatch, response assembly).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use storage::Backend;

use crate::alua::LunAlua;
use crate::cdb::{allowed_under_reserve6, data_out_len, needs_medium, op};
use crate::command::{
    finish_data_in, finish_error, finish_out, residual, Command, NexusId, NexusInfo, Residual,
    Response,
};
use crate::config::LunConfig;
use crate::outcome::{CmdResult, Fail};
use crate::pr::PrState;
use crate::pr_shared::SharedPr;
use crate::sense::{asc, key, Sense};
use crate::stats::LunStats;
use crate::status;
use crate::tasks::{RangeLock, TaskSet};

/// What a LUN's commands ask of the device that holds it: the other LUNs (REPORT LUNS,
/// EXTENDED COPY) and the known nexuses (PERSISTENT RESERVE OUT). `Device` implements it;
/// a trait here so that LUN code does not depend on the device above it.
pub(crate) trait DeviceView: Sync {
    /// Configured LUN numbers (block and object), ascending.
    fn luns(&self) -> Vec<u64>;
    /// Every registered nexus with its initiator port name.
    fn known_nexus_ports(&self) -> Vec<(NexusId, Arc<str>)>;
    /// The LUN whose NAA designator (VPD page 0x83) is `naa`.
    fn lun_by_naa(&self, naa: &[u8]) -> Option<Arc<Lun>>;
    /// The device's relative target port identifier (its nexuses' target port).
    fn relative_port(&self) -> u16;
}

/// Result of an EXTENDED COPY kept for RECEIVE COPY RESULTS.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CopyResult {
    pub segments_processed: u16,
    pub failed: bool,
    /// Bytes written to copy destinations.
    pub transfer_count: u64,
}

/// Mutable LUN state, behind one short-held mutex (never held across an await).
#[derive(Default)]
pub(crate) struct LunState {
    pub ua: HashMap<NexusId, VecDeque<(u8, u8)>>,
    pub reserve6: Option<NexusId>,
    pub pr: PrState,
    pub prevent: HashSet<NexusId>,
    pub ejected: bool,
    pub sanitizing: bool,
    pub copies: HashMap<(NexusId, u8), CopyResult>,
}

pub(crate) struct Lun {
    pub id: u64,
    pub cfg: LunConfig,
    pub backend: Arc<dyn Backend>,
    pub block_size: u32,
    pub bs_shift: u32,
    num_blocks: AtomicU64,
    /// The backend's size when last looked at, to notice a backend resized from outside
    /// ([`Lun::follow_backend_size`]).
    seen_size: AtomicU64,
    pub naa: Vec<u8>,
    pub serial: String,
    pub target_name: String,
    pub thin: bool,
    pub tasks: TaskSet,
    pub ranges: Arc<RangeLock>,
    state: Mutex<LunState>,
    /// False while nothing unusual is pending (no UA, reservation, eject, sanitize): lets
    /// the READ/WRITE path skip the state lock.
    needs_checks: AtomicBool,
    pub d_sense: AtomicBool,
    /// The LUN is read-only: its configured `read_only`, or as set while it runs
    /// ([`crate::Device::set_read_only`]).
    read_only: AtomicBool,
    pub swp: AtomicBool,
    pub wce: AtomicBool,
    /// Commands, bytes and latency by direction, for an exporter.
    pub stats: LunStats,
    /// Backend failures as one log line per episode.
    pub faults: crate::fault_log::FaultLog,
    /// The shared record the persistent reservations live in (`state().pr` is then its
    /// cached copy), when the LUN has one.
    pub shared_pr: Option<SharedPr>,
    /// This gateway's ALUA state for the LUN, with `[gateway]`.
    pub alua: Option<LunAlua>,
    /// The ALUA state changes already announced to every nexus (unit attention).
    alua_announced: AtomicU64,
}

/// Commands that neither report nor clear a unit attention (SPC-4 5.14: INQUIRY,
/// REPORT LUNS, REQUEST SENSE).
pub(crate) fn ua_exempt(op: u8) -> bool {
    matches!(op, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE)
}

impl Lun {
    pub fn new(
        id: u64,
        cfg: LunConfig,
        backend: Arc<dyn Backend>,
        naa: Vec<u8>,
        serial: String,
        target: &str,
        alua: Option<LunAlua>,
    ) -> Lun {
        let block_size = cfg.block_size;
        let num_blocks = backend.size() / block_size as u64;
        let thin = cfg.thin_provisioning && backend.supports_punch() && !cfg.read_only;
        Lun {
            id,
            block_size,
            bs_shift: block_size.trailing_zeros(),
            num_blocks: AtomicU64::new(num_blocks),
            seen_size: AtomicU64::new(backend.size()),
            naa,
            serial,
            target_name: target.to_string(),
            thin,
            tasks: TaskSet::default(),
            ranges: Arc::default(),
            state: Mutex::new(LunState::default()),
            needs_checks: AtomicBool::new(false),
            d_sense: AtomicBool::new(false),
            read_only: AtomicBool::new(cfg.read_only),
            swp: AtomicBool::new(false),
            wce: AtomicBool::new(true),
            stats: LunStats::default(),
            faults: Default::default(),
            shared_pr: None,
            alua_announced: AtomicU64::new(alua.as_ref().map_or(0, LunAlua::changes)),
            alua,
            backend,
            cfg,
        }
    }

    /// Keeps the persistent reservations in `shared`, starting from `pr` as read from it.
    pub fn with_shared_pr(mut self, shared: SharedPr, pr: PrState) -> Lun {
        self.shared_pr = Some(shared);
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        st.pr = PrState {
            ptpl_capable: true,
            ..pr
        };
        let busy = st.pr.reservation.is_some();
        self.needs_checks.store(busy, Ordering::Release);
        self
    }

    pub fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire)
    }

    pub fn state(&self) -> MutexGuard<'_, LunState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Recomputes the fast-path flag; call after changing LunState.
    pub fn refresh(&self, st: &LunState) {
        let busy = st.ua.values().any(|q| !q.is_empty())
            || st.reserve6.is_some()
            || st.pr.reservation.is_some()
            || st.ejected
            || st.sanitizing;
        self.needs_checks.store(busy, Ordering::Release);
    }

    /// Queues a unit attention for each nexus in `nexuses` (skipping `except`).
    pub fn raise_ua(
        &self,
        st: &mut LunState,
        nexuses: &[NexusId],
        except: Option<NexusId>,
        code: (u8, u8),
    ) {
        for &n in nexuses {
            if Some(n) == except {
                continue;
            }
            let q = st.ua.entry(n).or_default();
            if !q.contains(&code) && q.len() < 16 {
                q.push_back(code);
            }
        }
    }

    /// Queues the unit attention `code` for `nexus` alone.
    pub fn queue_ua(&self, nexus: NexusId, code: (u8, u8)) {
        let mut st = self.state();
        self.raise_ua(&mut st, &[nexus], None, code);
        self.refresh(&st);
    }

    /// Drops the unit attention `code` from what is pending for `nexus`.
    pub fn drop_ua(&self, nexus: NexusId, code: (u8, u8)) {
        if !self.needs_checks.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.state();
        if let Some(q) = st.ua.get_mut(&nexus) {
            q.retain(|c| *c != code);
        }
        self.refresh(&st);
    }

    pub fn set_num_blocks(&self, blocks: u64, nexuses: &[NexusId]) {
        self.num_blocks.store(blocks, Ordering::Release);
        let mut st = self.state();
        self.raise_ua(&mut st, nexuses, None, asc::CAPACITY_DATA_CHANGED);
        self.refresh(&st);
    }

    pub fn nexus_lost(&self, nexus: NexusId) {
        let mut st = self.state();
        if st.reserve6 == Some(nexus) {
            st.reserve6 = None;
        }
        st.prevent.remove(&nexus);
        st.ua.remove(&nexus);
        st.copies.retain(|(n, _), _| *n != nexus);
        self.refresh(&st);
    }

    /// Aborts every task in the task set (waiting, bounded, until they left) and revokes
    /// the ranges ended reads hold while their data is sent; returns how many tasks.
    pub async fn abort_all(&self) -> usize {
        self.abort_where(|_, _| true).await
    }

    /// Aborts the tasks whose (nexus, tag) `pred` picks (waiting, bounded, until they
    /// left) and revokes the ranges such tasks' ended reads hold while their data is sent:
    /// an aborted read must not keep other tasks off its blocks. Returns how many tasks.
    pub async fn abort_where(&self, pred: impl Fn(NexusId, u64) -> bool) -> usize {
        let aborted = self.tasks.abort_where(|t| pred(t.nexus, t.tag)).await;
        self.ranges.revoke_sending(pred);
        aborted
    }

    /// LU reset side effects (tasks are aborted by the caller).
    pub fn reset(&self, nexuses: &[NexusId]) {
        let mut st = self.state();
        st.reserve6 = None;
        st.prevent.clear();
        st.ua.clear();
        self.raise_ua(&mut st, nexuses, None, asc::POWER_ON_RESET);
        self.refresh(&st);
    }

    pub fn sense_bytes(&self, s: &Sense) -> Bytes {
        s.encode(self.d_sense.load(Ordering::Relaxed))
    }

    pub fn write_protected(&self) -> bool {
        self.read_only() || self.swp.load(Ordering::Relaxed)
    }

    /// Whether the LUN is read-only (hardware write protection: DATA PROTECT, WRITE
    /// PROTECTED), as configured or as set since.
    pub fn read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    /// Takes the backend's size now (after [`Backend::resize`]) as the LUN's; every nexus in
    /// `nexuses` hears CAPACITY DATA HAS CHANGED.
    pub(crate) fn take_backend_size(&self, nexuses: &[NexusId]) {
        let now = self.backend.size();
        self.seen_size.store(now, Ordering::Release);
        self.set_num_blocks(now >> self.bs_shift, nexuses);
    }

    /// The pipeline: task admission, pre-checks, dispatch, response assembly.
    pub async fn execute(
        &self,
        dev: &dyn DeviceView,
        cmd: Command,
        info: Option<NexusInfo>,
    ) -> Response {
        let Some(&opcode) = cmd.cdb.first() else {
            let s = Sense::illegal(asc::INVALID_OPCODE);
            return finish_error(&cmd, status::CHECK_CONDITION, Some(self.sense_bytes(&s)));
        };
        if let Some(read_len) = cmd.bidi_read_len {
            // This device has no bidirectional commands (SBC's only one, XDWRITEREAD, is
            // not offered): the answer an unsupported command gets.
            let s = Sense::illegal(asc::INVALID_OPCODE);
            let mut r = finish_error(&cmd, status::CHECK_CONDITION, Some(self.sense_bytes(&s)));
            r.bidi_read_residual = Some(Residual::Underflow(read_len));
            return r;
        }
        // Not while the backend has not reached its storage: the record lives there too, and
        // the command is answered NOT READY below.
        if self.shared_pr.as_ref().is_some_and(|s| s.due()) && self.backend.ready() {
            self.refresh_shared(dev).await;
        }
        let guard = self.tasks.enter(cmd.nexus, cmd.tag, cmd.attr).await;
        if guard.aborted() {
            return Response::aborted();
        }
        self.announce_alua(dev);
        let result = match self.pre_checks(opcode, &cmd, info.as_ref()) {
            Some(fail) => Err(fail),
            None => {
                self.dispatch_admitted(dev, &cmd, info.as_ref(), &guard)
                    .await
            }
        };
        if guard.aborted() {
            return Response::aborted();
        }
        drop(guard);
        match result {
            Ok(done) => match data_out_len(&cmd.cdb, self.block_size) {
                Some(out_len) if done.data.is_empty() => finish_out(&cmd, out_len, done.status),
                _ => {
                    let mut r = finish_data_in(&cmd, done.data.clone(), done.status);
                    // The note describes the data as read; any cut makes it stale.
                    if r.data_in.len() == done.data.len() {
                        r.data_in_note = done.note;
                    }
                    r
                }
            },
            Err(Fail::Check(s)) => {
                let mut r = finish_error(&cmd, status::CHECK_CONDITION, Some(self.sense_bytes(&s)));
                if let Some(out_len) = data_out_len(&cmd.cdb, self.block_size) {
                    r.residual = residual(out_len, cmd.expected_len as u64);
                }
                r
            }
            Err(Fail::Status(st)) => {
                let mut r = finish_error(&cmd, st, None);
                if let Some(out_len) = data_out_len(&cmd.cdb, self.block_size) {
                    r.residual = residual(out_len, cmd.expected_len as u64);
                }
                r
            }
        }
    }

    /// Dispatches a command this gateway's ALUA state admits (all of them without
    /// `[gateway]`); a write that failed on the medium makes the watcher check ownership.
    async fn dispatch_admitted(
        &self,
        dev: &dyn DeviceView,
        cmd: &Command,
        info: Option<&NexusInfo>,
        guard: &crate::tasks::TaskGuard<'_>,
    ) -> CmdResult {
        let Some(alua) = &self.alua else {
            return self.dispatch(dev, cmd, info, guard).await;
        };
        let admitted = alua.admit(cmd.cdb[0]).await?;
        let result = self.dispatch(dev, cmd, info, guard).await;
        if let Err(Fail::Check(s)) = &result {
            let medium = matches!(s.key, key::MEDIUM_ERROR | key::HARDWARE_ERROR);
            if medium && crate::alua::writes_medium(cmd.cdb[0]) {
                alua.poke();
            }
        }
        drop(admitted);
        result
    }

    /// Queues ASYMMETRIC ACCESS STATE CHANGED for every nexus once per change of this
    /// gateway's ALUA state for the LUN (noticed by the next command to it).
    fn announce_alua(&self, dev: &dyn DeviceView) {
        let Some(alua) = &self.alua else { return };
        let now = alua.changes();
        if self.alua_announced.load(Ordering::Acquire) == now
            || self.alua_announced.swap(now, Ordering::AcqRel) == now
        {
            return;
        }
        let nexuses: Vec<NexusId> = dev
            .known_nexus_ports()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let mut st = self.state();
        self.raise_ua(
            &mut st,
            &nexuses,
            None,
            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
        );
        self.refresh(&st);
    }

    /// Unit attention, sanitize, reservation and medium checks. `None` = go ahead.
    fn pre_checks(&self, opcode: u8, cmd: &Command, info: Option<&NexusInfo>) -> Option<Fail> {
        if self.needs_checks.load(Ordering::Acquire) {
            let mut st = self.state();
            if !ua_exempt(opcode) {
                if let Some(q) = st.ua.get_mut(&cmd.nexus) {
                    if let Some(code) = q.pop_front() {
                        self.refresh(&st);
                        return Some(Fail::Check(Sense::new(key::UNIT_ATTENTION, code)));
                    }
                }
            }
            if let Some(fail) = access_check(&st, &cmd.cdb, cmd.nexus, info) {
                return Some(fail);
            }
        }
        self.backend_not_ready(opcode)
    }

    /// NOT READY, becoming ready, for a command that needs the medium while the backend has
    /// not reached its storage yet (an RBD cluster unreachable at start), as a spinning-up
    /// disk answers.
    fn backend_not_ready(&self, opcode: u8) -> Option<Fail> {
        (needs_medium(opcode) && !self.backend.ready())
            .then(|| Fail::Check(Sense::new(key::NOT_READY, asc::NOT_READY_BECOMING_READY)))
    }

    /// Follows a backend whose size changes by itself (an RBD image resized in the
    /// cluster): the LUN takes the new size and every nexus (`nexuses`, asked only then)
    /// hears CAPACITY DATA HAS CHANGED.
    pub(crate) fn follow_backend_size(&self, nexuses: impl FnOnce() -> Vec<NexusId>) {
        let now = self.backend.size();
        if self.seen_size.load(Ordering::Acquire) != now
            && self.seen_size.swap(now, Ordering::AcqRel) != now
        {
            let blocks = now >> self.bs_shift;
            if blocks != 0 {
                self.set_num_blocks(blocks, &nexuses());
            }
        }
    }

    /// The checks a READ(16) (`write` false) or WRITE(16) by `nexus` would meet here
    /// (sanitize, RESERVE(6), persistent reservation, medium, a backend not ready; unit attentions aside, as
    /// they are this LUN's news for that nexus, not the copy's), for EXTENDED COPY,
    /// whose copy manager reads and writes this LUN on the nexus's behalf.
    pub(crate) fn copy_access_check(
        &self,
        nexus: NexusId,
        info: Option<&NexusInfo>,
        write: bool,
    ) -> Option<Fail> {
        let opcode = if write { op::WRITE_16 } else { op::READ_16 };
        if let Some(fail) = self.alua.as_ref().and_then(|a| a.copy_check(write)) {
            return Some(fail);
        }
        if self.needs_checks.load(Ordering::Acquire) {
            let mut as_if = [0u8; 16];
            as_if[0] = opcode;
            if let Some(fail) = access_check(&self.state(), &as_if, nexus, info) {
                return Some(fail);
            }
        }
        self.backend_not_ready(opcode)
    }

    /// Pops the pending unit attention for REQUEST SENSE.
    pub fn take_ua(&self, nexus: NexusId) -> Option<(u8, u8)> {
        let mut st = self.state();
        let code = st.ua.get_mut(&nexus).and_then(|q| q.pop_front());
        self.refresh(&st);
        code
    }
}

/// Sanitize, RESERVE(6), persistent reservation and medium checks of `cdb` from `nexus`
/// against the LUN state `st`. `None` = go ahead.
fn access_check(
    st: &LunState,
    cdb: &[u8],
    nexus: NexusId,
    info: Option<&NexusInfo>,
) -> Option<Fail> {
    let opcode = cdb[0];
    if st.sanitizing && !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
        return Some(Fail::Check(Sense::new(
            key::NOT_READY,
            asc::NOT_READY_SANITIZE,
        )));
    }
    if let Some(holder) = st.reserve6 {
        if holder != nexus && !allowed_under_reserve6(opcode) {
            return Some(Fail::Status(status::RESERVATION_CONFLICT));
        }
    }
    if st.pr.reservation.is_some() {
        let (port, rtp) = info.map(|i| (&*i.port, i.rel_port)).unwrap_or(("", 1));
        if st.pr.conflicts(port, rtp, cdb) {
            return Some(Fail::Status(status::RESERVATION_CONFLICT));
        }
    }
    if st.ejected && needs_medium(opcode) {
        return Some(Fail::Check(Sense::new(
            key::NOT_READY,
            asc::MEDIUM_NOT_PRESENT_TRAY_OPEN,
        )));
    }
    None
}
