//! What the HTTP-level tests share: a demo-model worker at the 8B profile in real time.

use std::sync::Arc;

use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::events::{EventConfig, EventEncoding, ReplyShape};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};

pub const MODEL: &str = "kvroute-demo";

/// A worker serving the demo bundle on loopback (not started yet).
pub fn demo_worker() -> Arc<Worker> {
    let events = EventConfig {
        topic: String::new(),
        encoding: EventEncoding::Array,
        reply_shape: ReplyShape::Pair,
        buffer_steps: 100,
    };
    let profile = HardwareProfile::load("llama3-8b-h100").unwrap();
    let spec = WorkerSpec { speedup: 1.0, ..WorkerSpec::loopback(MODEL, profile, events) };
    Worker::new(spec, ModelBundle::demo().unwrap(), Ports::default())
}
