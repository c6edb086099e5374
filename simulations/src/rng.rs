//! Random streams: one independent generator per agent, derived from (seed, replication,
//! agent kind, agent index), so adding an agent or reordering events never shifts another
//! agent's draws.

use rand::{Rng, RngCore};
use rand_distr::Distribution;
use rand_pcg::Pcg64Mcg;

/// Agent kinds, part of the stream key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum StreamKind {
    /// A provider.
    Provider = 1,
    /// A renter.
    Renter = 2,
    /// The market itself (experiment drivers).
    Market = 3,
    /// A renter group (arrival times of the group's jobs).
    RenterGroup = 4,
    /// Statistics (bootstrap resampling).
    Statistics = 5,
}

/// SplitMix64 finaliser: a bijective 64-bit mix.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator of one agent's stream.
pub fn stream(seed: u64, replication: u64, kind: StreamKind, index: u64) -> Pcg64Mcg {
    let a = mix64(seed ^ 0x6772_6964_6c65_6173); // "gridleas"
    let b = mix64(a ^ replication.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let c = mix64(b ^ (kind as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let hi = mix64(c ^ index);
    let lo = mix64(hi ^ 0xA5A5_A5A5_5A5A_5A5A);
    // Pcg64Mcg needs an odd state; `new` forces it.
    Pcg64Mcg::new((u128::from(hi) << 64) | u128::from(lo))
}

/// A uniform draw in (0, 1].
pub fn unit_open<R: RngCore + ?Sized>(rng: &mut R) -> f64 {
    // 53 random bits; never exactly 0, so ln() is finite.
    ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
}

/// Exponential with this mean (ziggurat, `rand_distr::Exp1`).
pub fn exponential<R: RngCore + ?Sized>(rng: &mut R, mean: f64) -> f64 {
    let e: f64 = rand_distr::Exp1.sample(rng);
    mean * e
}

/// Standard normal (ziggurat, `rand_distr::StandardNormal`).
pub fn std_normal<R: RngCore + ?Sized>(rng: &mut R) -> f64 {
    rand_distr::StandardNormal.sample(rng)
}

/// Lognormal with this median and log-standard deviation.
pub fn lognormal<R: RngCore + ?Sized>(rng: &mut R, median: f64, sigma: f64) -> f64 {
    if sigma <= 0.0 {
        return median;
    }
    median * (sigma * std_normal(rng)).exp()
}

/// True with probability `p`.
pub fn bernoulli<R: RngCore + ?Sized>(rng: &mut R, p: f64) -> bool {
    p > 0.0 && rng.random::<f64>() < p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let mut a = stream(1, 0, StreamKind::Renter, 5);
        let mut b = stream(1, 0, StreamKind::Renter, 5);
        let mut c = stream(1, 0, StreamKind::Renter, 6);
        let mut d = stream(1, 1, StreamKind::Renter, 5);
        let mut e = stream(1, 0, StreamKind::Provider, 5);
        let x = a.next_u64();
        assert_eq!(x, b.next_u64());
        assert_ne!(x, c.next_u64());
        assert_ne!(x, d.next_u64());
        assert_ne!(x, e.next_u64());
    }

    #[test]
    fn distributions_have_roughly_the_right_centre() {
        let mut r = stream(9, 0, StreamKind::Market, 0);
        let n = 20_000;
        let mean = (0..n).map(|_| exponential(&mut r, 3.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 3.0).abs() < 0.15, "{mean}");
        let mut v: Vec<f64> = (0..n).map(|_| lognormal(&mut r, 10.0, 1.0)).collect();
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        assert!((median - 10.0).abs() < 0.6, "{median}");
    }
}
