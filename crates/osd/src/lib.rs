//! An OSD-2 (T10 Object-based Storage Device, INCITS 458) logical unit without a
//! transport: it executes OSD-2 CDBs (opcode 0x7F, service actions 0x8880 + n)
//! against an object store kept in a directory, and builds the same CDBs for an
//! initiator.
//!
//! What is accepted:
//! * only the 236-byte OSD-2 CDB; OSD-1's 200-byte CDB is refused (INVALID FIELD
//!   IN CDB at byte 7);
//! * only the NOSEC security method: a capability of format 0 (none), or 1/2
//!   with security method 0 whose object type is known and whose allowed
//!   partition/object ids name the command's object. Any other method is
//!   refused with INVALID FIELD IN CDB at capability byte 2 (CDB byte 82);
//!   integrity check values and nonces are not checked;
//! * the service actions of [`cdb::ServiceAction`]; the get/set attribute
//!   formats of byte 11 (set one 0x10, page 0x20, list 0x30) on every command.
//!   A page-mode get returns the page as a retrieved attributes list (type 0x9)
//!   of every defined attribute of the page, not a fixed page layout.
//!
//! The caller runs [`OsdUnit::execute`] on a blocking thread: it does file and
//! SQLite I/O.

pub mod attr;
pub mod cdb;
pub mod client;
pub mod offset;
mod pages;
mod security;
pub mod sense;
mod store;
mod unit;

pub use sense::SenseCode;
pub use store::OsdError;
pub use unit::{OsdUnit, Reply, CHECK_CONDITION, GOOD};
