//! The SCSI vocabulary every side of ironsan speaks: status codes (SAM-5), sense data in
//! fixed (0x70) and descriptor (0x72) format with one parser and one builder, and the
//! names of sense keys and additional sense codes; operation codes with their names and
//! the CDB fields they carry. The target engine (`scsi`) decodes CDBs and builds sense
//! with it, the initiator builds CDBs and decodes what comes back, and the capture
//! analyzer prints all of it with the same names. It knows nothing of transports or devices and does no I/O.

pub mod cdb;
pub mod sense;
pub mod status;

pub use sense::Sense;
