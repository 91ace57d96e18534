//! Sense data: what went wrong, encoded in fixed (0x70) or descriptor (0x72) format.

use bytes::Bytes;

/// Sense keys (SPC-4 table 27).
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const COPY_ABORTED: u8 = 0xA;
    pub const ABORTED_COMMAND: u8 = 0xB;
    pub const MISCOMPARE: u8 = 0xE;
}

/// Additional sense code + qualifier pairs used by the engine.
pub mod asc {
    pub const NO_ADDITIONAL: (u8, u8) = (0x00, 0x00);
    pub const NOT_READY_SANITIZE: (u8, u8) = (0x04, 0x1B);
    pub const NOT_READY_BECOMING_READY: (u8, u8) = (0x04, 0x01);
    pub const UNREACHABLE_COPY_TARGET: (u8, u8) = (0x08, 0x04);
    pub const WRITE_ERROR: (u8, u8) = (0x0C, 0x00);
    pub const COPY_TARGET_NOT_REACHABLE: (u8, u8) = (0x0D, 0x02);
    pub const INVALID_FIELD_IN_IU: (u8, u8) = (0x0E, 0x03);
    pub const READ_ERROR: (u8, u8) = (0x11, 0x00);
    pub const PARAMETER_LIST_LENGTH_ERROR: (u8, u8) = (0x1A, 0x00);
    pub const MISCOMPARE_DURING_VERIFY: (u8, u8) = (0x1D, 0x00);
    pub const INVALID_OPCODE: (u8, u8) = (0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    pub const LUN_NOT_SUPPORTED: (u8, u8) = (0x25, 0x00);
    pub const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8) = (0x26, 0x00);
    pub const TOO_MANY_TARGET_DESCRIPTORS: (u8, u8) = (0x26, 0x06);
    pub const UNSUPPORTED_TARGET_DESCRIPTOR: (u8, u8) = (0x26, 0x07);
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: (u8, u8) = (0x26, 0x08);
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR: (u8, u8) = (0x26, 0x09);
    pub const WRITE_PROTECTED: (u8, u8) = (0x27, 0x00);
    pub const SOFTWARE_WRITE_PROTECTED: (u8, u8) = (0x27, 0x02);
    pub const POWER_ON_RESET: (u8, u8) = (0x29, 0x00);
    pub const BUS_DEVICE_RESET: (u8, u8) = (0x29, 0x03);
    pub const I_T_NEXUS_LOSS: (u8, u8) = (0x29, 0x07);
    pub const MODE_PARAMETERS_CHANGED: (u8, u8) = (0x2A, 0x01);
    pub const RESERVATIONS_PREEMPTED: (u8, u8) = (0x2A, 0x03);
    pub const RESERVATIONS_RELEASED: (u8, u8) = (0x2A, 0x04);
    pub const REGISTRATIONS_PREEMPTED: (u8, u8) = (0x2A, 0x05);
    pub const CAPACITY_DATA_CHANGED: (u8, u8) = (0x2A, 0x09);
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    pub const MEDIUM_NOT_PRESENT: (u8, u8) = (0x3A, 0x00);
    pub const MEDIUM_NOT_PRESENT_TRAY_OPEN: (u8, u8) = (0x3A, 0x02);
    pub const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3F, 0x0E);
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
    pub const DATA_PHASE_ERROR: (u8, u8) = (0x4B, 0x00);
    pub const MEDIUM_REMOVAL_PREVENTED: (u8, u8) = (0x53, 0x02);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: (u8, u8) = (0x55, 0x04);
}

/// Sense-key-specific field pointer for ILLEGAL REQUEST: which byte (and optionally
/// bit) of the CDB or parameter list is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    /// True: the error is in the CDB; false: in the parameter data.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// Bit position of the field's most significant bit, if given.
    pub bit: Option<u8>,
}

/// A sense condition, independent of its wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// INFORMATION field (e.g. miscompare offset), with VALID set when present.
    pub information: Option<u64>,
    pub field: Option<FieldPointer>,
}

