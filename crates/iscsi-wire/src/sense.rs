//! SCSI sense data as a SCSI Response PDU carries it (RFC 7143 11.4.7.2, the data segment
//! after the two-byte SenseLength): fixed (0x70/0x71) or descriptor (0x72/0x73) format,
//! decoded to key, ASC and ASCQ with readable names. The initiator reports it; the capture
//! analyzer prints it.

use std::fmt;

/// Decoded sense data (fixed or descriptor format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl Sense {
    /// Decodes sense bytes; `None` when they are too short or of an unknown format.
    pub fn parse(b: &[u8]) -> Option<Sense> {
        let code = *b.first()? & 0x7f;
        match code {
            0x70 | 0x71 if b.len() >= 14 => Some(Sense {
                key: b[2] & 0x0f,
                asc: b[12],
                ascq: b[13],
            }),
            0x70 | 0x71 if b.len() >= 3 => Some(Sense {
                key: b[2] & 0x0f,
                asc: 0,
                ascq: 0,
            }),
            0x72 | 0x73 if b.len() >= 4 => Some(Sense {
                key: b[1] & 0x0f,
                asc: b[2],
                ascq: b[3],
            }),
            _ => None,
        }
    }

    pub fn key_name(&self) -> &'static str {
        match self.key {
            0x0 => "NO SENSE",
            0x1 => "RECOVERED ERROR",
            0x2 => "NOT READY",
            0x3 => "MEDIUM ERROR",
            0x4 => "HARDWARE ERROR",
            0x5 => "ILLEGAL REQUEST",
            0x6 => "UNIT ATTENTION",
            0x7 => "DATA PROTECT",
            0x8 => "BLANK CHECK",
            0x9 => "VENDOR SPECIFIC",
            0xa => "COPY ABORTED",
            0xb => "ABORTED COMMAND",
            0xd => "VOLUME OVERFLOW",
            0xe => "MISCOMPARE",
            _ => "RESERVED",
        }
    }

    /// The name of the additional sense code, where it is a common one.
    pub fn asc_name(&self) -> Option<&'static str> {
        Some(match (self.asc, self.ascq) {
            (0x00, 0x00) => "no additional sense information",
            (0x04, 0x00) => "logical unit not ready",
            (0x0c, 0x00) => "write error",
            (0x11, 0x00) => "unrecovered read error",
            (0x1a, 0x00) => "parameter list length error",
            (0x1d, 0x00) => "miscompare during verify operation",
            (0x20, 0x00) => "invalid command operation code",
            (0x21, 0x00) => "logical block address out of range",
            (0x24, 0x00) => "invalid field in CDB",
            (0x25, 0x00) => "logical unit not supported",
            (0x26, 0x00) => "invalid field in parameter list",
            (0x27, _) => "write protected",
            (0x28, 0x00) => "not ready to ready change, medium may have changed",
            (0x29, 0x00) => "power on, reset, or bus device reset occurred",
            (0x29, 0x01) => "power on occurred",
            (0x29, _) => "reset occurred",
            (0x2a, 0x01) => "mode parameters changed",
            (0x2a, 0x09) => "capacity data has changed",
            (0x2a, _) => "parameters changed",
            (0x3a, _) => "medium not present",
            (0x3f, 0x0e) => "reported LUNs data has changed",
            (0x47, _) => "SCSI parity error",
            (0x4b, _) => "data phase error",
            (0x55, 0x03) => "insufficient resources",
            (0x2c, 0x0a) => "partition or collection contains user objects",
            (0x3b, 0x17) => "read past end of user object",
            (0x55, 0x07) => "quota error",
            _ => return None,
        })
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
}
