//! Known vectors and agreement of every implementation, split and combine.

use super::*;
use proptest::prelude::*;

/// Bit-at-a-time CRC32C straight from the definition: independent of every table and instruction.
fn bitwise(data: &[u8]) -> u32 {
    let mut reg = !0u32;
    for &b in data {
        reg ^= u32::from(b);
        for _ in 0..8 {
            reg = if reg & 1 != 0 {
                (reg >> 1) ^ 0x82F6_3B78
            } else {
                reg >> 1
            };
        }
    }
    !reg
}

type Append = fn(u32, &[u8]) -> u32;
type CopyAppend = fn(u32, &mut [u8], &[u8]) -> u32;

/// Every implementation this CPU can run, called directly (not only through the dispatcher).
fn appends() -> Vec<(&'static str, Append)> {
    let mut v: Vec<(&'static str, Append)> = vec![
        ("sarwate", sarwate::append),
        ("slicing8", slicing8::append),
        ("dispatched", crc32c_append),
    ];
    if hw::available() {
        v.push(("hw", hw::append));
        v.push(("hw-1stream", hw::append_1stream));
        v.push(("hw-streams-1", hw::append_streams::<1>));
        v.push(("hw-streams-2", hw::append_streams::<2>));
        v.push(("hw-streams-3", hw::append_streams::<3>));
        v.push(("hw-streams-6", hw::append_streams::<6>));
        v.push(("hw-streams-8", hw::append_streams::<8>));
    }
    v.extend(path_appends().into_iter().map(|(p, f)| (p.name(), f)));
    v
}

/// Each hardware path this CPU can run, called explicitly (the dispatcher uses only the best);
/// a note for each it cannot.
fn path_appends() -> Vec<(hw::Path, Append)> {
    let all: [(hw::Path, Append); 3] = [
        (hw::Path::Streams, |c, d| {
            hw::append_with(hw::Path::Streams, c, d)
        }),
        (hw::Path::Avx2Fold, |c, d| {
            hw::append_with(hw::Path::Avx2Fold, c, d)
        }),
        (hw::Path::Avx512Fold, |c, d| {
            hw::append_with(hw::Path::Avx512Fold, c, d)
        }),
    ];
    available_paths(all)
}

fn path_copy_appends() -> Vec<(hw::Path, CopyAppend)> {
    let all: [(hw::Path, CopyAppend); 3] = [
        (hw::Path::Streams, |c, d, s| {
            hw::copy_append_with(hw::Path::Streams, c, d, s)
        }),
        (hw::Path::Avx2Fold, |c, d, s| {
            hw::copy_append_with(hw::Path::Avx2Fold, c, d, s)
        }),
        (hw::Path::Avx512Fold, |c, d, s| {
            hw::copy_append_with(hw::Path::Avx512Fold, c, d, s)
        }),
    ];
    available_paths(all)
}

fn available_paths<F>(all: [(hw::Path, F); 3]) -> Vec<(hw::Path, F)> {
    all.into_iter()
        .filter(|(p, _)| {
            let ok = p.available();
            if !ok {
                println!(
                    "note: CRC32C path {} not available on this CPU; skipped",
                    p.name()
                );
            }
            ok
        })
        .collect()
}

