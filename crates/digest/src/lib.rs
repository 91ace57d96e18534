//! CRC32C (Castagnoli), the digest of iSCSI (HeaderDigest/DataDigest) and of iWARP's MPA, for
//! all of ironsan: one-shot [`crc32c`], incremental [`Crc32c`], [`crc32c_combine`] of CRCs
//! computed separately, and [`copy_with_crc32c`], which copies a buffer and computes its CRC in
//! one pass for the send and receive paths that copy anyway, and [`SegmentCrcs`] /
//! [`SegmentedCopy`] for the per-PDU digests of a Data-In sequence computed during a copy. The fastest implementation the CPU
//! supports is chosen once at run time: the CRC32C instruction in interleaved streams, with
//! VPCLMULQDQ folding on 256-bit (AVX2) or 512-bit (AVX-512) registers for longer buffers
//! ([`hw`], which can also be forced onto a slower path for measurement), else Slicing-by-8
//! ([`slicing8`]); Sarwate's byte table ([`sarwate`]) is the reference. The `bench` crate
//! measures them all.
//!
//! CRC values here are the finished CRC (initial value and final XOR applied), so
//! `crc32c(b"123456789") == 0xE3069283`. iSCSI and MPA put them on the wire least significant
//! byte first: see [`to_wire`] and [`from_wire`].

use std::sync::OnceLock;

use bytes::BytesMut;

pub use segments::{SegmentCrcs, SegmentedCopy};

mod gf2;
pub mod hw;
pub mod sarwate;
mod segments;
pub mod slicing8;

/// One implementation, as the dispatcher installs it.
struct Backend {
    name: &'static str,
    append: fn(u32, &[u8]) -> u32,
    copy_append: fn(u32, &mut [u8], &[u8]) -> u32,
}

static BACKEND: OnceLock<Backend> = OnceLock::new();

fn backend() -> &'static Backend {
    BACKEND.get_or_init(|| {
        if hw::available() {
            Backend {
                name: "hardware",
                append: hw::append,
                copy_append: hw::copy_append,
            }
        } else {
            Backend {
                name: "slicing-by-8",
                append: slicing8::append,
                copy_append: slicing8::copy_append,
            }
        }
    })
}

/// Which implementation [`crc32c`] uses on this CPU: `"hardware"` or `"slicing-by-8"`.
pub fn implementation_name() -> &'static str {
    backend().name
}

/// The CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    (backend().append)(0, data)
}

/// The CRC32C of `previous || data`, given `crc` = the CRC32C of `previous` (0 for none).
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    (backend().append)(crc, data)
}

/// Copies `src` into `dst` and returns the CRC32C of the bytes, reading each byte once.
///
/// # Panics
/// If `dst.len() != src.len()` (a caller bug, not a data condition).
pub fn copy_with_crc32c(dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_with_crc32c: dst and src lengths differ"
    );
    (backend().copy_append)(0, dst, src)
}

/// Appends `src` to `buf` and returns the CRC32C of `src`, reading each byte once and without
/// zeroing the new bytes first: the receive path's copy of a data segment into the command's
/// buffer.
pub fn extend_with_crc32c(buf: &mut BytesMut, src: &[u8]) -> u32 {
    extend_append(0, buf, src)
}

/// [`extend_with_crc32c`] continuing from `crc`, the CRC32C of earlier bytes.
fn extend_append(crc: u32, buf: &mut BytesMut, src: &[u8]) -> u32 {
    if !hw::available() {
        let start = buf.len();
        buf.extend_from_slice(src);
        return crc32c_append(crc, &buf[start..]);
    }
    buf.reserve(src.len());
    let crc = hw::copy_append_uninit(crc, &mut buf.spare_capacity_mut()[..src.len()], src);
    // SAFETY: `copy_append_uninit` wrote all `src.len()` bytes after the current length, and
    // `reserve` made room for them.
    unsafe { buf.set_len(buf.len() + src.len()) };
    crc
}

/// The CRC32C of `previous || n zero bytes`, given `crc` = the CRC32C of `previous`, without
/// touching memory: for never-written (thin) ranges that read as zeros.
pub fn crc32c_append_zeros(crc: u32, n: u64) -> u32 {
    !gf2::shift_bytes(!crc, n)
}

/// The CRC32C of `a || b` from `crc_a` = CRC32C(a), `crc_b` = CRC32C(b) and `len_b` = b.len(),
/// without the bytes. Costs about a microsecond at most; for joining per-segment digests, not
/// for a per-word inner loop.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    gf2::shift_bytes(crc_a, len_b as u64) ^ crc_b
}

