//! Sense data: what went wrong with a command. One [`Sense`] value, built into fixed
//! (0x70) or descriptor (0x72) format by the target and parsed back from either format
//! (current 0x70/0x72 or deferred 0x71/0x73) by whoever receives it, with the names of
//! its sense key and additional sense code.

use bytes::Bytes;
use std::fmt;

/// Sense keys (SPC-4 table 27).
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const RECOVERED_ERROR: u8 = 0x1;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const BLANK_CHECK: u8 = 0x8;
    pub const VENDOR_SPECIFIC: u8 = 0x9;
    pub const COPY_ABORTED: u8 = 0xA;
    pub const ABORTED_COMMAND: u8 = 0xB;
    pub const VOLUME_OVERFLOW: u8 = 0xD;
    pub const MISCOMPARE: u8 = 0xE;

    /// The sense key's name as SPC-4 prints it ("RESERVED" for 0xC and 0xF).
    pub fn name(key: u8) -> &'static str {
        match key {
            NO_SENSE => "NO SENSE",
            RECOVERED_ERROR => "RECOVERED ERROR",
            NOT_READY => "NOT READY",
            MEDIUM_ERROR => "MEDIUM ERROR",
            HARDWARE_ERROR => "HARDWARE ERROR",
            ILLEGAL_REQUEST => "ILLEGAL REQUEST",
            UNIT_ATTENTION => "UNIT ATTENTION",
            DATA_PROTECT => "DATA PROTECT",
            BLANK_CHECK => "BLANK CHECK",
            VENDOR_SPECIFIC => "VENDOR SPECIFIC",
            COPY_ABORTED => "COPY ABORTED",
            ABORTED_COMMAND => "ABORTED COMMAND",
            VOLUME_OVERFLOW => "VOLUME OVERFLOW",
            MISCOMPARE => "MISCOMPARE",
            _ => "RESERVED",
        }
    }
}

