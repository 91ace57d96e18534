//! The 16-byte completion queue entry: DW0/DW1 (command specific), SQ head pointer, SQ
//! identifier, command identifier and the status field (phase tag, status code and type,
//! command retry delay, More, Do Not Retry).

use crate::le::{get16, get32, put16, put32};
use crate::status::StatusCode;

/// Bytes of a completion queue entry.
pub const CQE_LEN: usize = 16;

/// The status field of a completion (DW3 bits 31:16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Phase tag (bit 0; not used over fabrics).
    pub phase: bool,
    /// Status code type and status code.
    pub code: StatusCode,
    /// Command retry delay (bits 13:12).
    pub crd: u8,
    /// More: more status information in the Error Information log.
    pub more: bool,
    /// Do Not Retry.
    pub dnr: bool,
}

impl Status {
    /// The status of a successful command.
    pub const SUCCESS: Status = Status {
        phase: false,
        code: StatusCode::SUCCESS,
        crd: 0,
        more: false,
        dnr: false,
    };

    /// A status with `code` and the DNR bit.
    pub fn error(code: StatusCode, dnr: bool) -> Status {
        Status {
            code,
            dnr,
            ..Status::default()
        }
    }

    /// The 16-bit field.
    pub fn to_u16(self) -> u16 {
        u16::from(self.phase)
            | (u16::from(self.code.sc) << 1)
            | (u16::from(self.code.sct & 7) << 9)
            | (u16::from(self.crd & 3) << 12)
            | (u16::from(self.more) << 14)
            | (u16::from(self.dnr) << 15)
    }

    /// The fields of a 16-bit status.
    pub fn from_u16(v: u16) -> Status {
        Status {
            phase: v & 1 != 0,
            code: StatusCode {
                sc: (v >> 1) as u8,
                sct: ((v >> 9) & 7) as u8,
            },
            crd: ((v >> 12) & 3) as u8,
            more: v & (1 << 14) != 0,
            dnr: v & (1 << 15) != 0,
        }
    }

    /// True when the command succeeded.
    pub fn is_success(&self) -> bool {
        self.code == StatusCode::SUCCESS
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command specific DW0 (Connect: the controller ID in bits 15:0; Property Get: the
    /// value's low dword).
    pub dw0: u32,
    /// Command specific DW1 (Property Get: the value's high dword).
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier of the command completed.
    pub cid: u16,
    /// Status.
    pub status: Status,
}

impl Cqe {
    /// A completion of `cid` with `status`, other fields 0.
    pub fn new(cid: u16, status: Status) -> Cqe {
        Cqe {
            cid,
            status,
            ..Cqe::default()
        }
    }

    /// The entry's bytes.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0; CQE_LEN];
        put32(&mut b, 0, self.dw0);
        put32(&mut b, 4, self.dw1);
        put16(&mut b, 8, self.sqhd);
        put16(&mut b, 10, self.sqid);
        put16(&mut b, 12, self.cid);
        put16(&mut b, 14, self.status.to_u16());
        b
    }

    /// The entry in 16 bytes.
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Cqe {
        Cqe {
            dw0: get32(b, 0),
            dw1: get32(b, 4),
            sqhd: get16(b, 8),
            sqid: get16(b, 10),
            cid: get16(b, 12),
            status: Status::from_u16(get16(b, 14)),
        }
    }
}
