//! MODE SENSE(6/10) and MODE SELECT(6/10) over the pages the engine implements:
//! read-write error recovery (0x01), caching (0x08), control (0x0A) and informational
//! exceptions (0x1C).

use std::sync::atomic::Ordering;

use crate::cdb::{be16, byte, op};
use crate::command::Command;
use crate::lun::Lun;
use crate::outcome::{CmdResult, Done};
use crate::sense::{asc, Sense};

const PAGES: [u8; 4] = [0x01, 0x08, 0x0A, 0x1C];

/// Page control field of MODE SENSE.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pc {
    Current,
    Changeable,
    Default,
}

impl Lun {
    fn mode_page(&self, code: u8, pc: Pc) -> Vec<u8> {
        let (d_sense, swp, wce) = match pc {
            Pc::Current => (
                self.d_sense.load(Ordering::Relaxed),
                self.swp.load(Ordering::Relaxed),
                self.wce.load(Ordering::Relaxed),
            ),
            Pc::Changeable => (true, true, true),
            Pc::Default => (false, false, true),
        };
        let changeable = pc == Pc::Changeable;
        match code {
            0x01 => {
                let mut p = vec![0u8; 12];
                p[0] = 0x01;
                p[1] = 0x0A;
                p
            }
            0x08 => {
                let mut p = vec![0u8; 20];
                p[0] = 0x08;
                p[1] = 0x12;
                if wce {
                    p[2] |= 0x04;
                }
                p
            }
            0x0A => {
                let mut p = vec![0u8; 12];
                p[0] = 0x0A;
                p[1] = 0x0A;
                if d_sense {
                    p[2] |= 0x04;
                }
                if !changeable {
                    p[3] = 0x10; // queue algorithm modifier 1: unrestricted reordering
                    p[5] = 0x40; // TAS
                    p[8..10].copy_from_slice(&0xFFFFu16.to_be_bytes()); // busy timeout: unlimited
                }
                if swp {
                    p[4] |= 0x08;
                }
                p
            }
            _ => {
                let mut p = vec![0u8; 12];
                p[0] = 0x1C;
                p[1] = 0x0A;
                p
            }
        }
    }

    pub(crate) fn mode_sense(&self, cdb: &[u8]) -> CmdResult {
        let ten = cdb[0] == op::MODE_SENSE_10;
        let dbd = cdb[1] & 0x08 != 0;
        let llbaa = ten && cdb[1] & 0x10 != 0;
        let pc = match cdb[2] >> 6 {
            0 => Pc::Current,
            1 => Pc::Changeable,
            2 => Pc::Default,
            _ => return Err(Sense::illegal(asc::SAVING_PARAMETERS_NOT_SUPPORTED).into()),
        };
        let page = cdb[2] & 0x3F;
        let subpage = cdb[3];
        let alloc = if ten {
            be16(cdb, 7) as usize
        } else {
            byte(cdb, 4) as usize
        };
        let mut pages = Vec::new();
        match (page, subpage) {
            (0x3F, 0x00) | (0x3F, 0xFF) => {
                for p in PAGES {
                    pages.extend_from_slice(&self.mode_page(p, pc));
                }
            }
            (p, 0x00) if PAGES.contains(&p) => pages = self.mode_page(p, pc),
            (p, _) if PAGES.contains(&p) || p == 0x3F => {
                return Err(Sense::invalid_cdb_field(3, None).into())
            }
            _ => return Err(Sense::invalid_cdb_field(2, Some(5)).into()),
        }
        let mut dev_specific = 0x10; // DPOFUA
        if self.write_protected() {
            dev_specific |= 0x80;
        }
        let mut bd = Vec::new();
        if !dbd {
            let blocks = self.num_blocks();
            if llbaa {
                bd.extend_from_slice(&blocks.to_be_bytes());
                bd.extend_from_slice(&[0; 4]);
                bd.extend_from_slice(&self.block_size.to_be_bytes());
            } else {
                bd.extend_from_slice(&(blocks.min(0xFFFF_FFFF) as u32).to_be_bytes());
                bd.push(0);
                bd.extend_from_slice(&self.block_size.to_be_bytes()[1..]);
            }
        }
        let mut d = Vec::new();
        if ten {
            let len = (6 + bd.len() + pages.len()) as u16;
            d.extend_from_slice(&len.to_be_bytes());
            d.extend_from_slice(&[0, dev_specific, if llbaa { 1 } else { 0 }, 0]);
            d.extend_from_slice(&(bd.len() as u16).to_be_bytes());
        } else {
            let len = (3 + bd.len() + pages.len()).min(255) as u8;
            d.extend_from_slice(&[len, 0, dev_specific, bd.len() as u8]);
        }
        d.extend_from_slice(&bd);
        d.extend_from_slice(&pages);
        Done::alloc(d, alloc)
    }

    pub(crate) fn mode_select(&self, cmd: &Command) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let ten = cdb[0] == op::MODE_SELECT_10;
        if cdb[1] & 0x01 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(0)).into()); // SP: no saved pages
        }
        let len = if ten {
            be16(cdb, 7) as usize
        } else {
            byte(cdb, 4) as usize
        };
        if len == 0 {
            return Done::none();
        }
        if cmd.data_out.len() < len {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let data = &cmd.data_out[..len];
        let hdr = if ten { 8 } else { 4 };
        if data.len() < hdr {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let bd_len = if ten {
            be16(data, 6) as usize
        } else {
            data[3] as usize
        };
        let mut at = hdr + bd_len;
        if at > data.len() {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        if bd_len >= 8 {
            // The block length in the descriptor must match ours (no reformatting).
            let bl = u32::from_be_bytes([
                0,
                data[hdr + bd_len - 3],
                data[hdr + bd_len - 2],
                data[hdr + bd_len - 1],
            ]);
            if bl != 0 && bl != self.block_size {
                return Err(Sense::invalid_param_field((hdr + bd_len - 3) as u16, None).into());
            }
        }
        // Validate every page first, then apply.
        let mut changes: Vec<(u8, Vec<u8>)> = Vec::new();
        while at < data.len() {
            if data.len() - at < 2 {
                return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
            }
            let code = data[at] & 0x3F;
            if data[at] & 0x40 != 0 {
                return Err(Sense::invalid_param_field(at as u16, Some(6)).into());
            }
            let plen = data[at + 1] as usize + 2;
            if at + plen > data.len() {
                return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
            }
            if !PAGES.contains(&code) {
                return Err(Sense::invalid_param_field(at as u16, None).into());
            }
            let current = self.mode_page(code, Pc::Current);
            if plen != current.len() {
                return Err(Sense::invalid_param_field((at + 1) as u16, None).into());
            }
            let mask = self.mode_page(code, Pc::Changeable);
            let new = &data[at..at + plen];
            for i in 2..plen {
                if (new[i] ^ current[i]) & !mask[i] != 0 {
                    return Err(Sense::invalid_param_field((at + i) as u16, None).into());
                }
            }
            changes.push((code, new.to_vec()));
            at += plen;
        }
        for (code, p) in changes {
            match code {
                0x08 => self.wce.store(p[2] & 0x04 != 0, Ordering::Relaxed),
                0x0A => {
                    self.d_sense.store(p[2] & 0x04 != 0, Ordering::Relaxed);
                    self.swp.store(p[4] & 0x08 != 0, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        Done::none()
    }
}
