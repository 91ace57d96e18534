//! CHAP (RFC 1994 as used by iSCSI, RFC 7143 §12.1.3): algorithms,
//! response computation, algorithm selection and constant-time checks.
//!
//! Response = H(one byte CHAP_I || secret || challenge). Algorithms are the
//! CHAP_A codes 5 (MD5), 6 (SHA-1), 7 (SHA-256) and 8 (SHA3-256); the last
//! three are the ones libiscsi and Linux know beyond RFC 7143's MD5.

use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use sha3::Sha3_256;
use subtle::ConstantTimeEq;

/// A source of random bytes for challenges and identifiers. Implemented
/// for any `FnMut(&mut [u8])`, so a runtime can pass
/// `&mut |b: &mut [u8]| rng.fill_bytes(b)`.
pub trait Entropy {
    fn fill(&mut self, buf: &mut [u8]);
}

impl<F: FnMut(&mut [u8])> Entropy for F {
    fn fill(&mut self, buf: &mut [u8]) {
        self(buf)
    }
}

/// CHAP digest algorithms by their CHAP_A code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChapAlgorithm {
    Md5 = 5,
    Sha1 = 6,
    Sha256 = 7,
    Sha3_256 = 8,
}

impl ChapAlgorithm {
    /// All algorithms, strongest first.
    pub const ALL: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Md5,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u64) -> Option<Self> {
        match code {
            5 => Some(ChapAlgorithm::Md5),
            6 => Some(ChapAlgorithm::Sha1),
            7 => Some(ChapAlgorithm::Sha256),
            8 => Some(ChapAlgorithm::Sha3_256),
            _ => None,
        }
    }

    /// Digest (and CHAP_R) length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha1 => 20,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// Length of the challenges we generate: the digest length, at least 16.
    pub fn challenge_len(self) -> usize {
        self.digest_len().max(16)
    }

    pub fn name(self) -> &'static str {
        match self {
            ChapAlgorithm::Md5 => "MD5",
            ChapAlgorithm::Sha1 => "SHA-1",
            ChapAlgorithm::Sha256 => "SHA-256",
            ChapAlgorithm::Sha3_256 => "SHA3-256",
        }
    }
}

fn digest_of<D: Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
    let mut h = D::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().to_vec()
}

/// Computes the CHAP response H(id || secret || challenge).
pub fn response(alg: ChapAlgorithm, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
    match alg {
        ChapAlgorithm::Md5 => digest_of::<Md5>(id, secret, challenge),
        ChapAlgorithm::Sha1 => digest_of::<Sha1>(id, secret, challenge),
        ChapAlgorithm::Sha256 => digest_of::<Sha256>(id, secret, challenge),
        ChapAlgorithm::Sha3_256 => digest_of::<Sha3_256>(id, secret, challenge),
    }
}

/// Checks a received response in constant time (for equal lengths).
pub fn verify(alg: ChapAlgorithm, id: u8, secret: &[u8], challenge: &[u8], got: &[u8]) -> bool {
    let want = response(alg, id, secret, challenge);
    want.len() == got.len() && bool::from(want.ct_eq(got))
}

/// Picks the algorithm for a `CHAP_A` offer: the first item the offerer
/// lists that is in `allowed`. Each item must be a complete decimal
/// number (no prefix matching: `56` is not `5`); an empty offer or one
/// without a supported item gives `None`.
pub fn select_algorithm(offered: &str, allowed: &[ChapAlgorithm]) -> Option<ChapAlgorithm> {
    offered.split(',').find_map(|item| {
        if item.is_empty() || item.len() > 3 || !item.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let alg = ChapAlgorithm::from_code(item.parse().ok()?)?;
        allowed.contains(&alg).then_some(alg)
    })
}

/// A CHAP user name and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: String,
    pub secret: Vec<u8>,
}

impl ChapCredentials {
    pub fn new(user: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        ChapCredentials {
            user: user.into(),
            secret: secret.into(),
        }
    }
}

impl std::fmt::Debug for ChapCredentials {
    // Never print secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Parses `CHAP_I`: a decimal (or hex) number 0..=255.
pub fn parse_identifier(value: &str) -> Option<u8> {
    crate::text::parse_number_in(value, 0, 255)
        .ok()
        .map(|v| v as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{encode_hex, parse_binary};

    fn hex(s: &str) -> Vec<u8> {
        parse_binary(&format!("0x{s}")).unwrap()
    }

    #[test]
    fn md5_matches_rfc1321_vectors() {
        // With id 'a' (0x61), empty secret, challenge "bc": MD5("abc").
        let r = response(ChapAlgorithm::Md5, b'a', b"", b"bc");
        assert_eq!(r, hex("900150983cd24fb0d6963f7d28e17f72"));
    }

    #[test]
    fn sha_vectors() {
        let r = response(ChapAlgorithm::Sha1, b'a', b"b", b"c");
        assert_eq!(r, hex("a9993e364706816aba3e25717850c26c9cd0d89d"));
        let r = response(ChapAlgorithm::Sha256, b'a', b"b", b"c");
        assert_eq!(
            r,
            hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        let r = response(ChapAlgorithm::Sha3_256, b'a', b"b", b"c");
        assert_eq!(
            r,
            hex("3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532")
        );
    }

    #[test]
    fn verify_is_exact() {
        let c = [7u8; 16];
        let r = response(ChapAlgorithm::Md5, 3, b"secret", &c);
        assert!(verify(ChapAlgorithm::Md5, 3, b"secret", &c, &r));
        assert!(!verify(ChapAlgorithm::Md5, 4, b"secret", &c, &r));
        assert!(!verify(ChapAlgorithm::Md5, 3, b"Secret", &c, &r));
        assert!(!verify(ChapAlgorithm::Md5, 3, b"secret", &c, &r[..15]));
        let mut longer = r.clone();
        longer.push(0);
        assert!(!verify(ChapAlgorithm::Md5, 3, b"secret", &c, &longer));
        assert_eq!(encode_hex(&r).len(), 2 + 32);
    }

    #[test]
    fn algorithm_selection() {
        let all = ChapAlgorithm::ALL;
        assert_eq!(select_algorithm("5", &all), Some(ChapAlgorithm::Md5));
        assert_eq!(select_algorithm("5,6,7,8", &all), Some(ChapAlgorithm::Md5));
        assert_eq!(select_algorithm("7,5", &all), Some(ChapAlgorithm::Sha256));
        assert_eq!(select_algorithm("56", &all), None);
        assert_eq!(select_algorithm("", &all), None);
        assert_eq!(select_algorithm("0x5", &all), None);
        assert_eq!(select_algorithm("5 ", &all), None);
        assert_eq!(select_algorithm("9,4,5", &all), Some(ChapAlgorithm::Md5));
        assert_eq!(select_algorithm("5", &[ChapAlgorithm::Sha256]), None);
        assert_eq!(
            select_algorithm("5,7", &[ChapAlgorithm::Sha256]),
            Some(ChapAlgorithm::Sha256)
        );
    }

    #[test]
    fn identifiers() {
        assert_eq!(parse_identifier("0"), Some(0));
        assert_eq!(parse_identifier("255"), Some(255));
        assert_eq!(parse_identifier("256"), None);
        assert_eq!(parse_identifier("-1"), None);
        assert_eq!(parse_identifier(""), None);
    }

    #[test]
    fn credentials_debug_hides_secret() {
        let c = ChapCredentials::new("u", "topsecret");
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
