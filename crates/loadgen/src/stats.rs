//! Latency samples and the summary the load generator prints.

use serde::Serialize;

/// Latency samples of one request kind, in microseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// Unsorted samples (µs); sorted on [`Samples::summary`].
    micros: Vec<u32>,
}

/// Percentiles of one request kind (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    /// Number of samples.
    pub count: usize,
    /// Median (ms).
    pub p50_ms: f64,
    /// 99th percentile (ms).
    pub p99_ms: f64,
    /// Largest sample (ms).
    pub max_ms: f64,
}

impl Samples {
    /// Records one request that took `micros` µs (saturating at `u32::MAX`).
    pub fn push(&mut self, micros: u128) {
        self.micros.push(u32::try_from(micros).unwrap_or(u32::MAX));
    }

    /// Appends another worker's samples.
    pub fn merge(&mut self, other: &Samples) {
        self.micros.extend_from_slice(&other.micros);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.micros.len()
    }

    /// p50/p99/max by the nearest-rank method; zeros when empty.
    pub fn summary(&mut self) -> Latency {
        self.micros.sort_unstable();
        let ms = |us: u32| f64::from(us) / 1000.0;
        Latency {
            count: self.micros.len(),
            p50_ms: ms(nearest_rank(&self.micros, 50.0)),
            p99_ms: ms(nearest_rank(&self.micros, 99.0)),
            max_ms: ms(self.micros.last().copied().unwrap_or(0)),
        }
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted samples; 0 when empty.
pub fn nearest_rank(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_of_one_to_hundred_is_the_percentile_itself() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50.0), 50);
        assert_eq!(nearest_rank(&v, 99.0), 99);
        assert_eq!(nearest_rank(&v, 100.0), 100);
        assert_eq!(nearest_rank(&[], 50.0), 0);
        assert_eq!(nearest_rank(&[7], 99.0), 7);
    }

    #[test]
    fn summary_reports_milliseconds_from_merged_samples() {
        let mut a = Samples::default();
        let mut b = Samples::default();
        for us in [1_000u128, 3_000] {
            a.push(us);
        }
        b.push(2_000);
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 3);
        assert_eq!(s.p50_ms, 2.0);
        assert_eq!(s.max_ms, 3.0);
    }
}
