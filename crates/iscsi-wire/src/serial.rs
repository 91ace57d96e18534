//! 32-bit serial number arithmetic (RFC 1982) for CmdSN, StatSN, DataSN and R2TSN.
//! Sequence numbers wrap, so they are never compared with plain `<`.

/// `a < b` in serial arithmetic.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

/// `a <= b` in serial arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// `a > b` in serial arithmetic.
pub fn sn_gt(a: u32, b: u32) -> bool {
    sn_lt(b, a)
}

/// Whether `sn` lies in the window `[lo, hi]` (serial arithmetic, inclusive).
pub fn sn_in_window(sn: u32, lo: u32, hi: u32) -> bool {
    sn_le(lo, sn) && sn_le(sn, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_around() {
        assert!(sn_lt(0xffff_fff0, 5));
        assert!(!sn_lt(5, 0xffff_fff0));
        assert!(sn_le(7, 7));
        assert!(sn_gt(1, 0xffff_ffff));
        assert!(sn_in_window(0, 0xffff_fffe, 3));
        assert!(!sn_in_window(4, 0xffff_fffe, 3));
        assert!(!sn_in_window(0xffff_fffd, 0xffff_fffe, 3));
    }
}