/// Joining a CRC32C with that of a following block of one fixed length, in four table
/// lookups: `crc32c_combine(a, b, len)` is `shift.apply(a) ^ b`. For CRCs kept per block of
/// memory and joined often (a sender that knows its blocks' CRCs need not read the blocks).
#[derive(Clone)]
pub struct Shift {
    len: usize,
    /// `table[k][v]`: the shift of `v << 8k` (the operator is linear over GF(2)).
    table: Box<[[u32; 256]; 4]>,
}

impl std::fmt::Debug for Shift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shift({} bytes)", self.len)
    }
}

impl Shift {
    /// The shift past `len` bytes: 1,024 multiplications by one power of x.
    pub fn bytes(len: usize) -> Shift {
        let power = gf2::xpow(8 * len as u64);
        let mut table = Box::new([[0u32; 256]; 4]);
        for (k, row) in table.iter_mut().enumerate() {
            for (v, entry) in row.iter_mut().enumerate() {
                *entry = gf2::multmodp(power, (v as u32) << (8 * k));
            }
        }
        Shift { len, table }
    }

    /// The length it shifts past.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `crc` shifted past `len()` zero bytes, as [`crc32c_combine`] would before its xor.
    pub fn apply(&self, crc: u32) -> u32 {
        let t = &self.table;
        t[0][(crc & 0xFF) as usize]
            ^ t[1][((crc >> 8) & 0xFF) as usize]
            ^ t[2][((crc >> 16) & 0xFF) as usize]
            ^ t[3][(crc >> 24) as usize]
    }
}

/// The 4 bytes of a digest as iSCSI and MPA send them: least significant byte first.
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// A digest read from the wire (least significant byte first).
pub fn from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// `to_wire(crc32c(data))`: the digest bytes to append after `data`.
pub fn crc32c_le_bytes(data: &[u8]) -> [u8; 4] {
    to_wire(crc32c(data))
}

/// An incremental CRC32C: feed the bytes in any number of pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32c {
    crc: u32,
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    /// The state before any byte.
    pub fn new() -> Crc32c {
        Crc32c { crc: 0 }
    }

    /// Continues after bytes whose CRC32C is `crc`.
    pub fn resume(crc: u32) -> Crc32c {
        Crc32c { crc }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.crc = crc32c_append(self.crc, data);
    }

    /// Copies `src` into `dst` and feeds the bytes, in one pass.
    ///
    /// # Panics
    /// If `dst.len() != src.len()` (a caller bug, not a data condition).
    pub fn update_copy(&mut self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(
            dst.len(),
            src.len(),
            "Crc32c::update_copy: dst and src lengths differ"
        );
        self.crc = (backend().copy_append)(self.crc, dst, src);
    }

    /// Appends `src` to `buf` (no zeroing first) and feeds the bytes, in one pass.
    pub fn update_extend(&mut self, buf: &mut BytesMut, src: &[u8]) {
        self.crc = extend_append(self.crc, buf, src);
    }

    /// Appends `src` to `buf` (no zeroing first) and feeds the bytes, in one pass: the bytes
    /// kept are exactly the bytes the CRC covers, even if `src` changes meanwhile.
    pub fn update_append(&mut self, buf: &mut Vec<u8>, src: &[u8]) {
        if !hw::available() {
            let start = buf.len();
            buf.extend_from_slice(src);
            self.update(&buf[start..]);
            return;
        }
        buf.reserve(src.len());
        self.crc =
            hw::copy_append_uninit(self.crc, &mut buf.spare_capacity_mut()[..src.len()], src);
        // SAFETY: `copy_append_uninit` wrote all `src.len()` bytes after the current length,
        // and `reserve` made room for them.
        unsafe { buf.set_len(buf.len() + src.len()) };
    }

    /// Feeds a block of `shift.len()` bytes whose own CRC32C is `block_crc`, without them.
    pub fn update_block_crc(&mut self, block_crc: u32, shift: &Shift) {
        self.crc = shift.apply(self.crc) ^ block_crc;
    }

    /// Feeds `n` zero bytes, arithmetically.
    pub fn update_zeros(&mut self, n: u64) {
        self.crc = crc32c_append_zeros(self.crc, n);
    }

    /// The CRC32C of everything fed so far; the state stays usable.
    pub fn finalize(&self) -> u32 {
        self.crc
    }
}

#[cfg(test)]
mod tests;
