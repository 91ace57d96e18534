//! Persistent reservations (SPC-4 5.13): registrations per initiator port, one
//! reservation per LU, the access rules per reservation type, and the PERSISTENT
//! RESERVE IN/OUT service actions as pure state transitions.

use std::sync::Arc;

use bytes::Bytes;

use crate::cdb::{be16, be32, be64, op};
use crate::outcome::Fail;
use crate::sense::{asc, Sense};
use crate::status;

pub(crate) const WRITE_EXCLUSIVE: u8 = 1;
pub(crate) const EXCLUSIVE_ACCESS: u8 = 3;
pub(crate) const WE_REGISTRANTS_ONLY: u8 = 5;
pub(crate) const EA_REGISTRANTS_ONLY: u8 = 6;
pub(crate) const WE_ALL_REGISTRANTS: u8 = 7;
pub(crate) const EA_ALL_REGISTRANTS: u8 = 8;

/// One registration: an I_T nexus (initiator port `port` through relative target port
/// `rtp`) and its key; with `all_tg_pt` it stands for that initiator port through every
/// target port (SPC-4 5.13.7.2), as one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registration {
    pub port: Arc<str>,
    pub rtp: u16,
    pub all_tg_pt: bool,
    pub key: u64,
    pub transport_id: Bytes,
}

impl Registration {
    /// Whether this registration is the one of the I_T nexus `(port, rtp)`.
    pub fn covers(&self, port: &str, rtp: u16) -> bool {
        &*self.port == port && (self.all_tg_pt || self.rtp == rtp)
    }

    fn same(&self, other: &Registration) -> bool {
        self.port == other.port && self.rtp == other.rtp && self.all_tg_pt == other.all_tg_pt
    }
}

/// The reservation: its type and the registration that holds it, named by that
/// registration's initiator port and relative target port (so a holder registered with
/// ALL_TG_PT holds it through every target port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub holder: Arc<str>,
    pub holder_rtp: u16,
    pub rtype: u8,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct PrState {
    pub generation: u32,
    pub regs: Vec<Registration>,
    pub reservation: Option<Reservation>,
    /// APTPL as the last REGISTER set it (only where `ptpl_capable`).
    pub aptpl: bool,
    /// The state outlives the gateway (it is kept in a shared record): APTPL is accepted
    /// and REPORT CAPABILITIES says PTPL_C. Not part of the state itself.
    pub ptpl_capable: bool,
}

/// A unit attention owed to the I_T nexuses a registration stood for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    pub port: Arc<str>,
    pub rtp: u16,
    pub all_tg_pt: bool,
    pub code: (u8, u8),
}

impl Notice {
    fn to(g: &Registration, code: (u8, u8)) -> Notice {
        Notice {
            port: g.port.clone(),
            rtp: g.rtp,
            all_tg_pt: g.all_tg_pt,
            code,
        }
    }

    /// Whether the I_T nexus `(port, rtp)` is owed this unit attention.
    pub fn reaches(&self, port: &str, rtp: u16) -> bool {
        &*self.port == port && (self.all_tg_pt || self.rtp == rtp)
    }
}

fn conflict() -> Fail {
    Fail::Status(status::RESERVATION_CONFLICT)
}

fn all_registrants(t: u8) -> bool {
    matches!(t, WE_ALL_REGISTRANTS | EA_ALL_REGISTRANTS)
}

/// Commands that only read the medium (allowed for non-holders under WRITE EXCLUSIVE types).
fn reads_only(cdb: &[u8]) -> bool {
    matches!(
        cdb[0],
        op::READ_6
            | op::READ_10
            | op::READ_12
            | op::READ_16
            | op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::READ_DEFECT_10
            | op::READ_DEFECT_12
            | op::RECEIVE_COPY_RESULTS
            | op::PRE_FETCH_10
            | op::PRE_FETCH_16
    ) || (cdb[0] == op::SERVICE_ACTION_IN_16)
}

/// Commands never blocked by a persistent reservation.
fn exempt(cdb: &[u8]) -> bool {
    matches!(
        cdb[0],
        op::INQUIRY
            | op::REPORT_LUNS
            | op::REQUEST_SENSE
            | op::TEST_UNIT_READY
            | op::READ_CAPACITY_10
            | op::MAINTENANCE_IN
            | op::PR_IN
            | op::PR_OUT
    ) || (cdb[0] == op::SERVICE_ACTION_IN_16
        && cdb.get(1).map(|b| b & 0x1F) == Some(op::SA_READ_CAPACITY_16))
}

