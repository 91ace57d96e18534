//! Sense codes an OSD logical unit reports, and their descriptor-format encoding.
//! Codes are those of SPC-3 table 28 as used by OSD-2 (see osd_sense values:
//! 0x1A00, 0x2000, 0x2400, 0x2600, 0x2C0A, 0x3B17, 0x5507).

/// Sense keys used here.
pub mod key {
    pub const RECOVERED_ERROR: u8 = 0x1;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const DATA_PROTECT: u8 = 0x7;
}

/// (key, ASC, ASCQ) of a READ past an object's logical length: the data that exists comes
/// with it, so an initiator takes it as a short read, not a failure.
pub const READ_PAST_END: (u8, u8, u8) = (key::RECOVERED_ERROR, 0x3B, 0x17);

/// One error (or recovered condition) of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenseCode {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// Sense-key-specific field pointer: (in_cdb, byte offset).
    pub field: Option<(bool, u16)>,
    /// OSD object identification (partition, object) when the error is about an object.
    pub object: Option<(u64, u64)>,
    /// Command-specific information (READ past the end: the bytes actually read).
    pub information: Option<u64>,
}

impl SenseCode {
    fn new(key: u8, asc: u8, ascq: u8) -> SenseCode {
        SenseCode {
            key,
            asc,
            ascq,
            field: None,
            object: None,
            information: None,
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte`.
    pub fn invalid_field_in_cdb(byte: u16) -> SenseCode {
        SenseCode {
            field: Some((true, byte)),
            ..SenseCode::new(key::ILLEGAL_REQUEST, 0x24, 0x00)
        }
    }

    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE.
    pub fn invalid_opcode() -> SenseCode {
        SenseCode {
            field: Some((true, 0)),
            ..SenseCode::new(key::ILLEGAL_REQUEST, 0x20, 0x00)
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at data-out `byte`.
    pub fn invalid_field_in_parameter_list(byte: u16) -> SenseCode {
        SenseCode {
            field: Some((false, byte)),
            ..SenseCode::new(key::ILLEGAL_REQUEST, 0x26, 0x00)
        }
    }

    /// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR (data-out shorter than the CDB says).
    pub fn parameter_list_length_error() -> SenseCode {
        SenseCode::new(key::ILLEGAL_REQUEST, 0x1A, 0x00)
    }

    /// ILLEGAL REQUEST, PARTITION OR COLLECTION CONTAINS USER OBJECTS.
    pub fn contains_user_objects(partition: u64, object: u64) -> SenseCode {
        SenseCode::new(key::ILLEGAL_REQUEST, 0x2C, 0x0A).about(partition, object)
    }

    /// DATA PROTECT, QUOTA ERROR (capacity or quota exceeded).
    pub fn quota_error(partition: u64, object: u64) -> SenseCode {
        SenseCode::new(key::DATA_PROTECT, 0x55, 0x07).about(partition, object)
    }

    /// RECOVERED ERROR, READ PAST END OF USER OBJECT, with the bytes read.
    pub fn read_past_end(partition: u64, object: u64, bytes_read: u64) -> SenseCode {
        let (k, asc, ascq) = READ_PAST_END;
        SenseCode {
            information: Some(bytes_read),
            ..SenseCode::new(k, asc, ascq).about(partition, object)
        }
    }

    /// HARDWARE ERROR, INTERNAL TARGET FAILURE (the backing store failed).
    pub fn internal_failure() -> SenseCode {
        SenseCode::new(key::HARDWARE_ERROR, 0x44, 0x00)
    }

    /// The same code, naming the object it is about.
    pub fn about(mut self, partition: u64, object: u64) -> SenseCode {
        self.object = Some((partition, object));
        self
    }

    /// Descriptor-format sense data (response code 0x72) with the command-specific
    /// information (type 1), sense-key-specific (type 2) and OSD object
    /// identification (type 6) descriptors that apply.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut out = vec![0x72, self.key & 0x0F, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(info) = self.information {
            out.extend_from_slice(&[0x01, 0x0A, 0x80, 0x00]);
            out.extend_from_slice(&info.to_be_bytes());
        }
        if let Some((in_cdb, byte)) = self.field {
            let flags = 0x80 | if in_cdb { 0x40 } else { 0 };
            out.extend_from_slice(&[0x02, 0x06, 0, 0, flags]);
            out.extend_from_slice(&byte.to_be_bytes());
            out.push(0);
        }
        if let Some((partition, object)) = self.object {
            // Type 6: 6 reserved, not-initiated and completed command functions
            // (left zero: not tracked), partition id, object id.
            out.extend_from_slice(&[0x06, 0x1E, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(&partition.to_be_bytes());
            out.extend_from_slice(&object.to_be_bytes());
        }
        out[7] = (out.len() - 8) as u8;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_sense_has_field_pointer_and_object() {
        let s = SenseCode::invalid_field_in_cdb(24).about(0x10000, 0x10001);
        let d = s.to_descriptor();
        assert_eq!(&d[..4], &[0x72, 0x05, 0x24, 0x00]);
        assert_eq!(d[7] as usize, d.len() - 8);
        assert_eq!(&d[8..16], &[0x02, 0x06, 0, 0, 0xC0, 0, 24, 0]);
        assert_eq!(&d[16..18], &[0x06, 0x1E]);
        assert_eq!(&d[32..40], &0x10000u64.to_be_bytes());
        assert_eq!(&d[40..48], &0x10001u64.to_be_bytes());
    }

    #[test]
    fn read_past_end_carries_bytes_read() {
        let d = SenseCode::read_past_end(1, 2, 77).to_descriptor();
        assert_eq!(&d[1..4], &[0x01, 0x3B, 0x17]);
        assert_eq!(&d[8..12], &[0x01, 0x0A, 0x80, 0x00]);
        assert_eq!(&d[12..20], &77u64.to_be_bytes());
    }
}
