//! The fixed-bucket histograms of the engine's metrics.

/// Buckets in seconds, shared by the TTFT and step-lag histograms.
pub const BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.0015, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

/// A fixed-bucket histogram (Prometheus style).
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    pub counts: [u64; BUCKETS.len()],
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    /// Upper bound of the bucket holding quantile `q`.
    pub fn quantile(&self, q: f64) -> f64 {
        let target = (q * self.count as f64).ceil() as u64;
        let mut cum = 0;
        for (b, n) in BUCKETS.iter().zip(&self.counts) {
            cum += n;
            if cum >= target {
                return *b;
            }
        }
        f64::INFINITY
    }
}