/// Additional sense code + qualifier pairs (SPC-4 table 28) the target reports.
pub mod asc {
    pub const NO_ADDITIONAL: (u8, u8) = (0x00, 0x00);
    pub const NOT_READY_SANITIZE: (u8, u8) = (0x04, 0x1B);
    pub const NOT_READY_BECOMING_READY: (u8, u8) = (0x04, 0x01);
    /// LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION (ALUA).
    pub const ALUA_TRANSITIONING: (u8, u8) = (0x04, 0x0A);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE (ALUA).
    pub const ALUA_STANDBY: (u8, u8) = (0x04, 0x0B);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE (ALUA).
    pub const ALUA_UNAVAILABLE: (u8, u8) = (0x04, 0x0C);
    /// LOGICAL UNIT NOT READY, OFFLINE (ALUA's offline state).
    pub const NOT_READY_OFFLINE: (u8, u8) = (0x04, 0x12);
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
    /// ASYMMETRIC ACCESS STATE CHANGED (unit attention; ALUA).
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: (u8, u8) = (0x2A, 0x06);
    pub const CAPACITY_DATA_CHANGED: (u8, u8) = (0x2A, 0x09);
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    pub const MEDIUM_NOT_PRESENT: (u8, u8) = (0x3A, 0x00);
    pub const MEDIUM_NOT_PRESENT_TRAY_OPEN: (u8, u8) = (0x3A, 0x02);
    pub const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3F, 0x0E);
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
    pub const DATA_PHASE_ERROR: (u8, u8) = (0x4B, 0x00);
    pub const MEDIUM_REMOVAL_PREVENTED: (u8, u8) = (0x53, 0x02);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: (u8, u8) = (0x55, 0x04);

    /// The name of an additional sense code and qualifier (SPC-4's wording): every pair
    /// above, and a few families others report.
    pub fn name(asc: u8, ascq: u8) -> Option<&'static str> {
        Some(match (asc, ascq) {
            NO_ADDITIONAL => "no additional sense information",
            NOT_READY_BECOMING_READY => "logical unit is in process of becoming ready",
            NOT_READY_SANITIZE => "logical unit not ready, sanitize in progress",
            (0x04, _) => "logical unit not ready",
            UNREACHABLE_COPY_TARGET => "logical unit communication failure",
            WRITE_ERROR => "write error",
            COPY_TARGET_NOT_REACHABLE => "copy target device not reachable",
            INVALID_FIELD_IN_IU => "invalid field in information unit",
            READ_ERROR => "unrecovered read error",
            PARAMETER_LIST_LENGTH_ERROR => "parameter list length error",
            MISCOMPARE_DURING_VERIFY => "miscompare during verify operation",
            INVALID_OPCODE => "invalid command operation code",
            LBA_OUT_OF_RANGE => "logical block address out of range",
            INVALID_FIELD_IN_CDB => "invalid field in CDB",
            LUN_NOT_SUPPORTED => "logical unit not supported",
            INVALID_FIELD_IN_PARAMETER_LIST => "invalid field in parameter list",
            TOO_MANY_TARGET_DESCRIPTORS => "too many target descriptors",
            UNSUPPORTED_TARGET_DESCRIPTOR => "unsupported target descriptor type code",
            TOO_MANY_SEGMENT_DESCRIPTORS => "too many segment descriptors",
            UNSUPPORTED_SEGMENT_DESCRIPTOR => "unsupported segment descriptor type code",
            SOFTWARE_WRITE_PROTECTED => "software write protected",
            (0x27, _) => "write protected",
            (0x28, 0x00) => "not ready to ready change, medium may have changed",
            POWER_ON_RESET => "power on, reset, or bus device reset occurred",
            (0x29, 0x01) => "power on occurred",
            BUS_DEVICE_RESET => "bus device reset function occurred",
            I_T_NEXUS_LOSS => "I_T nexus loss occurred",
            (0x29, _) => "reset occurred",
            MODE_PARAMETERS_CHANGED => "mode parameters changed",
            RESERVATIONS_PREEMPTED => "reservations preempted",
            RESERVATIONS_RELEASED => "reservations released",
            REGISTRATIONS_PREEMPTED => "registrations preempted",
            CAPACITY_DATA_CHANGED => "capacity data has changed",
            (0x2a, _) => "parameters changed",
            (0x2c, 0x0a) => "partition or collection contains user objects",
            SAVING_PARAMETERS_NOT_SUPPORTED => "saving parameters not supported",
            MEDIUM_NOT_PRESENT_TRAY_OPEN => "medium not present, tray open",
            (0x3a, _) => "medium not present",
            (0x3b, 0x17) => "read past end of user object",
            REPORTED_LUNS_CHANGED => "reported LUNs data has changed",
            INTERNAL_TARGET_FAILURE => "internal target failure",
            (0x47, _) => "SCSI parity error",
            (0x4b, _) => "data phase error",
            MEDIUM_REMOVAL_PREVENTED => "medium removal prevented",
            (0x55, 0x03) => "insufficient resources",
            INSUFFICIENT_REGISTRATION_RESOURCES => "insufficient registration resources",
            (0x55, 0x07) => "quota error",
            _ => return None,
        })
    }
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
    /// Where an ILLEGAL REQUEST's bad field is (its sense-key-specific bytes).
    pub field: Option<FieldPointer>,
}

