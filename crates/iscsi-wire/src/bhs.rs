//! Basic Header Segment: one typed struct per opcode, decoded from and encoded to 48 bytes.
//!
//! Fields the standard reserves are written as zero and ignored on decode (peers differ in
//! how carefully they clear them). TotalAHSLength and DataSegmentLength are framing, not
//! PDU content: `decode` returns them beside the typed header and `encode` takes them.

use crate::{Opcode, WireError, BHS_LEN};

/// The reserved tag value ("no task" / "no reply wanted").
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Login stages (CSG / NSG, RFC 7143 11.12.3), in the order a login goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Security = 0,
    Operational = 1,
    FullFeature = 3,
}

impl Stage {
    /// The 2-bit wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a 2-bit stage code; 2 (reserved) and anything else is `None`.
    pub fn from_code(code: u8) -> Option<Stage> {
        match code {
            0 => Some(Stage::Security),
            1 => Some(Stage::Operational),
            3 => Some(Stage::FullFeature),
            _ => None,
        }
    }

    fn from_bits(v: u8) -> Result<Stage, WireError> {
        Stage::from_code(v & 3).ok_or(WireError::InvalidField("login stage 2 is reserved"))
    }
}

/// SCSI Command (0x01).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    /// Task attribute, bits 2..0 (0 untagged, 1 simple, 2 ordered, 3 head of queue, 4 ACA).
    pub attr: u8,
    pub lun: u64,
    pub itt: u32,
    pub expected_data_len: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// CDB bytes 0..15; longer CDBs continue in an Extended CDB AHS.
    pub cdb: [u8; 16],
}

/// SCSI Response (0x21).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScsiResponse {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub response: u8,
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub bidi_read_residual: u32,
    pub residual: u32,
}

/// SCSI Data-Out (0x05).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataOut {
    pub final_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

/// SCSI Data-In (0x25).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataIn {
    pub final_: bool,
    pub ack: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub status_present: bool,
    pub status: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: u32,
}

/// Ready To Transfer (0x31).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct R2t {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_len: u32,
}

/// NOP-Out (0x00).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// NOP-In (0x20).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NopIn {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Task Management Function Request (0x02).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: u8,
    pub lun: u64,
    pub itt: u32,
    pub ref_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

/// Task management function codes.
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;

    pub const RSP_COMPLETE: u8 = 0;
    pub const RSP_NO_TASK: u8 = 1;
    pub const RSP_NO_LUN: u8 = 2;
    /// TASK REASSIGN: the task's connection is still in the session.
    pub const RSP_STILL_ALLEGIANT: u8 = 3;
    /// TASK REASSIGN below ErrorRecoveryLevel 2.
    pub const RSP_REASSIGN_NOT_SUPPORTED: u8 = 4;
    pub const RSP_NOT_SUPPORTED: u8 = 5;
    pub const RSP_REJECTED: u8 = 255;
}

/// Task Management Function Response (0x22).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Login Request (0x03).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    pub transit: bool,
    pub cont: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Login Response (0x23).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResponse {
    pub transit: bool,
    pub cont: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
}

/// Text Request (0x04).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Text Response (0x24).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextResponse {
    pub final_: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Logout Request (0x06).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogoutRequest {
    pub immediate: bool,
    /// 0 close session, 1 close connection, 2 remove connection for recovery.
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Logout Response (0x26).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogoutResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// SNACK Request (0x10).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnackRequest {
    pub snack_type: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

/// Asynchronous Message (0x32).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AsyncMessage {
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// 0 SCSI event, 1 logout requested, 2 connection drop, 3 session drop, 4 renegotiate.
    pub event: u8,
    pub vcode: u8,
    pub param1: u16,
    pub param2: u16,
    pub param3: u16,
}

/// Reject (0x3f).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reject {
    pub reason: u8,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
}