impl PrState {
    /// The registration of the I_T nexus `(port, rtp)`.
    fn reg(&self, port: &str, rtp: u16) -> Option<&Registration> {
        self.regs.iter().find(|r| r.covers(port, rtp))
    }

    /// The registration that holds the reservation (for the all-registrants types, the
    /// one that made it, if it is still registered).
    fn holder_reg(&self) -> Option<&Registration> {
        let r = self.reservation.as_ref()?;
        self.regs
            .iter()
            .find(|g| g.port == r.holder && g.rtp == r.holder_rtp)
    }

    fn reg_holds(&self, g: &Registration) -> bool {
        match &self.reservation {
            Some(r) if all_registrants(r.rtype) => true,
            Some(r) => g.port == r.holder && g.rtp == r.holder_rtp,
            None => false,
        }
    }

    fn is_holder(&self, port: &str, rtp: u16) -> bool {
        self.reg(port, rtp).is_some_and(|g| self.reg_holds(g))
    }

    /// Whether `cdb` from the I_T nexus `(port, rtp)` conflicts with the reservation.
    pub fn conflicts(&self, port: &str, rtp: u16, cdb: &[u8]) -> bool {
        let Some(r) = &self.reservation else {
            return false;
        };
        if exempt(cdb) || self.is_holder(port, rtp) {
            return false;
        }
        let registered = self.reg(port, rtp).is_some();
        match r.rtype {
            WRITE_EXCLUSIVE => !reads_only(cdb),
            EXCLUSIVE_ACCESS => true,
            WE_REGISTRANTS_ONLY | WE_ALL_REGISTRANTS => !registered && !reads_only(cdb),
            EA_REGISTRANTS_ONLY | EA_ALL_REGISTRANTS => !registered,
            _ => true,
        }
    }

