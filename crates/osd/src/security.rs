//! Capability checks. Only NOSEC is offered: no integrity check value or nonce
//! is verified, so the capability is checked for form and for naming the
//! command's object, not for authenticity.

use crate::cdb::{field, object_type, Cdb};
use crate::sense::SenseCode;

/// Refuses a capability this logical unit cannot honour.
pub fn check(cdb: &Cdb) -> Result<(), SenseCode> {
    let cap = &cdb.capability;
    match cap.format {
        0 => return Ok(()),
        1 | 2 => {}
        _ => return Err(SenseCode::invalid_field_in_cdb(field::CAPABILITY_FORMAT)),
    }
    if cap.security_method != 0 {
        return Err(SenseCode::invalid_field_in_cdb(field::SECURITY_METHOD));
    }
    let known = [
        object_type::ROOT,
        object_type::PARTITION,
        object_type::COLLECTION,
        object_type::USER,
    ];
    if !known.contains(&cap.object_type) {
        return Err(SenseCode::invalid_field_in_cdb(
            field::CAPABILITY_OBJECT_TYPE,
        ));
    }
    let partition_mismatch = cap.allowed_partition != cdb.partition;
    match cap.descriptor_type {
        // A single user object or collection: both ids must match (a zero object id
        // in the CDB asks the device to choose, so it matches any).
        1 | 3 => {
            if partition_mismatch {
                return Err(SenseCode::invalid_field_in_cdb(field::ALLOWED_PARTITION_ID));
            }
            if cdb.object != 0 && cap.allowed_object != cdb.object {
                return Err(SenseCode::invalid_field_in_cdb(field::ALLOWED_OBJECT_ID));
            }
        }
        // A partition (or the root): commands within it.
        2 if partition_mismatch && cdb.partition != 0 && cap.allowed_partition != 0 => {
            return Err(SenseCode::invalid_field_in_cdb(field::ALLOWED_PARTITION_ID));
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::ServiceAction;

    #[test]
    fn nosec_for_the_object_passes() {
        let cdb = Cdb::new(ServiceAction::Read, 0x10000, 0x10001);
        assert_eq!(check(&cdb), Ok(()));
    }

    #[test]
    fn capkey_is_refused_at_the_security_method() {
        let mut cdb = Cdb::new(ServiceAction::Read, 0x10000, 0x10001);
        cdb.capability.security_method = 1;
        assert_eq!(check(&cdb).unwrap_err().field, Some((true, 82)));
    }

    #[test]
    fn capability_for_another_object_is_refused() {
        let mut cdb = Cdb::new(ServiceAction::Read, 0x10000, 0x10001);
        cdb.object = 0x10002;
        assert_eq!(check(&cdb).unwrap_err().field, Some((true, 160)));
    }
}