impl Sense {
    pub const fn new(key: u8, code: (u8, u8)) -> Self {
        Sense {
            key,
            asc: code.0,
            ascq: code.1,
            information: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`).
    pub const fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            key: key::ILLEGAL_REQUEST,
            asc: 0x24,
            ascq: 0x00,
            information: None,
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit,
            }),
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte`.
    pub const fn invalid_param_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            key: key::ILLEGAL_REQUEST,
            asc: 0x26,
            ascq: 0x00,
            information: None,
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit,
            }),
        }
    }

    pub const fn illegal(code: (u8, u8)) -> Self {
        Sense::new(key::ILLEGAL_REQUEST, code)
    }

    pub const fn with_information(mut self, information: u64) -> Self {
        self.information = Some(information);
        self
    }

    fn sks_bytes(&self) -> Option<[u8; 3]> {
        let f = self.field?;
        let mut b0 = 0x80u8; // SKSV
        if f.in_cdb {
            b0 |= 0x40;
        }
        if let Some(bit) = f.bit {
            b0 |= 0x08 | (bit & 0x07);
        }
        Some([b0, (f.byte >> 8) as u8, f.byte as u8])
    }

    /// Fixed format (response code 0x70), 18 bytes.
    pub fn to_fixed(&self) -> [u8; 18] {
        let mut s = [0u8; 18];
        s[0] = 0x70;
        s[2] = self.key & 0x0F;
        if let Some(info) = self.information {
            s[0] |= 0x80;
            // The fixed format holds 32 bits; larger values are clamped (VALID still set
            // would mislead, so clear it).
            if info <= u32::MAX as u64 {
                s[3..7].copy_from_slice(&(info as u32).to_be_bytes());
            } else {
                s[0] &= 0x7F;
            }
        }
        s[7] = 10;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some(sks) = self.sks_bytes() {
            s[15..18].copy_from_slice(&sks);
        }
        s
    }

    /// Descriptor format (response code 0x72) with INFORMATION and sense-key-specific
    /// descriptors when present.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut s = vec![0x72, self.key & 0x0F, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(info) = self.information {
            s.extend_from_slice(&[0x00, 0x0A, 0x80, 0]);
            s.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(sks) = self.sks_bytes() {
            s.extend_from_slice(&[0x02, 0x06, 0, sks[0], sks[1], sks[2], 0, 0]);
        }
        s[7] = (s.len() - 8) as u8;
        s
    }

    /// Encodes in the format selected by the control mode page's D_SENSE bit.
    pub fn encode(&self, descriptor: bool) -> Bytes {
        if descriptor {
            Bytes::from(self.to_descriptor())
        } else {
            Bytes::copy_from_slice(&self.to_fixed())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_invalid_field_has_field_pointer() {
        let s = Sense::invalid_cdb_field(1, Some(5)).to_fixed();
        assert_eq!(s[0], 0x70);
        assert_eq!(s[2], 0x05);
        assert_eq!((s[12], s[13]), (0x24, 0x00));
        assert_eq!(s[7], 10);
        assert_eq!(s[15], 0x80 | 0x40 | 0x08 | 5);
        assert_eq!(u16::from_be_bytes([s[16], s[17]]), 1);
    }

    #[test]
    fn fixed_information_sets_valid() {
        let s = Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
            .with_information(513)
            .to_fixed();
        assert_eq!(s[0], 0xF0);
        assert_eq!(u32::from_be_bytes([s[3], s[4], s[5], s[6]]), 513);
    }

    #[test]
    fn descriptor_format_layout() {
        let s = Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
            .with_information(7)
            .to_descriptor();
        assert_eq!(&s[..4], &[0x72, 0x0E, 0x1D, 0x00]);
        assert_eq!(s[7] as usize, s.len() - 8);
        assert_eq!(&s[8..12], &[0x00, 0x0A, 0x80, 0x00]);
        assert_eq!(u64::from_be_bytes(s[12..20].try_into().unwrap()), 7);
    }
}