/// Reject reason codes.
pub mod reject {
    /// The rejected PDU a Reject's data segment carries (its header): (opcode, ITT);
    /// `None` when the segment is shorter than a header.
    pub fn rejected_pdu(data: &[u8]) -> Option<(u8, u32)> {
        let h = data.get(..48)?;
        Some((
            h[0] & 0x3f,
            u32::from_be_bytes([h[16], h[17], h[18], h[19]]),
        ))
    }

    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECTED: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const LONG_OPERATION_REJECT: u8 = 0x0a;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// A typed Basic Header Segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bhs {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

/// What `Bhs::decode` returns: the typed header and the framing lengths it declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedBhs {
    pub bhs: Bhs,
    /// TotalAHSLength in bytes (already multiplied by 4).
    pub ahs_len: usize,
    /// DataSegmentLength in bytes, without padding.
    pub data_len: u32,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn bit(b: u8, mask: u8) -> bool {
    b & mask != 0
}
fn flag(v: bool, mask: u8) -> u8 {
    if v {
        mask
    } else {
        0
    }
}

impl Bhs {
    /// The opcode of this header.
    pub fn opcode(&self) -> Opcode {
        match self {
            Bhs::NopOut(_) => Opcode::NopOut,
            Bhs::ScsiCommand(_) => Opcode::ScsiCommand,
            Bhs::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Bhs::LoginRequest(_) => Opcode::LoginRequest,
            Bhs::TextRequest(_) => Opcode::TextRequest,
            Bhs::DataOut(_) => Opcode::DataOut,
            Bhs::LogoutRequest(_) => Opcode::LogoutRequest,
            Bhs::SnackRequest(_) => Opcode::SnackRequest,
            Bhs::NopIn(_) => Opcode::NopIn,
            Bhs::ScsiResponse(_) => Opcode::ScsiResponse,
            Bhs::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Bhs::LoginResponse(_) => Opcode::LoginResponse,
            Bhs::TextResponse(_) => Opcode::TextResponse,
            Bhs::DataIn(_) => Opcode::DataIn,
            Bhs::LogoutResponse(_) => Opcode::LogoutResponse,
            Bhs::R2t(_) => Opcode::R2t,
            Bhs::AsyncMessage(_) => Opcode::AsyncMessage,
            Bhs::Reject(_) => Opcode::Reject,
        }
    }

    /// The Initiator Task Tag (0xffffffff where the PDU has none).
    pub fn itt(&self) -> u32 {
        match self {
            Bhs::NopOut(p) => p.itt,
            Bhs::ScsiCommand(p) => p.itt,
            Bhs::TaskMgmtRequest(p) => p.itt,
            Bhs::LoginRequest(p) => p.itt,
            Bhs::TextRequest(p) => p.itt,
            Bhs::DataOut(p) => p.itt,
            Bhs::LogoutRequest(p) => p.itt,
            Bhs::SnackRequest(p) => p.itt,
            Bhs::NopIn(p) => p.itt,
            Bhs::ScsiResponse(p) => p.itt,
            Bhs::TaskMgmtResponse(p) => p.itt,
            Bhs::LoginResponse(p) => p.itt,
            Bhs::TextResponse(p) => p.itt,
            Bhs::DataIn(p) => p.itt,
            Bhs::LogoutResponse(p) => p.itt,
            Bhs::R2t(p) => p.itt,
            Bhs::AsyncMessage(_) | Bhs::Reject(_) => RESERVED_TAG,
        }
    }

