//! Reading structured values from the fuzzer's bytes. Past the end every value is zero and
//! every slice empty, so a harness never has to check lengths.

/// A cursor over one input.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Up to `n` bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// Exactly `N` bytes, zero-filled past the end.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let b = self.bytes(N);
        out[..b.len()].copy_from_slice(b);
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.array())
    }

    /// A record: a 16-bit big-endian length, then that many bytes (fewer at the end).
    pub fn record(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.bytes(n)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(usize::MAX)
    }
}

/// Appends a record as [`Input::record`] reads it (used to write seeds).
pub fn push_record(out: &mut Vec<u8>, data: &[u8]) {
    let n = data.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_be_bytes());
    out.extend_from_slice(&data[..n]);
}
