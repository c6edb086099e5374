//! The seeded data of a challenge, and the one CPU implementation of its arithmetic (the
//! renter's check and the `cpu-reference` backend both run it; the CUDA backend must give
//! the same bytes).
//!
//! Everything derives from the 32-byte seed through BLAKE3 in keyed mode (key = seed), each
//! stream with its own input tag, read through the XOF (whose 64-byte blocks are independent:
//! a GPU computes any part of any stream without the rest):
//!
//! - `B`, n x n signed bytes, row-major: XOF of `"gl-proof-v1/B" || n`.
//! - row `r` of `A_i`, n signed bytes: XOF of `"gl-proof-v1/A" || n || i || r`.
//! - page `p` of the VRAM fill: XOF of `"gl-proof-v1/page" || page_bytes || p`.
//!
//! (`||` joins little-endian u32 for n, i, r, page_bytes and u64 for p.)
//!
//! Row `r` of `C_i = A_i B` is n int32 sums, exact (|sum| <= n * 128 * 128 < 2^31 for
//! n <= 2^16, [`MAX_EXACT_N`]). Its leaf is BLAKE3 of `"gl-proof-v1/row" || i || r || the n sums as
//! little-endian i32`; a page's leaf is BLAKE3 of `"gl-proof-v1/pageleaf" || p || its bytes`.

use gridlease_protocol::Digest;

/// Largest n for which int32 accumulation is exact.
pub const MAX_EXACT_N: u32 = 1 << 16;

fn xof(seed: &[u8; 32], parts: &[&[u8]], out: &mut [u8]) {
    let mut h = blake3::Hasher::new_keyed(seed);
    for p in parts {
        h.update(p);
    }
    h.finalize_xof().fill(out);
}

fn as_i8(bytes: Vec<u8>) -> Vec<i8> {
    bytes.into_iter().map(|b| b as i8).collect()
}

/// `B` (n x n, row-major).
pub fn b_matrix(seed: &[u8; 32], n: u32) -> Vec<i8> {
    let len = (n as usize) * (n as usize);
    let mut out = vec![0u8; len];
    xof(seed, &[b"gl-proof-v1/B", &n.to_le_bytes()], &mut out);
    as_i8(out)
}

/// Row `row` of `A_gemm` into `out` (n entries). Allocates nothing: the prover calls it for
/// every row.
pub fn a_row(seed: &[u8; 32], n: u32, gemm: u32, row: u32, out: &mut [i8]) {
    let mut h = blake3::Hasher::new_keyed(seed);
    for p in [
        &b"gl-proof-v1/A"[..],
        &n.to_le_bytes(),
        &gemm.to_le_bytes(),
        &row.to_le_bytes(),
    ] {
        h.update(p);
    }
    let mut xof = h.finalize_xof();
    let mut buf = [0u8; 256];
    for run in out.chunks_mut(buf.len()) {
        let bytes = &mut buf[..run.len()];
        xof.fill(bytes);
        for (o, &b) in run.iter_mut().zip(bytes.iter()) {
            *o = b as i8;
        }
    }
}

/// `out = a B` for one row `a` (n entries) of `A` and `B` (n x n): n exact int32 sums.
///
/// Four rows of `B` at a time, each product formed in i16 (exact: |a b| <= 128 * 128 fits)
/// and widened to i32 before it is summed: the loop auto-vectorises on plain x86-64 (SSE2
/// has a 16-bit multiply, not a 32-bit one), about twice the speed of an i32 product per
/// entry, and the same sums.
pub fn c_row(a: &[i8], b: &[i8], out: &mut [i32]) {
    let n = out.len();
    out.fill(0);
    if a.len().checked_mul(n).is_none_or(|need| b.len() < need) {
        return; // Not a's B: nothing to compute (the caller's sizes are wrong).
    }
    let mut quads = a.chunks_exact(4);
    let mut k = 0;
    for q in &mut quads {
        let b0 = &b[k * n..(k + 1) * n];
        let b1 = &b[(k + 1) * n..(k + 2) * n];
        let b2 = &b[(k + 2) * n..(k + 3) * n];
        let b3 = &b[(k + 3) * n..(k + 4) * n];
        let (a0, a1, a2, a3) = (
            i16::from(q[0]),
            i16::from(q[1]),
            i16::from(q[2]),
            i16::from(q[3]),
        );
        // Indexed, with every slice n long: a chain of zips does not vectorise as well.
        for j in 0..n {
            out[j] += i32::from(a0 * i16::from(b0[j]))
                + i32::from(a1 * i16::from(b1[j]))
                + i32::from(a2 * i16::from(b2[j]))
                + i32::from(a3 * i16::from(b3[j]));
        }
        k += 4;
    }
    for &ak in quads.remainder() {
        let ak = i16::from(ak);
        for (o, &x) in out.iter_mut().zip(&b[k * n..(k + 1) * n]) {
            *o += i32::from(ak * i16::from(x));
        }
        k += 1;
    }
}

