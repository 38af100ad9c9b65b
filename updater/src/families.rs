//! A Prometheus registry's families, as the `/metrics` writers fill them (the state's in
//! [`crate::server::metrics`], the connections' in [`crate::conns`]).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A gauge holding a fraction or seconds.
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Registers families on a registry and hands back a handle to fill them.
pub struct Families<'r>(pub &'r mut Registry);

impl Families<'_> {
    pub fn counter<L>(&mut self, name: &str, help: &str) -> Family<L, Counter>
    where
        L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        let f = Family::<L, Counter>::default();
        self.0.register(name, help, f.clone());
        f
    }

    pub fn gauge<L>(&mut self, name: &str, help: &str) -> Family<L, Gauge>
    where
        L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        let f = Family::<L, Gauge>::default();
        self.0.register(name, help, f.clone());
        f
    }

    pub fn float_gauge<L>(&mut self, name: &str, help: &str) -> Family<L, FloatGauge>
    where
        L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        let f = Family::<L, FloatGauge>::default();
        self.0.register(name, help, f.clone());
        f
    }

    /// An unlabelled counter at `n`.
    pub fn count(&mut self, name: &str, help: &str, n: u64) {
        let c = Counter::<u64>::default();
        c.inc_by(n);
        self.0.register(name, help, c);
    }

    /// An unlabelled gauge at `n`.
    pub fn level(&mut self, name: &str, help: &str, n: u64) {
        let g = Gauge::<i64>::default();
        g.set(clamp(n));
        self.0.register(name, help, g);
    }
}

/// A count as a gauge value (saturating).
pub fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
