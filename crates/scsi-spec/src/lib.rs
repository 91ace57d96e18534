//! The SCSI vocabulary every side of ironsan speaks: status codes (SAM-5), sense data in
//! fixed (0x70) and descriptor (0x72) format with one parser and one builder, and the
//! names of sense keys and additional sense codes. The target engine (`scsi`) builds
//! sense with it, the initiator decodes what comes back, and the capture analyzer prints
//! both with the same names. It knows nothing of transports or devices and does no I/O.

pub mod sense;
pub mod status;

pub use sense::Sense;