/// The leaf of row `row` of `C_gemm`.
pub fn row_leaf(gemm: u32, row: u32, c: &[i32]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"gl-proof-v1/row");
    h.update(&gemm.to_le_bytes());
    h.update(&row.to_le_bytes());
    let mut buf = [0u8; 4096];
    for chunk in c.chunks(buf.len() / 4) {
        for (i, v) in chunk.iter().enumerate() {
            buf[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    Digest(*h.finalize().as_bytes())
}

/// Page `page` of the VRAM fill into `out` (`page_bytes` long).
pub fn page(seed: &[u8; 32], page_bytes: u32, page: u64, out: &mut [u8]) {
    xof(
        seed,
        &[
            b"gl-proof-v1/page",
            &page_bytes.to_le_bytes(),
            &page.to_le_bytes(),
        ],
        out,
    );
}

/// The leaf of page `page` with content `bytes`.
pub fn page_leaf(page: u64, bytes: &[u8]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"gl-proof-v1/pageleaf");
    h.update(&page.to_le_bytes());
    h.update(bytes);
    Digest(*h.finalize().as_bytes())
}

/// The true leaf of row `row` of `C_gemm` (computes the row: n^2 multiply-accumulates).
pub fn true_row_leaf(seed: &[u8; 32], n: u32, b: &[i8], gemm: u32, row: u32) -> Digest {
    let mut a = vec![0i8; n as usize];
    let mut c = vec![0i32; n as usize];
    a_row(seed, n, gemm, row, &mut a);
    c_row(&a, b, &mut c);
    row_leaf(gemm, row, &c)
}

/// The true leaf of page `page`.
pub fn true_page_leaf(seed: &[u8; 32], page_bytes: u32, p: u64) -> Digest {
    let mut buf = vec![0u8; page_bytes as usize];
    page(seed, page_bytes, p, &mut buf);
    page_leaf(p, &buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn textbook(a: &[i8], b: &[i8], n: usize) -> Vec<i32> {
        (0..n)
            .map(|j| {
                (0..a.len())
                    .map(|k| i32::from(a[k]) * i32::from(b[k * n + j]))
                    .sum()
            })
            .collect()
    }

    #[test]
    fn a_row_times_b_is_the_textbook_product() {
        let seed = [3u8; 32];
        for n in [16u32, 64, 256] {
            let b = b_matrix(&seed, n);
            let mut a = vec![0i8; n as usize];
            a_row(&seed, n, 2, 5, &mut a);
            let mut c = vec![0i32; n as usize];
            c_row(&a, &b, &mut c);
            assert_eq!(c, textbook(&a, &b, n as usize), "n = {n}");
        }
    }

    #[test]
    fn c_row_is_the_textbook_product_for_every_length_and_the_extremes() {
        // Lengths that leave 0..=3 rows after the groups of four, and the entries whose
        // products are largest (-128 * -128) and smallest (-128 * 127).
        let seed = [9u8; 32];
        for n in 1usize..=13 {
            let mut bytes = vec![0u8; n * n + n];
            xof(&seed, &[&(n as u32).to_le_bytes()], &mut bytes);
            let mut v: Vec<i8> = bytes.into_iter().map(|x| x as i8).collect();
            for (i, x) in v.iter_mut().enumerate() {
                match i % 7 {
                    0 => *x = -128,
                    3 => *x = 127,
                    _ => {}
                }
            }
            let (a, b) = v.split_at(n);
            let mut c = vec![0i32; n];
            c_row(a, b, &mut c);
            assert_eq!(c, textbook(a, b, n), "n = {n}");
        }
        let n = 64;
        for (x, y) in [(-128i8, -128i8), (-128, 127), (127, 127)] {
            let (a, b) = (vec![x; n], vec![y; n * n]);
            let mut c = vec![0i32; n];
            c_row(&a, &b, &mut c);
            assert!(
                c.iter()
                    .all(|&s| s == n as i32 * i32::from(x) * i32::from(y))
            );
        }
    }

    #[test]
    fn a_row_is_the_xof_stream() {
        // a_row reads the XOF through a small buffer; the bytes are the stream's.
        let seed = [4u8; 32];
        for n in [64u32, 300, 4096] {
            let mut want = vec![0u8; n as usize];
            let parts: [&[u8]; 4] = [
                b"gl-proof-v1/A",
                &n.to_le_bytes(),
                &7u32.to_le_bytes(),
                &9u32.to_le_bytes(),
            ];
            xof(&seed, &parts, &mut want);
            let mut got = vec![0i8; n as usize];
            a_row(&seed, n, 7, 9, &mut got);
            assert_eq!(as_i8(want), got, "n = {n}");
        }
    }

    #[test]
    fn streams_differ_by_seed_gemm_row_and_page() {
        let n = 64;
        let (s1, s2) = ([1u8; 32], [2u8; 32]);
        assert_ne!(b_matrix(&s1, n), b_matrix(&s2, n));
        let (mut x, mut y) = (vec![0i8; 64], vec![0i8; 64]);
        a_row(&s1, n, 0, 1, &mut x);
        a_row(&s1, n, 1, 0, &mut y);
        assert_ne!(x, y);
        assert_ne!(true_page_leaf(&s1, 4096, 0), true_page_leaf(&s1, 4096, 1));
        assert_ne!(true_page_leaf(&s1, 4096, 0), true_page_leaf(&s2, 4096, 0));
    }

    #[test]
    fn the_largest_sums_stay_exact() {
        // Every entry -128: each sum is n * 16384, exact up to MAX_EXACT_N.
        let n = 1024usize;
        let a = vec![-128i8; n];
        let b = vec![-128i8; n * n];
        let mut c = vec![0i32; n];
        c_row(&a, &b, &mut c);
        assert!(c.iter().all(|&v| v == (n as i32) * 16384));
        assert!(i64::from(MAX_EXACT_N) * 16384 < i64::from(i32::MAX));
    }
}