fn copy_appends() -> Vec<(&'static str, CopyAppend)> {
    let mut v: Vec<(&'static str, CopyAppend)> = vec![
        ("sarwate", sarwate::copy_append),
        ("slicing8", slicing8::copy_append),
        ("dispatched", |crc, d, s| {
            let mut state = Crc32c::resume(crc);
            state.update_copy(d, s);
            state.finalize()
        }),
    ];
    if hw::available() {
        v.push(("hw", hw::copy_append));
        v.push(("hw-streams-1", hw::copy_append_streams::<1>));
        v.push(("hw-streams-2", hw::copy_append_streams::<2>));
        v.push(("hw-streams-3", hw::copy_append_streams::<3>));
        v.push(("hw-streams-8", hw::copy_append_streams::<8>));
    }
    v.extend(path_copy_appends().into_iter().map(|(p, f)| (p.name(), f)));
    v
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The vectors of the iSCSI spec notes, section 7 (RFC 3720 appendix B.4).
fn vectors() -> Vec<(Vec<u8>, u32, [u8; 4])> {
    vec![
        (vec![0u8; 32], 0x8A91_36AA, [0xaa, 0x36, 0x91, 0x8a]),
        (vec![0xffu8; 32], 0x62A8_AB43, [0x43, 0xab, 0xa8, 0x62]),
        ((0u8..32).collect(), 0x46DD_794E, [0x4e, 0x79, 0xdd, 0x46]),
        (
            (0u8..32).rev().collect(),
            0x113F_DB5C,
            [0x5c, 0xdb, 0x3f, 0x11],
        ),
        (b"123456789".to_vec(), 0xE306_9283, [0x83, 0x92, 0x06, 0xe3]),
        (
            hex(
                "01c00000 00000000 00000000 00000000 14000000 00000400 00000014 00000018
                 28000000 00000000 02000000 00000000",
            ),
            0xD996_3A56,
            [0x56, 0x3a, 0x96, 0xd9],
        ),
    ]
}

#[test]
fn known_vectors_every_implementation() {
    for (data, want, wire) in vectors() {
        assert_eq!(bitwise(&data), want, "bitwise reference");
        for (name, f) in appends() {
            assert_eq!(f(0, &data), want, "{name} on {data:02x?}");
        }
        for (name, f) in copy_appends() {
            let mut dst = vec![0u8; data.len()];
            assert_eq!(f(0, &mut dst, &data), want, "{name} copy");
            assert_eq!(dst, data, "{name} copy bytes");
        }
        assert_eq!(crc32c(&data), want);
        assert_eq!(crc32c_le_bytes(&data), wire);
        assert_eq!(to_wire(want), wire);
        assert_eq!(from_wire(wire), want);
        let mut dst = vec![0u8; data.len()];
        assert_eq!(copy_with_crc32c(&mut dst, &data), want);
        assert_eq!(dst, data);
    }
}

#[test]
fn data_followed_by_its_wire_digest_leaves_the_residue() {
    for (data, _, _) in vectors() {
        let mut with_digest = data.clone();
        with_digest.extend_from_slice(&crc32c_le_bytes(&data));
        // The register without the final inversion is the fixed residue 0xB798B438.
        assert_eq!(!crc32c(&with_digest), 0xB798_B438);
    }
}

#[test]
fn empty_input_is_zero_and_identity() {
    for (name, f) in appends() {
        assert_eq!(f(0, &[]), 0, "{name}");
        assert_eq!(f(0x1234_5678, &[]), 0x1234_5678, "{name}");
    }
    assert_eq!(crc32c_combine(0xE306_9283, 0, 0), 0xE306_9283);
}

/// Lengths around every block boundary of the multi-stream paths (N * 32-byte thresholds,
/// 8N/16N-byte steps, 4 KiB per stream and round) and both sides of a multi-round buffer.
#[test]
fn all_implementations_agree_across_block_boundaries() {
    let data: Vec<u8> = (0..80_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut lengths: Vec<usize> = (0..600).collect();
    for base in [
        768,
        1024,
        4 * 4096,
        2 * 4 * 4096,
        6 * 4096,
        8 * 4096,
        70_000,
    ] {
        lengths.extend(base - 9..base + 9);
    }
    lengths.push(data.len());
    let mut dst = vec![0u8; data.len()];
    for len in lengths {
        let src = &data[..len];
        let want = slicing8::append(0, src);
        assert_eq!(sarwate::append(0, src), want, "sarwate len {len}");
        for (name, f) in appends() {
            assert_eq!(f(0, src), want, "{name} len {len}");
            assert_eq!(
                f(0x0bad_cafe, src),
                sarwate::append(0x0bad_cafe, src),
                "{name} len {len} resumed"
            );
        }
        for (name, f) in copy_appends() {
            dst[..len].fill(0x5a);
            assert_eq!(f(0, &mut dst[..len], src), want, "{name} copy len {len}");
            assert_eq!(&dst[..len], src, "{name} copied bytes len {len}");
        }
    }
}

/// The uninitialized-destination path (spare capacity, then `set_len`): every length around
/// the kernels' block boundaries, appended after existing bytes, must leave exactly
/// `prefix || src` in the buffer and return the CRC of `src`.
#[test]
fn extend_with_crc32c_appends_exactly_the_source() {
    let data: Vec<u8> = (0..40_000u32)
        .map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8)
        .collect();
    let mut lengths: Vec<usize> = (0..300).collect();
    for base in [1024, 4 * 4096, 32 * 1024] {
        lengths.extend(base - 9..base + 9);
    }
    for len in lengths {
        let src = &data[data.len() - len..];
        for prefix in [0usize, 3, 4096] {
            let mut buf = bytes::BytesMut::with_capacity(prefix);
            buf.extend_from_slice(&data[..prefix]);
            let crc = extend_with_crc32c(&mut buf, src);
            assert_eq!(
                crc,
                sarwate::append(0, src),
                "crc len {len} prefix {prefix}"
            );
            assert_eq!(buf.len(), prefix + len);
            assert_eq!(&buf[..prefix], &data[..prefix], "prefix kept, len {len}");
            assert_eq!(
                &buf[prefix..],
                src,
                "bytes appended, len {len} prefix {prefix}"
            );
        }
    }
    if hw::available() {
        let mut dst = vec![std::mem::MaybeUninit::new(0u8); 5000];
        let crc = hw::copy_append_uninit(0, &mut dst, &data[..5000]);
        assert_eq!(crc, sarwate::append(0, &data[..5000]));
    }
}

#[test]
fn zeros_appended_arithmetically_match_real_zeros() {
    let zeros = vec![0u8; 70_000];
    for prev in [0u32, 0xE306_9283, 0xFFFF_FFFF] {
        for n in [0usize, 1, 7, 8, 4096, 65_536, 70_000] {
            assert_eq!(
                crc32c_append_zeros(prev, n as u64),
                sarwate::append(prev, &zeros[..n]),
                "prev {prev:08x} n {n}"
            );
        }
    }
    let mut buf = bytes::BytesMut::new();
    let mut state = Crc32c::new();
    state.update_extend(&mut buf, b"1234");
    state.update_zeros(3);
    state.update_extend(&mut buf, b"56789");
    assert_eq!(state.finalize(), crc32c(b"1234\x00\x00\x0056789"));
    assert_eq!(&buf[..], b"123456789");
}

/// The folding kernel loads and stores 64 bytes at a time without alignment requirements:
/// every source and destination misalignment must give the same CRC and bytes.
#[test]
fn misaligned_buffers_fold_correctly() {
    let data: Vec<u8> = (0..6000u32).map(|i| (i * 31 + (i >> 7)) as u8).collect();
    let mut dst = vec![0u8; 6000];
    for src_off in 0..9 {
        for dst_off in [0usize, 1, 5, 63] {
            for len in (hw::FOLD_MIN_LEN - 1..5000).step_by(331) {
                let src = &data[src_off..src_off + len];
                let want = sarwate::append(0x1234_5678, src);
                if hw::available() {
                    assert_eq!(
                        hw::append(0x1234_5678, src),
                        want,
                        "src+{src_off} len {len}"
                    );
                    let out = &mut dst[dst_off..dst_off + len];
                    assert_eq!(hw::copy_append(0x1234_5678, out, src), want);
                    assert_eq!(out, src, "copy src+{src_off} dst+{dst_off} len {len}");
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "lengths differ")]
fn copy_with_mismatched_lengths_panics() {
    let mut dst = [0u8; 3];
    copy_with_crc32c(&mut dst, &[1, 2]);
}

#[test]
fn implementation_name_matches_cpu() {
    let want = if hw::available() {
        "hardware"
    } else {
        "slicing-by-8"
    };
    assert_eq!(implementation_name(), want);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_implementation_matches_the_bitwise_definition(data in prop::collection::vec(any::<u8>(), 0..2000)) {
        let want = bitwise(&data);
        for (name, f) in appends() {
            prop_assert_eq!(f(0, &data), want, "{}", name);
        }
        for (name, f) in copy_appends() {
            let mut dst = vec![0u8; data.len()];
            prop_assert_eq!(f(0, &mut dst, &data), want, "{}", name);
            prop_assert_eq!(&dst, &data);
        }
    }

    #[test]
    fn any_split_into_updates_agrees(
        data in prop::collection::vec(any::<u8>(), 0..3000),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(data.len() + 1)).collect();
        cuts.sort_unstable();
        let want = crc32c(&data);
        let mut state = Crc32c::new();
        let mut copied = Crc32c::new();
        let mut dst = vec![0u8; data.len()];
        let mut start = 0;
        for end in cuts.into_iter().chain(std::iter::once(data.len())) {
            state.update(&data[start..end]);
            copied.update_copy(&mut dst[start..end], &data[start..end]);
            for (name, f) in appends() {
                // Each implementation resumes from a CRC any other produced.
                let prefix = crc32c(&data[..start]);
                prop_assert_eq!(f(prefix, &data[start..end]), crc32c(&data[..end]), "{}", name);
            }
            start = end;
        }
        prop_assert_eq!(state.finalize(), want);
        prop_assert_eq!(copied.finalize(), want);
        prop_assert_eq!(&dst, &data);
    }

    #[test]
    fn combine_agrees_with_concatenation(
        a in prop::collection::vec(any::<u8>(), 0..1500),
        b in prop::collection::vec(any::<u8>(), 0..1500),
    ) {
        let joined: Vec<u8> = a.iter().chain(&b).copied().collect();
        prop_assert_eq!(crc32c_combine(crc32c(&a), crc32c(&b), b.len()), bitwise(&joined));
    }

    #[test]
    fn combine_handles_long_virtual_lengths(crc_a in any::<u32>(), zeros in 0usize..200_000) {
        // Appending n zero bytes: combine with the CRC of n zeros equals actually hashing them.
        let zero_bytes = vec![0u8; zeros];
        let want = slicing8::append(crc_a, &zero_bytes);
        prop_assert_eq!(crc32c_combine(crc_a, crc32c(&zero_bytes), zeros), want);
    }

    #[test]
    fn a_shift_table_joins_as_combine_does(
        crc_a in any::<u32>(),
        crc_b in any::<u32>(),
        len in 0usize..70_000,
    ) {
        let shift = Shift::bytes(len);
        prop_assert_eq!(shift.apply(crc_a) ^ crc_b, crc32c_combine(crc_a, crc_b, len));
    }
}

/// A fused copy's CRC covers the bytes it copied, even while another thread rewrites the
/// source: read data is copied out of a RAM LUN that an overlapping WRITE may change at the
/// same moment, and a CRC that disagrees with the copy makes the peer see a digest error (an
/// MPA CRC Terminate, an iSCSI data digest error). Each implementation must read a byte once.
#[test]
fn a_copys_crc_covers_the_copy_while_the_source_changes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const LEN: usize = 256 << 10;
    let src: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..LEN / 8).map(|i| (i as u64).into()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (src, stop) = (src.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                for w in src.iter() {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    w.store(x, Ordering::Relaxed);
                }
            }
        })
    };
    // SAFETY: the words are atomics, which other threads may change at any time; the copy
    // reads them as plain bytes, as an RNIC or a socket reads registered memory. Torn values
    // are expected; only the agreement between the copy and its CRC is checked.
    let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), LEN) };
    let mut dst = vec![0u8; LEN];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    // Sarwate's byte loop is the reference only, never a copy path (the compiler may split
    // it into a copy and a second pass over the source).
    let mut failed = Vec::new();
    for (name, copy) in copy_appends().into_iter().filter(|(n, _)| *n != "sarwate") {
        for round in 0..40 {
            let crc = copy(0, &mut dst, bytes);
            if crc != crc32c_append(0, &dst) {
                failed.push(format!("{name} (round {round})"));
                break;
            }
            if std::time::Instant::now() > deadline {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        failed.is_empty(),
        "a CRC that is not that of the bytes copied: {failed:?}"
    );
}

#[test]
fn update_append_keeps_what_it_fed() {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut buf = b"head".to_vec();
    let mut state = Crc32c::new();
    state.update(b"head");
    state.update_append(&mut buf, &data[..4321]);
    state.update_append(&mut buf, &data[4321..]);
    assert_eq!(&buf[4..], &data[..]);
    assert_eq!(state.finalize(), crc32c(&buf));
}

/// Every path against Sarwate's table for every length up to 4 KiB (each folding kernel's
/// steps, lanes, tails and thresholds), at a misalignment and a starting CRC that change with
/// the length; the copy must be byte-equal and write nothing outside its destination.
#[test]
fn every_path_matches_the_reference_for_every_length_to_4k() {
    const MAX: usize = 4096;
    let data: Vec<u8> = (0..MAX as u32 + 64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
        .collect();
    let mut out = vec![0u8; MAX + 128];
    let (appends, copies) = (path_appends(), path_copy_appends());
    for len in 0..=MAX {
        let src_off = len % 61;
        let dst_off = 64 + (len * 7) % 59;
        let seed = (len as u32).wrapping_mul(0x9E37_79B9);
        let src = &data[src_off..src_off + len];
        let want = sarwate::append(seed, src);
        for (p, f) in &appends {
            assert_eq!(f(seed, src), want, "{} len {len}", p.name());
        }
        for (p, f) in &copies {
            out.fill(0xA5);
            let crc = f(seed, &mut out[dst_off..dst_off + len], src);
            assert_eq!(crc, want, "{} copy len {len}", p.name());
            assert_eq!(
                &out[dst_off..dst_off + len],
                src,
                "{} bytes len {len}",
                p.name()
            );
            assert!(
                out[..dst_off]
                    .iter()
                    .chain(&out[dst_off + len..])
                    .all(|&b| b == 0xA5),
                "{} wrote outside the destination, len {len}",
                p.name()
            );
        }
    }
}

/// The uninitialized-destination entry point on every path, at the lengths around the kernels'
/// boundaries.
#[test]
fn every_path_copies_into_uninitialized_memory() {
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 13 + (i >> 5)) as u8).collect();
    let mut lengths: Vec<usize> = Vec::new();
    for base in [256, 384, 512, 768, 1024, 2048, 8192, 16_384] {
        lengths.extend(base - 3..base + 3);
    }
    lengths.push(data.len());
    for p in hw::Path::ALL {
        if !p.available() {
            println!(
                "note: CRC32C path {} not available on this CPU; skipped",
                p.name()
            );
            continue;
        }
        for &len in &lengths {
            let mut dst = vec![std::mem::MaybeUninit::<u8>::uninit(); len];
            let crc = hw::copy_append_uninit_with(p, 7, &mut dst, &data[..len]);
            assert_eq!(
                crc,
                sarwate::append(7, &data[..len]),
                "{} len {len}",
                p.name()
            );
            // SAFETY: copy_append_uninit_with wrote every byte of `dst`.
            let copied: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(&copied[..], &data[..len], "{} len {len}", p.name());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random bytes, lengths, misalignments of both buffers and starting CRCs on every path.
    #[test]
    fn every_path_matches_the_reference_at_random(
        data in prop::collection::vec(any::<u8>(), 0..9000),
        src_off in 0usize..64,
        dst_off in 0usize..64,
        seed in any::<u32>(),
    ) {
        let src = &data[src_off.min(data.len())..];
        let want = sarwate::append(seed, src);
        for (p, f) in path_appends() {
            prop_assert_eq!(f(seed, src), want, "{}", p.name());
        }
        let mut out = vec![0u8; src.len() + 64];
        for (p, f) in path_copy_appends() {
            let dst = &mut out[dst_off..dst_off + src.len()];
            prop_assert_eq!(f(seed, dst, src), want, "{} copy", p.name());
            prop_assert_eq!(&*dst, src, "{} bytes", p.name());
        }
    }
}