// Sense from a capture may be cut short: its bytes read as zero past the end.
use crate::cdb::byte;

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
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit,
            }),
            ..Sense::illegal(asc::INVALID_FIELD_IN_CDB)
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte`.
    pub const fn invalid_param_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit,
            }),
            ..Sense::illegal(asc::INVALID_FIELD_IN_PARAMETER_LIST)
        }
    }

    pub const fn illegal(code: (u8, u8)) -> Self {
        Sense::new(key::ILLEGAL_REQUEST, code)
    }

    pub const fn with_information(mut self, information: u64) -> Self {
        self.information = Some(information);
        self
    }

    /// Decodes sense data of either format. Fields past the end of short data read as
    /// zero, so truncated sense still yields its key; `None` when there is no byte at
    /// all or the response code is not 0x70-0x73.
    pub fn parse(b: &[u8]) -> Option<Sense> {
        match *b.first()? & 0x7f {
            0x70 | 0x71 => Some(Self::parse_fixed(b)),
            0x72 | 0x73 => Some(Self::parse_descriptor(b)),
            _ => None,
        }
    }

    fn parse_fixed(b: &[u8]) -> Sense {
        let key = byte(b, 2) & 0x0f;
        let valid = byte(b, 0) & 0x80 != 0 && b.len() >= 7;
        let information = valid.then(|| u32::from_be_bytes([b[3], b[4], b[5], b[6]]) as u64);
        Sense {
            key,
            asc: byte(b, 12),
            ascq: byte(b, 13),
            information,
            field: Self::field_from_sks(key, [byte(b, 15), byte(b, 16), byte(b, 17)]),
        }
    }

    fn parse_descriptor(b: &[u8]) -> Sense {
        let key = byte(b, 1) & 0x0f;
        let mut s = Sense {
            key,
            asc: byte(b, 2),
            ascq: byte(b, 3),
            information: None,
            field: None,
        };
        // Descriptors follow the 8-byte header, each (type, additional length, body).
        let end = b.len().min(8 + byte(b, 7) as usize);
        let mut at = 8;
        while at + 2 <= end {
            let len = 2 + byte(b, at + 1) as usize;
            let Some(d) = b.get(at..(at + len).min(end)) else {
                break;
            };
            match d[0] {
                0x00 if d.len() >= 12 && d[2] & 0x80 != 0 => {
                    let mut info = [0u8; 8];
                    info.copy_from_slice(&d[4..12]);
                    s.information = Some(u64::from_be_bytes(info));
                }
                0x02 if d.len() >= 7 => s.field = Self::field_from_sks(key, [d[4], d[5], d[6]]),
                _ => {}
            }
            at += len;
        }
        s
    }

    /// The field pointer of ILLEGAL REQUEST sense-key-specific bytes with SKSV set.
    fn field_from_sks(key: u8, sks: [u8; 3]) -> Option<FieldPointer> {
        if key != key::ILLEGAL_REQUEST || sks[0] & 0x80 == 0 {
            return None;
        }
        Some(FieldPointer {
            in_cdb: sks[0] & 0x40 != 0,
            byte: u16::from_be_bytes([sks[1], sks[2]]),
            bit: (sks[0] & 0x08 != 0).then_some(sks[0] & 0x07),
        })
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
            // The fixed format holds 32 bits; a larger value is left out with VALID
            // clear, since VALID over a clamped value would mislead.
            if let Ok(info) = u32::try_from(info) {
                s[0] |= 0x80;
                s[3..7].copy_from_slice(&info.to_be_bytes());
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
            // Sense key specific descriptor (SPC-4 4.5.2.4): SKSV starts byte 4.
            s.extend_from_slice(&[0x02, 0x06, 0, 0, sks[0], sks[1], sks[2], 0]);
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

    pub fn key_name(&self) -> &'static str {
        key::name(self.key)
    }

    /// The name of the additional sense code, where it is a common one.
    pub fn asc_name(&self) -> Option<&'static str> {
        asc::name(self.asc, self.ascq)
    }
}

impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (ASC/ASCQ 0x{:02x}/0x{:02x}",
            self.key_name(),
            self.asc,
            self.ascq
        )?;
        if let Some(n) = self.asc_name() {
            write!(f, ": {n}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    #[test]
    fn sense_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[7] = 10;
        fixed[12] = 0x21;
        let s = Sense::parse(&fixed).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (5, 0x21, 0));
        assert_eq!(
            s.to_string(),
            "ILLEGAL REQUEST (ASC/ASCQ 0x21/0x00: logical block address out of range)"
        );
        let desc = [0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0];
        let s = Sense::parse(&desc).unwrap();
        assert_eq!((s.key, s.asc), (6, 0x29));
        assert_eq!(Sense::parse(&[0x7f, 0, 0]), None);
        assert_eq!(Sense::parse(&[]), None);
    }

    #[test]
    fn every_pair_the_target_reports_has_a_name() {
        use asc::*;
        let pairs = [
            NO_ADDITIONAL,
            NOT_READY_SANITIZE,
            NOT_READY_BECOMING_READY,
            UNREACHABLE_COPY_TARGET,
            WRITE_ERROR,
            COPY_TARGET_NOT_REACHABLE,
            INVALID_FIELD_IN_IU,
            READ_ERROR,
            PARAMETER_LIST_LENGTH_ERROR,
            MISCOMPARE_DURING_VERIFY,
            INVALID_OPCODE,
            LBA_OUT_OF_RANGE,
            INVALID_FIELD_IN_CDB,
            LUN_NOT_SUPPORTED,
            INVALID_FIELD_IN_PARAMETER_LIST,
            TOO_MANY_TARGET_DESCRIPTORS,
            UNSUPPORTED_TARGET_DESCRIPTOR,
            TOO_MANY_SEGMENT_DESCRIPTORS,
            UNSUPPORTED_SEGMENT_DESCRIPTOR,
            WRITE_PROTECTED,
            SOFTWARE_WRITE_PROTECTED,
            POWER_ON_RESET,
            BUS_DEVICE_RESET,
            I_T_NEXUS_LOSS,
            MODE_PARAMETERS_CHANGED,
            RESERVATIONS_PREEMPTED,
            RESERVATIONS_RELEASED,
            REGISTRATIONS_PREEMPTED,
            CAPACITY_DATA_CHANGED,
            SAVING_PARAMETERS_NOT_SUPPORTED,
            MEDIUM_NOT_PRESENT,
            MEDIUM_NOT_PRESENT_TRAY_OPEN,
            REPORTED_LUNS_CHANGED,
            INTERNAL_TARGET_FAILURE,
            DATA_PHASE_ERROR,
            MEDIUM_REMOVAL_PREVENTED,
            INSUFFICIENT_REGISTRATION_RESOURCES,
        ];
        for (a, q) in pairs {
            assert!(name(a, q).is_some(), "no name for {a:02x}/{q:02x}");
        }
        assert_eq!(
            name(0x04, 0x01),
            Some("logical unit is in process of becoming ready")
        );
        assert_eq!(name(0x04, 0x02), Some("logical unit not ready"));
        assert_eq!(name(0x99, 0x00), None);
    }

    #[test]
    fn short_sense_reads_missing_fields_as_zero() {
        let s = Sense::parse(&[0x70]).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (key::NO_SENSE, 0, 0));
        let s = Sense::parse(&[0x72, 0x06]).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (key::UNIT_ATTENTION, 0, 0));
    }

    fn any_sense() -> impl Strategy<Value = Sense> {
        let field =
            proptest::option::of((any::<bool>(), any::<u16>(), proptest::option::of(0u8..8)))
                .prop_map(|f| f.map(|(in_cdb, byte, bit)| FieldPointer { in_cdb, byte, bit }));
        (
            0u8..16,
            any::<u8>(),
            any::<u8>(),
            proptest::option::of(any::<u64>()),
            field,
        )
            .prop_map(|(key, asc, ascq, information, field)| Sense {
                key,
                asc,
                ascq,
                information,
                // Only ILLEGAL REQUEST's sense-key-specific bytes are a field pointer.
                field: field.filter(|_| key == key::ILLEGAL_REQUEST),
            })
    }

    proptest! {
        #[test]
        fn descriptor_round_trip(s in any_sense()) {
            prop_assert_eq!(Sense::parse(&s.to_descriptor()), Some(s));
        }

        #[test]
        fn fixed_round_trip(s in any_sense()) {
            let expected = Sense { information: s.information.filter(|&i| i <= u32::MAX as u64), ..s };
            prop_assert_eq!(Sense::parse(&s.to_fixed()), Some(expected));
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Sense::parse(&b);
        }
    }
}
