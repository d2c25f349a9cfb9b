//! Which key each request uses: uniform over `n` keys, or zipf with exponent `s` (a few hot
//! tenants and a long tail, the noisy-neighbour shape).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Every key equally often.
    Uniform,
    /// Key `i` (from 0) drawn in proportion to `1 / (i + 1)^s`.
    Zipf(f64),
    /// Client `c` always uses key `c mod n` (one tenant per client, as in pagebench).
    PerClient,
}

/// Draws key indexes in `0..keys`, reproducibly from a seed.
#[derive(Debug, Clone)]
pub struct KeySampler {
    keys: u64,
    zipf: Option<Zipf<f64>>,
    /// The one key of a per-client sampler.
    fixed: Option<u64>,
    rng: SmallRng,
}

/// Why a key distribution cannot be sampled.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KeyError {
    /// No keys to draw from.
    #[error("the key count must be at least 1")]
    NoKeys,
    /// A zipf exponent that is negative or not a number.
    #[error("the zipf exponent must be a number ≥ 0, not {0}")]
    Exponent(f64),
}

impl KeySampler {
    /// A sampler over `keys` keys drawn by `distribution`, seeded with `seed` (a client's
    /// index: [`KeyDistribution::PerClient`] keeps to key `seed mod keys`).
    pub fn new(keys: u64, distribution: KeyDistribution, seed: u64) -> Result<Self, KeyError> {
        if keys == 0 {
            return Err(KeyError::NoKeys);
        }
        let zipf = match distribution {
            KeyDistribution::Uniform | KeyDistribution::PerClient => None,
            KeyDistribution::Zipf(s) => {
                Some(Zipf::new(keys as f64, s).map_err(|_| KeyError::Exponent(s))?)
            }
        };
        Ok(KeySampler {
            keys,
            zipf,
            fixed: (distribution == KeyDistribution::PerClient).then_some(seed % keys),
            rng: SmallRng::seed_from_u64(seed),
        })
    }

    /// The next key's index.
    pub fn next_index(&mut self) -> u64 {
        if let Some(key) = self.fixed {
            return key;
        }
        match &self.zipf {
            // Zipf draws 1..=n; key 0 is the hottest.
            Some(zipf) => (zipf.sample(&mut self.rng) as u64 - 1).min(self.keys - 1),
            None => self.rng.random_range(0..self.keys),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_client_sampler_keeps_to_its_clients_key() {
        for (client, key) in [(0, 0), (3, 3), (52, 2)] {
            let mut sampler = KeySampler::new(50, KeyDistribution::PerClient, client).unwrap();
            assert!((0..100).all(|_| sampler.next_index() == key));
        }
    }

    fn counts(sampler: &mut KeySampler, keys: usize, draws: usize) -> Vec<u64> {
        let mut counts = vec![0u64; keys];
        for _ in 0..draws {
            counts[sampler.next_index() as usize] += 1;
        }
        counts
    }

    #[test]
    fn uniform_keys_are_drawn_evenly() {
        let mut sampler = KeySampler::new(10, KeyDistribution::Uniform, 7).unwrap();
        let counts = counts(&mut sampler, 10, 100_000);
        for (key, &n) in counts.iter().enumerate() {
            assert!((9_000..=11_000).contains(&n), "key {key} drawn {n} times");
        }
    }

    #[test]
    fn zipf_keys_follow_the_power_law() {
        let mut sampler = KeySampler::new(100, KeyDistribution::Zipf(1.2), 7).unwrap();
        let counts = counts(&mut sampler, 100, 200_000);
        // P(0) / P(1) = 2^1.2 ≈ 2.30 and P(0) / P(9) = 10^1.2 ≈ 15.8.
        let first_over_second = counts[0] as f64 / counts[1] as f64;
        let first_over_tenth = counts[0] as f64 / counts[9] as f64;
        assert!(
            (2.1..2.5).contains(&first_over_second),
            "{first_over_second}"
        );
        assert!(
            (13.5..18.5).contains(&first_over_tenth),
            "{first_over_tenth}"
        );
    }

    #[test]
    fn bad_distributions_are_refused_by_name() {
        assert_eq!(
            KeySampler::new(0, KeyDistribution::Uniform, 1).unwrap_err(),
            KeyError::NoKeys
        );
        let error = KeySampler::new(5, KeyDistribution::Zipf(-1.0), 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the zipf exponent must be a number ≥ 0, not -1"
        );
    }
}
