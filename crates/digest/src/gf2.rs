//! Arithmetic on CRC32C register values as polynomials over GF(2) modulo the Castagnoli
//! polynomial, in the reflected bit order the CRC uses (bit 31 is x^0, bit 0 is x^31).
//! It is what lets two CRCs computed separately be joined: the register after `A || B` is
//! `reg(A) * x^(8*len(B)) + reg_from_zero(B)`.

/// The Castagnoli polynomial 0x1EDC6F41, bit-reflected, without its x^32 term.
pub const POLY: u32 = 0x82F6_3B78;

/// The polynomial `1` in reflected form.
const ONE: u32 = 0x8000_0000;

/// `a * b mod P`.
pub const fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut i = 0;
    // Bit 31 of `a` is the x^0 coefficient; b is multiplied by x after each step.
    while i < 32 {
        if a & (ONE >> i) != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        i += 1;
    }
    product
}

/// `x^(2^k) mod P` for k in 0..64.
const X2N_TABLE: [u32; 64] = {
    let mut table = [0u32; 64];
    let mut p = ONE >> 1; // x^1
    let mut k = 0;
    while k < 64 {
        table[k] = p;
        p = multmodp(p, p);
        k += 1;
    }
    table
};

/// `x^n mod P`.
pub const fn xpow(mut n: u64) -> u32 {
    let mut p = ONE;
    let mut k = 0;
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(X2N_TABLE[k], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The register value of `bytes` zero bytes appended after register `reg`: `reg * x^(8*bytes)`.
pub const fn shift_bytes(reg: u32, bytes: u64) -> u32 {
    multmodp(xpow(bytes.wrapping_mul(8)), reg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multiplying by x one step at a time, the way a bitwise CRC advances.
    fn times_x(v: u32) -> u32 {
        if v & 1 != 0 {
            (v >> 1) ^ POLY
        } else {
            v >> 1
        }
    }

    #[test]
    fn xpow_matches_repeated_multiplication_by_x() {
        let mut v = ONE;
        for n in 0..2000u64 {
            assert_eq!(xpow(n), v, "x^{n}");
            v = times_x(v);
        }
    }

    #[test]
    fn multiplication_is_commutative_and_has_one() {
        let samples = [0u32, 1, 0x1234_5678, 0xdead_beef, ONE, POLY, u32::MAX];
        for &a in &samples {
            assert_eq!(multmodp(a, ONE), a);
            for &b in &samples {
                assert_eq!(multmodp(a, b), multmodp(b, a));
            }
        }
    }
}
