//! A fixed-size histogram of `u64` samples (times in microseconds, fuel):
//! a replay reads millions of messages, and a rollout's window counts every
//! call, and keeping one figure per message to sort at the end grew without
//! bound. Buckets are log-linear, 16 to
//! each power of two, so a quantile read from it is within 1/32 (about 3 %)
//! of a sample's true value at any scale, and the whole histogram is under
//! 8 KiB however many samples it took.

/// Buckets for each power of two: 2^SUB_BITS.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Values below `SUB` have a bucket each; every power of two above has SUB.
const BUCKETS: usize = (SUB + (64 - SUB_BITS as u64) * SUB) as usize;

/// Counts of samples by bucket, with the exact count, minimum and maximum.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: Box::new([0; BUCKETS]),
            count: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("median", &self.quantile(0.5))
            .field("max", &self.max())
            .finish()
    }
}

/// The bucket of `value`.
fn bucket(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let shift = 63 - value.leading_zeros() - SUB_BITS;
    // The leading bit and the SUB_BITS after it: SUB..2*SUB.
    let top = value >> shift;
    (SUB + u64::from(shift) * SUB + (top - SUB)) as usize
}

/// The smallest and largest value of bucket `index`.
fn bounds(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < SUB {
        return (index, index);
    }
    let shift = (index - SUB) / SUB;
    let top = SUB + (index - SUB) % SUB;
    let low = top << shift;
    (low, low + ((1u64 << shift) - 1))
}

impl Histogram {
    pub fn record(&mut self, value: u64) {
        self.counts[bucket(value)] += 1;
        self.count += 1;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// The value below which a share `q` (0 to 1) of the samples fall: the
    /// middle of the bucket holding that sample, kept within the smallest
    /// and largest seen. `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        // The rank (1-based) of the sample wanted, as `sorted[len * q]` has it.
        let rank = ((self.count as f64 * q.clamp(0.0, 1.0)) as u64 + 1).min(self.count);
        let mut seen = 0;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, high) = bounds(index);
                let middle = low + (high - low) / 2;
                return Some(middle.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_whose_bounds_hold_it() {
        let mut values: Vec<u64> = (0..5000).collect();
        values.extend((0..64).map(|p| 1u64 << p));
        values.extend((1..64).map(|p| (1u64 << p) - 1));
        values.push(u64::MAX);
        for value in values {
            let index = bucket(value);
            assert!(index < BUCKETS, "{value}");
            let (low, high) = bounds(index);
            assert!(low <= value && value <= high, "{value}: {low}..={high}");
            // Within 1/16 of the value: the middle is within 1/32.
            assert!(high - low <= value / SUB, "{value}: {low}..={high}");
        }
    }

    /// The quantiles of a million samples come out within 1/32 of the exact
    /// ones (what sorting every sample gave), from a histogram whose size
    /// does not depend on how many it took.
    #[test]
    fn quantiles_are_within_a_thirty_second_of_the_exact_ones() {
        let mut histogram = Histogram::default();
        let mut samples = Vec::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..1_000_000 {
            // A skewed spread of times: 10 µs to about 100 ms.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let value = 10 + (x % 1000).pow(2) / 10;
            histogram.record(value);
            samples.push(value);
        }
        samples.sort_unstable();
        for q in [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let exact = samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
            let estimate = histogram.quantile(q).unwrap();
            let error = estimate.abs_diff(exact) as f64 / exact as f64;
            assert!(error <= 1.0 / 32.0, "q {q}: {estimate} for {exact}");
        }
        assert_eq!(histogram.count(), 1_000_000);
        assert_eq!(histogram.max(), samples.last().copied());
        assert!(std::mem::size_of_val(&*histogram.counts) < 8 * 1024);
    }

    #[test]
    fn an_empty_histogram_has_no_quantile_and_one_sample_is_its_own() {
        let mut histogram = Histogram::default();
        assert_eq!(histogram.quantile(0.5), None);
        histogram.record(1234);
        assert_eq!(histogram.quantile(0.5), Some(1234));
        assert_eq!(histogram.quantile(0.99), Some(1234));
    }
}