    /// Decode 48 bytes. Fails on an opcode this codec does not know or a reserved stage.
    pub fn decode(b: &[u8; BHS_LEN]) -> Result<DecodedBhs, WireError> {
        let immediate = bit(b[0], 0x40);
        let op = Opcode::from_u8(b[0] & 0x3f).ok_or(WireError::UnknownOpcode(b[0] & 0x3f))?;
        let f = b[1];
        let ahs_len = b[4] as usize * 4;
        let data_len = u32::from_be_bytes([0, b[5], b[6], b[7]]);
        let lun = be64(b, 8);
        let itt = be32(b, 16);
        let bhs = match op {
            Opcode::NopOut => Bhs::NopOut(NopOut {
                immediate,
                lun,
                itt,
                ttt: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            }),
            Opcode::ScsiCommand => {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&b[32..48]);
                Bhs::ScsiCommand(ScsiCommand {
                    immediate,
                    final_: bit(f, 0x80),
                    read: bit(f, 0x40),
                    write: bit(f, 0x20),
                    attr: f & 0x07,
                    lun,
                    itt,
                    expected_data_len: be32(b, 20),
                    cmd_sn: be32(b, 24),
                    exp_stat_sn: be32(b, 28),
                    cdb,
                })
            }
            Opcode::TaskMgmtRequest => Bhs::TaskMgmtRequest(TaskMgmtRequest {
                immediate,
                function: f & 0x7f,
                lun,
                itt,
                ref_task_tag: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
                ref_cmd_sn: be32(b, 32),
                exp_data_sn: be32(b, 36),
            }),
            Opcode::LoginRequest => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Bhs::LoginRequest(LoginRequest {
                    transit: bit(f, 0x80),
                    cont: bit(f, 0x40),
                    csg: Stage::from_bits(f >> 2)?,
                    nsg: Stage::from_bits_lenient(f, bit(f, 0x80))?,
                    version_max: b[2],
                    version_min: b[3],
                    isid,
                    tsih: be16(b, 14),
                    itt,
                    cid: be16(b, 20),
                    cmd_sn: be32(b, 24),
                    exp_stat_sn: be32(b, 28),
                })
            }
            Opcode::TextRequest => Bhs::TextRequest(TextRequest {
                immediate,
                final_: bit(f, 0x80),
                cont: bit(f, 0x40),
                lun,
                itt,
                ttt: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            }),
            Opcode::DataOut => Bhs::DataOut(DataOut {
                final_: bit(f, 0x80),
                lun,
                itt,
                ttt: be32(b, 20),
                exp_stat_sn: be32(b, 28),
                data_sn: be32(b, 36),
                buffer_offset: be32(b, 40),
            }),
            Opcode::LogoutRequest => Bhs::LogoutRequest(LogoutRequest {
                immediate,
                reason: f & 0x7f,
                itt,
                cid: be16(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            }),
            Opcode::SnackRequest => Bhs::SnackRequest(SnackRequest {
                snack_type: f & 0x0f,
                lun,
                itt,
                ttt: be32(b, 20),
                exp_stat_sn: be32(b, 28),
                beg_run: be32(b, 40),
                run_length: be32(b, 44),
            }),
            Opcode::NopIn => Bhs::NopIn(NopIn {
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
            }),
            Opcode::ScsiResponse => Bhs::ScsiResponse(ScsiResponse {
                bidi_overflow: bit(f, 0x10),
                bidi_underflow: bit(f, 0x08),
                overflow: bit(f, 0x04),
                underflow: bit(f, 0x02),
                response: b[2],
                status: b[3],
                itt,
                snack_tag: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                exp_data_sn: be32(b, 36),
                bidi_read_residual: be32(b, 40),
                residual: be32(b, 44),
            }),
            Opcode::TaskMgmtResponse => Bhs::TaskMgmtResponse(TaskMgmtResponse {
                response: b[2],
                itt,
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
            }),
            Opcode::LoginResponse => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Bhs::LoginResponse(LoginResponse {
                    transit: bit(f, 0x80),
                    cont: bit(f, 0x40),
                    csg: Stage::from_bits(f >> 2)?,
                    nsg: Stage::from_bits_lenient(f, bit(f, 0x80))?,
                    version_max: b[2],
                    version_active: b[3],
                    isid,
                    tsih: be16(b, 14),
                    itt,
                    stat_sn: be32(b, 24),
                    exp_cmd_sn: be32(b, 28),
                    max_cmd_sn: be32(b, 32),
                    status_class: b[36],
                    status_detail: b[37],
                })
            }
            Opcode::TextResponse => Bhs::TextResponse(TextResponse {
                final_: bit(f, 0x80),
                cont: bit(f, 0x40),
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
            }),
            Opcode::DataIn => Bhs::DataIn(DataIn {
                final_: bit(f, 0x80),
                ack: bit(f, 0x40),
                overflow: bit(f, 0x04),
                underflow: bit(f, 0x02),
                status_present: bit(f, 0x01),
                status: b[3],
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                data_sn: be32(b, 36),
                buffer_offset: be32(b, 40),
                residual: be32(b, 44),
            }),
            Opcode::LogoutResponse => Bhs::LogoutResponse(LogoutResponse {
                response: b[2],
                itt,
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                time2wait: be16(b, 40),
                time2retain: be16(b, 42),
            }),
            Opcode::R2t => Bhs::R2t(R2t {
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                r2t_sn: be32(b, 36),
                buffer_offset: be32(b, 40),
                desired_len: be32(b, 44),
            }),
            Opcode::AsyncMessage => Bhs::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                event: b[36],
                vcode: b[37],
                param1: be16(b, 38),
                param2: be16(b, 40),
                param3: be16(b, 42),
            }),
            Opcode::Reject => Bhs::Reject(Reject {
                reason: b[2],
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                data_sn: be32(b, 36),
            }),
        };
        Ok(DecodedBhs {
            bhs,
            ahs_len,
            data_len,
        })
    }

    /// Encode to 48 bytes with the given TotalAHSLength (bytes, multiple of 4) and
    /// DataSegmentLength (bytes, < 2^24).
    pub fn encode(&self, ahs_len: usize, data_len: u32) -> [u8; BHS_LEN] {
        debug_assert!(ahs_len.is_multiple_of(4) && ahs_len / 4 <= 255);
        debug_assert!(data_len < 1 << 24);
        let mut b = [0u8; BHS_LEN];
        b[0] = self.opcode() as u8;
        b[4] = (ahs_len / 4) as u8;
        b[5..8].copy_from_slice(&data_len.to_be_bytes()[1..]);
        put32(&mut b, 16, self.itt());
        match self {
            Bhs::NopOut(p) => {
                b[0] |= flag(p.immediate, 0x40);
                b[1] = 0x80;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
            }
            Bhs::ScsiCommand(p) => {
                b[0] |= flag(p.immediate, 0x40);
                b[1] = flag(p.final_, 0x80)
                    | flag(p.read, 0x40)
                    | flag(p.write, 0x20)
                    | (p.attr & 0x07);
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.expected_data_len);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                b[32..48].copy_from_slice(&p.cdb);
            }
            Bhs::TaskMgmtRequest(p) => {
                b[0] |= flag(p.immediate, 0x40);
                b[1] = 0x80 | (p.function & 0x7f);
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ref_task_tag);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
                put32(&mut b, 32, p.ref_cmd_sn);
                put32(&mut b, 36, p.exp_data_sn);
            }
            Bhs::LoginRequest(p) => {
                b[0] |= 0x40;
                b[1] = flag(p.transit, 0x80)
                    | flag(p.cont, 0x40)
                    | ((p.csg as u8) << 2)
                    | if p.transit { p.nsg as u8 } else { 0 };
                b[2] = p.version_max;
                b[3] = p.version_min;
                b[8..14].copy_from_slice(&p.isid);
                put16(&mut b, 14, p.tsih);
                put16(&mut b, 20, p.cid);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
            }
            Bhs::TextRequest(p) => {
                b[0] |= flag(p.immediate, 0x40);
                b[1] = flag(p.final_, 0x80) | flag(p.cont, 0x40);
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
            }
            Bhs::DataOut(p) => {
                b[1] = flag(p.final_, 0x80);
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 28, p.exp_stat_sn);
                put32(&mut b, 36, p.data_sn);
                put32(&mut b, 40, p.buffer_offset);
            }
            Bhs::LogoutRequest(p) => {
                b[0] |= flag(p.immediate, 0x40);
                b[1] = 0x80 | (p.reason & 0x7f);
                put16(&mut b, 20, p.cid);
                put32(&mut b, 24, p.cmd_sn);
                put32(&mut b, 28, p.exp_stat_sn);
            }
            Bhs::SnackRequest(p) => {
                b[1] = 0x80 | (p.snack_type & 0x0f);
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 28, p.exp_stat_sn);
                put32(&mut b, 40, p.beg_run);
                put32(&mut b, 44, p.run_length);
            }
            Bhs::NopIn(p) => {
                b[1] = 0x80;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
            }
            Bhs::ScsiResponse(p) => {
                b[1] = 0x80
                    | flag(p.bidi_overflow, 0x10)
                    | flag(p.bidi_underflow, 0x08)
                    | flag(p.overflow, 0x04)
                    | flag(p.underflow, 0x02);
                b[2] = p.response;
                b[3] = p.status;
                put32(&mut b, 20, p.snack_tag);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.exp_data_sn);
                put32(&mut b, 40, p.bidi_read_residual);
                put32(&mut b, 44, p.residual);
            }
            Bhs::TaskMgmtResponse(p) => {
                b[1] = 0x80;
                b[2] = p.response;
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
            }
            Bhs::LoginResponse(p) => {
                b[1] = flag(p.transit, 0x80)
                    | flag(p.cont, 0x40)
                    | ((p.csg as u8) << 2)
                    | if p.transit { p.nsg as u8 } else { 0 };
                b[2] = p.version_max;
                b[3] = p.version_active;
                b[8..14].copy_from_slice(&p.isid);
                put16(&mut b, 14, p.tsih);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                b[36] = p.status_class;
                b[37] = p.status_detail;
            }
            Bhs::TextResponse(p) => {
                b[1] = flag(p.final_, 0x80) | flag(p.cont, 0x40);
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
            }
            Bhs::DataIn(p) => {
                b[1] = flag(p.final_, 0x80)
                    | flag(p.ack, 0x40)
                    | flag(p.overflow, 0x04)
                    | flag(p.underflow, 0x02)
                    | flag(p.status_present, 0x01);
                b[3] = p.status;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.data_sn);
                put32(&mut b, 40, p.buffer_offset);
                put32(&mut b, 44, p.residual);
            }
            Bhs::LogoutResponse(p) => {
                b[1] = 0x80;
                b[2] = p.response;
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put16(&mut b, 40, p.time2wait);
                put16(&mut b, 42, p.time2retain);
            }
            Bhs::R2t(p) => {
                b[1] = 0x80;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 20, p.ttt);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.r2t_sn);
                put32(&mut b, 40, p.buffer_offset);
                put32(&mut b, 44, p.desired_len);
            }
            Bhs::AsyncMessage(p) => {
                b[1] = 0x80;
                put64(&mut b, 8, p.lun);
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                b[36] = p.event;
                b[37] = p.vcode;
                put16(&mut b, 38, p.param1);
                put16(&mut b, 40, p.param2);
                put16(&mut b, 42, p.param3);
            }
            Bhs::Reject(p) => {
                b[1] = 0x80;
                b[2] = p.reason;
                put32(&mut b, 24, p.stat_sn);
                put32(&mut b, 28, p.exp_cmd_sn);
                put32(&mut b, 32, p.max_cmd_sn);
                put32(&mut b, 36, p.data_sn);
            }
        }
        b
    }

    /// Set the target's sequence fields (StatSN, ExpCmdSN, MaxCmdSN) on a target→initiator
    /// header. Requests are left unchanged.
    pub fn set_target_sns(&mut self, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
        let fields = match self {
            Bhs::NopIn(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::ScsiResponse(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::TaskMgmtResponse(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::LoginResponse(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::TextResponse(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::DataIn(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::LogoutResponse(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::R2t(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::AsyncMessage(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            Bhs::Reject(p) => (&mut p.stat_sn, &mut p.exp_cmd_sn, &mut p.max_cmd_sn),
            _ => return,
        };
        *fields.0 = stat_sn;
        *fields.1 = exp_cmd_sn;
        *fields.2 = max_cmd_sn;
    }

    /// The StatSN a target→initiator PDU carries (`None` for other PDUs).
    pub fn stat_sn(&self) -> Option<u32> {
        Some(match self {
            Bhs::NopIn(p) => p.stat_sn,
            Bhs::ScsiResponse(p) => p.stat_sn,
            Bhs::TaskMgmtResponse(p) => p.stat_sn,
            Bhs::LoginResponse(p) => p.stat_sn,
            Bhs::TextResponse(p) => p.stat_sn,
            Bhs::DataIn(p) => p.stat_sn,
            Bhs::LogoutResponse(p) => p.stat_sn,
            Bhs::R2t(p) => p.stat_sn,
            Bhs::AsyncMessage(p) => p.stat_sn,
            Bhs::Reject(p) => p.stat_sn,
            _ => return None,
        })
    }

    /// The ExpCmdSN a target→initiator PDU carries (`None` for other PDUs).
    pub fn target_exp_cmd_sn(&self) -> Option<u32> {
        Some(match self {
            Bhs::NopIn(p) => p.exp_cmd_sn,
            Bhs::ScsiResponse(p) => p.exp_cmd_sn,
            Bhs::TaskMgmtResponse(p) => p.exp_cmd_sn,
            Bhs::LoginResponse(p) => p.exp_cmd_sn,
            Bhs::TextResponse(p) => p.exp_cmd_sn,
            Bhs::DataIn(p) => p.exp_cmd_sn,
            Bhs::LogoutResponse(p) => p.exp_cmd_sn,
            Bhs::R2t(p) => p.exp_cmd_sn,
            Bhs::AsyncMessage(p) => p.exp_cmd_sn,
            Bhs::Reject(p) => p.exp_cmd_sn,
            _ => return None,
        })
    }

    /// The ExpStatSN an initiator→target PDU acknowledges (`None` for other PDUs).
    pub fn initiator_exp_stat_sn(&self) -> Option<u32> {
        Some(match self {
            Bhs::ScsiCommand(p) => p.exp_stat_sn,
            Bhs::DataOut(p) => p.exp_stat_sn,
            Bhs::NopOut(p) => p.exp_stat_sn,
            Bhs::TaskMgmtRequest(p) => p.exp_stat_sn,
            Bhs::LoginRequest(p) => p.exp_stat_sn,
            Bhs::TextRequest(p) => p.exp_stat_sn,
            Bhs::LogoutRequest(p) => p.exp_stat_sn,
            Bhs::SnackRequest(p) => p.exp_stat_sn,
            _ => return None,
        })
    }

    /// The ExpStatSN field of an initiator→target PDU, to change it (`None` for other PDUs).
    pub fn initiator_exp_stat_sn_mut(&mut self) -> Option<&mut u32> {
        Some(match self {
            Bhs::ScsiCommand(p) => &mut p.exp_stat_sn,
            Bhs::DataOut(p) => &mut p.exp_stat_sn,
            Bhs::NopOut(p) => &mut p.exp_stat_sn,
            Bhs::TaskMgmtRequest(p) => &mut p.exp_stat_sn,
            Bhs::LoginRequest(p) => &mut p.exp_stat_sn,
            Bhs::TextRequest(p) => &mut p.exp_stat_sn,
            Bhs::LogoutRequest(p) => &mut p.exp_stat_sn,
            Bhs::SnackRequest(p) => &mut p.exp_stat_sn,
            _ => return None,
        })
    }

    /// Whether sending this target→initiator PDU consumes a StatSN (it carries status).
    /// R2T, Data-In without status and target-initiated NOP-In carry the next StatSN
    /// without advancing it.
    pub fn advances_stat_sn(&self) -> bool {
        match self {
            Bhs::ScsiResponse(_)
            | Bhs::TaskMgmtResponse(_)
            | Bhs::LoginResponse(_)
            | Bhs::TextResponse(_)
            | Bhs::LogoutResponse(_)
            | Bhs::AsyncMessage(_)
            | Bhs::Reject(_) => true,
            Bhs::DataIn(p) => p.status_present,
            Bhs::NopIn(p) => p.itt != RESERVED_TAG,
            _ => false,
        }
    }
}

impl Stage {
    /// NSG: only meaningful with T=1; with T=0 the field is reserved (RFC 7143 §11.12.3),
    /// so whatever it holds decodes as Security, the value an encoder writes there (a
    /// decoded header then encodes to the same meaning and back).
    fn from_bits_lenient(f: u8, transit: bool) -> Result<Stage, WireError> {
        if transit {
            Stage::from_bits(f)
        } else {
            Ok(Stage::Security)
        }
    }
}
