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

#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub port: Arc<str>,
    pub key: u64,
    pub transport_id: Bytes,
}

#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub holder: Arc<str>,
    pub rtype: u8,
}

#[derive(Debug, Default)]
pub(crate) struct PrState {
    pub generation: u32,
    pub regs: Vec<Registration>,
    pub reservation: Option<Reservation>,
}

/// A unit attention the caller must queue for every nexus of an initiator port.
pub(crate) type Notice = (Arc<str>, (u8, u8));

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
    fn reg(&self, port: &str) -> Option<&Registration> {
        self.regs.iter().find(|r| &*r.port == port)
    }

    fn is_holder(&self, port: &str) -> bool {
        match &self.reservation {
            Some(r) if all_registrants(r.rtype) => self.reg(port).is_some(),
            Some(r) => &*r.holder == port,
            None => false,
        }
    }

    /// Whether `cdb` from initiator port `port` conflicts with the reservation.
    pub fn conflicts(&self, port: &str, cdb: &[u8]) -> bool {
        let Some(r) = &self.reservation else {
            return false;
        };
        if exempt(cdb) || self.is_holder(port) {
            return false;
        }
        let registered = self.reg(port).is_some();
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
                        self.reg(&r.holder).map(|g| g.key).unwrap_or(0)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, r.rtype & 0x0F, 0, 0]);
                }
                None => d.extend_from_slice(&0u32.to_be_bytes()),
            },
            2 => {
                d.clear();
                let mask: u16 = 0x8000 | 0x4000 | 0x2000 | 0x0800 | 0x0200 | 0x0001;
                d.extend_from_slice(&[0, 8, 0x10 | 0x04, 0x80]);
                d.extend_from_slice(&mask.to_be_bytes());
                d.extend_from_slice(&[0, 0]);
            }
            3 => {
                let mut body = Vec::new();
                for r in &self.regs {
                    body.extend_from_slice(&r.key.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    let holder = self.is_holder(&r.port);
                    body.push(if holder { 0x01 } else { 0 });
                    body.push(if holder {
                        self.reservation.as_ref().map(|x| x.rtype).unwrap_or(0)
                    } else {
                        0
                    });
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&1u16.to_be_bytes()); // relative target port 1
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

    /// PERSISTENT RESERVE OUT from initiator port `port`. Returns the unit attentions
    /// to raise for other initiator ports.
    pub fn pr_out(
        &mut self,
        cdb: &[u8],
        data: &[u8],
        port: &Arc<str>,
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
        if flags & 0x01 != 0 {
            return Err(Sense::invalid_param_field(20, Some(0)).into()); // APTPL: PTPL_C = 0
        }
        let _ = be16(data, 22);
        let mut notices = Vec::new();
        let my_key = self.reg(port).map(|r| r.key);
        match sa {
            0 | 6 => {
                match my_key {
                    None => {
                        if sa == 0 && key != 0 {
                            return Err(conflict());
                        }
                        if sa_key != 0 {
                            self.regs.push(Registration {
                                port: port.clone(),
                                key: sa_key,
                                transport_id: transport_id.clone(),
                            });
                        }
                    }
                    Some(k) => {
                        if sa == 0 && key != k {
                            return Err(conflict());
                        }
                        if sa_key == 0 {
                            self.unregister(port, &mut notices);
                        } else if let Some(r) = self.regs.iter_mut().find(|r| &r.port == port) {
                            r.key = sa_key;
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
            }
            1 => {
                if my_key != Some(key) {
                    return Err(conflict());
                }
                if scope != 0 {
                    return Err(Sense::invalid_cdb_field(2, Some(7)).into());
                }
                if !matches!(rtype, 1 | 3 | 5 | 6 | 7 | 8) {
                    return Err(Sense::invalid_cdb_field(2, Some(3)).into());
                }
                match &self.reservation {
                    Some(r) => {
                        if !(self.is_holder(port) && r.rtype == rtype) {
                            return Err(conflict());
                        }
                    }
                    None => {
                        self.reservation = Some(Reservation {
                            holder: port.clone(),
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
                    if self.is_holder(port) {
                        if r.rtype != rtype || scope != 0 {
                            return Err(Sense::illegal((0x26, 0x04)).into()); // invalid release of PR
                        }
                        self.reservation = None;
                        if !matches!(rtype, WRITE_EXCLUSIVE | EXCLUSIVE_ACCESS) {
                            for g in &self.regs {
                                if &g.port != port {
                                    notices.push((g.port.clone(), asc::RESERVATIONS_RELEASED));
                                }
                            }
                        }
                    }
                }
            }
            3 => {
                if my_key != Some(key) {
                    return Err(conflict());
                }
                for g in &self.regs {
                    if &g.port != port {
                        notices.push((g.port.clone(), asc::RESERVATIONS_PREEMPTED));
                    }
                }
                self.regs.clear();
                self.reservation = None;
                self.generation = self.generation.wrapping_add(1);
            }
            _ => {
                // PREEMPT (4) and PREEMPT AND ABORT (5).
                if my_key != Some(key) {
                    return Err(conflict());
                }
                let res = self.reservation.clone();
                let holder_key = res
                    .as_ref()
                    .and_then(|r| self.reg(&r.holder).map(|g| g.key));
                let preempts_reservation = match &res {
                    Some(r) if all_registrants(r.rtype) => sa_key == 0,
                    Some(_) => Some(sa_key) == holder_key,
                    None => false,
                };
                if preempts_reservation {
                    if !matches!(rtype, 1 | 3 | 5 | 6 | 7 | 8) {
                        return Err(Sense::invalid_cdb_field(2, Some(3)).into());
                    }
                    let all = res
                        .as_ref()
                        .map(|r| all_registrants(r.rtype))
                        .unwrap_or(false);
                    let removed: Vec<Arc<str>> = self
                        .regs
                        .iter()
                        .filter(|g| &g.port != port && (all || g.key == sa_key))
                        .map(|g| g.port.clone())
                        .collect();
                    self.regs.retain(|g| !removed.contains(&g.port));
                    for p in removed {
                        notices.push((p, asc::REGISTRATIONS_PREEMPTED));
                    }
                    self.reservation = Some(Reservation {
                        holder: port.clone(),
                        rtype,
                    });
                } else {
                    if sa_key == 0 {
                        return Err(Sense::invalid_param_field(8, None).into());
                    }
                    let removed: Vec<Arc<str>> = self
                        .regs
                        .iter()
                        .filter(|g| g.key == sa_key && &g.port != port)
                        .map(|g| g.port.clone())
                        .collect();
                    if removed.is_empty() {
                        return Err(conflict());
                    }
                    self.regs.retain(|g| !removed.contains(&g.port));
                    for p in removed {
                        notices.push((p, asc::REGISTRATIONS_PREEMPTED));
                    }
                }
                self.generation = self.generation.wrapping_add(1);
            }
        }
        Ok(notices)
    }

    /// Removes `port`'s registration; a reservation it held goes with it (for the
    /// all-registrants types only when it was the last registrant).
    fn unregister(&mut self, port: &Arc<str>, notices: &mut Vec<Notice>) {
        let was_holder = self.is_holder(port);
        self.regs.retain(|r| &r.port != port);
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
                        notices.push((g.port.clone(), asc::RESERVATIONS_RELEASED));
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
        st.pr_out(&c, &p, port, &Bytes::new())
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
                !st.conflicts("a", &read) && !st.conflicts("a", &write),
                "holder, type {t}"
            );
            assert_eq!(!st.conflicts("b", &read), rr, "registered read, type {t}");
            assert_eq!(!st.conflicts("b", &write), rw, "registered write, type {t}");
            run(&mut st, &b, 0, 0, 2, 0).unwrap();
            assert_eq!(!st.conflicts("b", &read), ur, "unregistered read, type {t}");
            assert_eq!(
                !st.conflicts("b", &write),
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
        assert_eq!(n[0].1, asc::REGISTRATIONS_PREEMPTED);
        run(&mut st, &a, 3, 0, 1, 0).unwrap();
        assert!(st.regs.is_empty() && st.reservation.is_none());
        assert_eq!(st.generation, 4);
    }
}