    /// PERSISTENT RESERVE IN.
    pub fn pr_in(&self, cdb: &[u8]) -> Result<Vec<u8>, Fail> {
        let sa = cdb[1] & 0x1F;
        let mut d = Vec::new();
        d.extend_from_slice(&self.generation.to_be_bytes());
        match sa {
            0 => {
                d.extend_from_slice(&((self.regs.len() * 8) as u32).to_be_bytes());
                for r in &self.regs {
                    d.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            1 => match &self.reservation {
                Some(r) => {
                    d.extend_from_slice(&16u32.to_be_bytes());
                    let key = if all_registrants(r.rtype) {
                        0
                    } else {
                        self.holder_reg().map(|g| g.key).unwrap_or(0)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, r.rtype & 0x0F, 0, 0]);
                }
                None => d.extend_from_slice(&0u32.to_be_bytes()),
            },
            2 => {
                d.clear();
                let mask: u16 = 0x8000 | 0x4000 | 0x2000 | 0x0800 | 0x0200 | 0x0001;
                // CRH, ATP_C, PTPL_C where the state outlives the gateway; TMV, PTPL_A.
                let ptpl_c = u8::from(self.ptpl_capable);
                let ptpl_a = u8::from(self.ptpl_capable && self.aptpl);
                d.extend_from_slice(&[0, 8, 0x10 | 0x04 | ptpl_c, 0x80 | ptpl_a]);
                d.extend_from_slice(&mask.to_be_bytes());
                d.extend_from_slice(&[0, 0]);
            }
            3 => {
                let mut body = Vec::new();
                for r in &self.regs {
                    body.extend_from_slice(&r.key.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    let holder = self.reg_holds(r);
                    body.push(u8::from(r.all_tg_pt) << 1 | u8::from(holder));
                    body.push(if holder {
                        self.reservation.as_ref().map(|x| x.rtype).unwrap_or(0)
                    } else {
                        0
                    });
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&r.rtp.to_be_bytes());
                    body.extend_from_slice(&(r.transport_id.len() as u32).to_be_bytes());
                    body.extend_from_slice(&r.transport_id);
                }
                d.extend_from_slice(&(body.len() as u32).to_be_bytes());
                d.extend_from_slice(&body);
            }
            _ => return Err(Sense::invalid_cdb_field(1, Some(4)).into()),
        }
        Ok(d)
    }

    /// PERSISTENT RESERVE OUT from the I_T nexus of initiator port `port` through relative
    /// target port `rtp`. Returns the unit attentions owed to other nexuses.
    pub fn pr_out(
        &mut self,
        cdb: &[u8],
        data: &[u8],
        port: &Arc<str>,
        rtp: u16,
        transport_id: &Bytes,
    ) -> Result<Vec<Notice>, Fail> {
        let sa = cdb[1] & 0x1F;
        let scope = cdb[2] >> 4;
        let rtype = cdb[2] & 0x0F;
        let param_len = be32(cdb, 5) as usize;
        if sa > 7 {
            return Err(Sense::invalid_cdb_field(1, Some(4)).into());
        }
        if sa == 7 {
            // REGISTER AND MOVE is not supported.
            return Err(Sense::invalid_cdb_field(1, Some(4)).into());
        }
        if param_len != 24 || data.len() < 24 {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let key = be64(data, 0);
        let sa_key = be64(data, 8);
        let flags = data[20];
        if flags & 0x08 != 0 {
            return Err(Sense::invalid_param_field(20, Some(3)).into()); // SPEC_I_PT
        }
        if flags & 0x01 != 0 && !self.ptpl_capable {
            return Err(Sense::invalid_param_field(20, Some(0)).into()); // APTPL: PTPL_C = 0
        }
        let _ = be16(data, 22);
        let mut notices = Vec::new();
        let mine = self.reg(port, rtp).cloned();
        let my_key = mine.as_ref().map(|r| r.key);
        let others = |st: &PrState, code| -> Vec<Notice> {
            st.regs
                .iter()
                .filter(|g| !mine.as_ref().is_some_and(|m| m.same(g)))
                .map(|g| Notice::to(g, code))
                .collect()
        };
        match sa {
            0 | 6 => {
                match &mine {
                    None => {
                        if sa == 0 && key != 0 {
                            return Err(conflict());
                        }
                        if sa_key != 0 {
                            let all_tg_pt = flags & 0x04 != 0;
                            if all_tg_pt && self.regs.iter().any(|g| g.port == *port) {
                                // Its nexuses through other ports are registered already.
                                return Err(conflict());
                            }
                            self.regs.push(Registration {
                                port: port.clone(),
                                rtp,
                                all_tg_pt,
                                key: sa_key,
                                transport_id: transport_id.clone(),
                            });
                        }
                    }
                    Some(m) => {
                        if sa == 0 && key != m.key {
                            return Err(conflict());
                        }
                        if sa_key == 0 {
                            self.unregister(m, &mut notices);
                        } else if let Some(r) = self.regs.iter_mut().find(|r| r.same(m)) {
                            r.key = sa_key;
                        }
                    }
                }
                if sa_key != 0 && self.ptpl_capable {
                    self.aptpl = flags & 0x01 != 0;
                }
                self.generation = self.generation.wrapping_add(1);
            }
            1 => {
                let Some(m) = mine.as_ref().filter(|m| m.key == key) else {
                    return Err(conflict());
                };
                if scope != 0 {
                    return Err(Sense::invalid_cdb_field(2, Some(7)).into());
                }
                if !matches!(rtype, 1 | 3 | 5 | 6 | 7 | 8) {
                    return Err(Sense::invalid_cdb_field(2, Some(3)).into());
                }
                match &self.reservation {
                    Some(r) => {
                        if !(self.is_holder(port, rtp) && r.rtype == rtype) {
                            return Err(conflict());
                        }
                    }
                    None => {
                        self.reservation = Some(Reservation {
                            holder: m.port.clone(),
                            holder_rtp: m.rtp,
                            rtype,
                        })
                    }
                }
            }
            2 => {
                if my_key != Some(key) {
                    return Err(conflict());
                }
                if let Some(r) = self.reservation.clone() {
                    if self.is_holder(port, rtp) {
                        if r.rtype != rtype || scope != 0 {
                            return Err(Sense::illegal((0x26, 0x04)).into()); // invalid release of PR
                        }
                        self.reservation = None;
                        if !matches!(rtype, WRITE_EXCLUSIVE | EXCLUSIVE_ACCESS) {
                            notices = others(self, asc::RESERVATIONS_RELEASED);
                        }
                    }
                }
            }
            3 => {
                if my_key != Some(key) {
                    return Err(conflict());
                }
                notices = others(self, asc::RESERVATIONS_PREEMPTED);
                self.regs.clear();
                self.reservation = None;
                self.generation = self.generation.wrapping_add(1);
            }
            _ => {
                // PREEMPT (4) and PREEMPT AND ABORT (5).
                let Some(m) = mine.as_ref().filter(|m| m.key == key) else {
                    return Err(conflict());
                };
                self.preempt(m, sa_key, rtype, &mut notices)?;
                self.generation = self.generation.wrapping_add(1);
            }
        }
        Ok(notices)
    }

    /// PREEMPT by the registration `mine` of the registrations holding `sa_key` (and of
    /// the reservation, when they hold it).
    fn preempt(
        &mut self,
        mine: &Registration,
        sa_key: u64,
        rtype: u8,
        notices: &mut Vec<Notice>,
    ) -> Result<(), Fail> {
        let res = self.reservation.clone();
        let holder_key = self.holder_reg().map(|g| g.key);
        let preempts_reservation = match &res {
            Some(r) if all_registrants(r.rtype) => sa_key == 0,
            Some(_) => Some(sa_key) == holder_key,
            None => false,
        };
        if preempts_reservation && !matches!(rtype, 1 | 3 | 5 | 6 | 7 | 8) {
            return Err(Sense::invalid_cdb_field(2, Some(3)).into());
        }
        if !preempts_reservation && sa_key == 0 {
            return Err(Sense::invalid_param_field(8, None).into());
        }
        let all = preempts_reservation && res.as_ref().is_some_and(|r| all_registrants(r.rtype));
        let (removed, kept): (Vec<Registration>, Vec<Registration>) = self
            .regs
            .drain(..)
            .partition(|g| !g.same(mine) && (all || g.key == sa_key));
        self.regs = kept;
        if !preempts_reservation && removed.is_empty() {
            return Err(conflict());
        }
        notices.extend(
            removed
                .iter()
                .map(|g| Notice::to(g, asc::REGISTRATIONS_PREEMPTED)),
        );
        if preempts_reservation {
            self.reservation = Some(Reservation {
                holder: mine.port.clone(),
                holder_rtp: mine.rtp,
                rtype,
            });
        }
        Ok(())
    }

    /// Removes the registration `mine`; a reservation it held goes with it (for the
    /// all-registrants types only when it was the last registrant).
    fn unregister(&mut self, mine: &Registration, notices: &mut Vec<Notice>) {
        let was_holder = self.reg_holds(mine);
        self.regs.retain(|r| !r.same(mine));
        if let Some(r) = self.reservation.clone() {
            let release = if all_registrants(r.rtype) {
                self.regs.is_empty()
            } else {
                was_holder
            };
            if release {
                self.reservation = None;
                if matches!(r.rtype, WE_REGISTRANTS_ONLY | EA_REGISTRANTS_ONLY) {
                    for g in &self.regs {
                        notices.push(Notice::to(g, asc::RESERVATIONS_RELEASED));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prout(sa: u8, rtype: u8, key: u64, sa_key: u64) -> ([u8; 10], [u8; 24]) {
        let mut cdb = [0u8; 10];
        cdb[0] = op::PR_OUT;
        cdb[1] = sa;
        cdb[2] = rtype;
        cdb[8] = 24;
        let mut p = [0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        (cdb, p)
    }

    fn run(
        st: &mut PrState,
        port: &Arc<str>,
        sa: u8,
        rtype: u8,
        key: u64,
        sa_key: u64,
    ) -> Result<Vec<Notice>, Fail> {
        let (c, p) = prout(sa, rtype, key, sa_key);
        st.pr_out(&c, &p, port, 1, &Bytes::new())
    }

    #[test]
    fn access_table_per_type() {
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let read = [op::READ_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let write = [op::WRITE_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        // (type, registered b can read, can write, unregistered b can read, can write)
        for (t, rr, rw, ur, uw) in [
            (EXCLUSIVE_ACCESS, false, false, false, false),
            (WRITE_EXCLUSIVE, true, false, true, false),
            (EA_REGISTRANTS_ONLY, true, true, false, false),
            (WE_REGISTRANTS_ONLY, true, true, true, false),
            (EA_ALL_REGISTRANTS, true, true, false, false),
            (WE_ALL_REGISTRANTS, true, true, true, false),
        ] {
            let mut st = PrState::default();
            run(&mut st, &a, 6, 0, 0, 1).unwrap();
            run(&mut st, &b, 6, 0, 0, 2).unwrap();
            run(&mut st, &a, 1, t, 1, 0).unwrap();
            assert!(
                !st.conflicts("a", 1, &read) && !st.conflicts("a", 1, &write),
                "holder, type {t}"
            );
            assert_eq!(
                !st.conflicts("b", 1, &read),
                rr,
                "registered read, type {t}"
            );
            assert_eq!(
                !st.conflicts("b", 1, &write),
                rw,
                "registered write, type {t}"
            );
            run(&mut st, &b, 0, 0, 2, 0).unwrap();
            assert_eq!(
                !st.conflicts("b", 1, &read),
                ur,
                "unregistered read, type {t}"
            );
            assert_eq!(
                !st.conflicts("b", 1, &write),
                uw,
                "unregistered write, type {t}"
            );
        }
    }

    #[test]
    fn register_with_wrong_key_conflicts_and_preempt_removes() {
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let mut st = PrState::default();
        assert_eq!(run(&mut st, &a, 0, 0, 5, 1).unwrap_err(), conflict());
        run(&mut st, &a, 0, 0, 0, 1).unwrap();
        run(&mut st, &b, 0, 0, 0, 2).unwrap();
        assert_eq!(run(&mut st, &a, 0, 0, 9, 3).unwrap_err(), conflict());
        let n = run(&mut st, &a, 4, WRITE_EXCLUSIVE, 1, 2).unwrap();
        assert_eq!(st.regs.len(), 1);
        assert_eq!(n[0].code, asc::REGISTRATIONS_PREEMPTED);
        run(&mut st, &a, 3, 0, 1, 0).unwrap();
        assert!(st.regs.is_empty() && st.reservation.is_none());
        assert_eq!(st.generation, 4);
    }

    #[test]
    fn nexuses_are_initiator_port_and_target_port() {
        let x: Arc<str> = Arc::from("x");
        let write = [op::WRITE_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let mut st = PrState::default();
        // X through port 1 registers and reserves; X through port 2 is another nexus.
        let (c, p) = prout(0, 0, 0, 1);
        st.pr_out(&c, &p, &x, 1, &Bytes::new()).unwrap();
        let (c, p) = prout(1, WRITE_EXCLUSIVE, 1, 0);
        st.pr_out(&c, &p, &x, 1, &Bytes::new()).unwrap();
        assert!(!st.conflicts("x", 1, &write));
        assert!(st.conflicts("x", 2, &write));
        // Registering through port 2 for every port would cover port 1 twice: refused.
        let (c, mut p) = prout(0, 0, 0, 2);
        p[20] = 0x04;
        assert_eq!(
            st.pr_out(&c, &p, &x, 2, &Bytes::new()).unwrap_err(),
            conflict()
        );
        // Registered with ALL_TG_PT, X holds through every port.
        let mut st = PrState::default();
        st.pr_out(&c, &p, &x, 2, &Bytes::new()).unwrap();
        let (c, p) = prout(1, WRITE_EXCLUSIVE, 2, 0);
        st.pr_out(&c, &p, &x, 1, &Bytes::new()).unwrap();
        for port in [1, 2, 7] {
            assert!(!st.conflicts("x", port, &write), "port {port}");
        }
        assert!(st.conflicts("y", 2, &write));
        // Its preemption is owed to X through every port.
        let y: Arc<str> = Arc::from("y");
        let (c, p) = prout(0, 0, 0, 9);
        st.pr_out(&c, &p, &y, 3, &Bytes::new()).unwrap();
        let (c, p) = prout(4, WRITE_EXCLUSIVE, 9, 2);
        let n = st.pr_out(&c, &p, &y, 3, &Bytes::new()).unwrap();
        assert_eq!(n.len(), 1);
        assert!(n[0].reaches("x", 1) && n[0].reaches("x", 5) && !n[0].reaches("y", 3));
        assert!(st.conflicts("x", 2, &write) && !st.conflicts("y", 3, &write));
    }
}
