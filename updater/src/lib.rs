//! kvroute-updater: the knowledge plane's daemon. It follows each worker's KV-event stream,
//! re-hashes every stored block canonically (kvroute's chain hash over the token ids, seeded by
//! the cache domain), and serves the result as versioned snapshots.
//!
//! Where to start: [`subscriber::follow`] runs per worker (SUB socket, gaps, [`replay`],
//! resync), behind a [`frameguard`] that bounds what the ZMQ codec may allocate;
//! [`ingest::WorkerKnowledge`] applies decoded batches ([`decode`]) to a bounded
//! [`blocks::BlockIndex`]; [`limits`] holds every bound and the counters of its hits;
//! [`state::State`] holds all workers, the models they serve ([`models`]: bundles, block
//! sizes) and the snapshot version; [`alignment`] identifies each worker's model and checks its
//! announced config; [`peers`] keeps other Envoy replicas' recent decisions; [`server`] is
//! the HTTP surface (snapshots with long polls, peer reports, bundles), served by [`conns`]
//! within connection bounds (header and idle timeouts, a cap under the open-files limit); [`config`] and [`cli`]
//! resolve the settings from a TOML file and the flags; [`discovery`] keeps the worker set (a
//! static list, DNS, or a Kubernetes Service's EndpointSlices) and each worker's tasks.

pub mod alignment;
pub mod blocks;
pub mod cli;
pub mod config;
pub mod conns;
pub mod decode;
pub mod discovery;
pub mod doctor;
pub mod engine_metrics;
pub mod families;
pub mod frameguard;
pub mod http_body;
pub mod ingest;
pub mod limits;
pub mod models;
pub mod peers;
pub mod publish;
pub mod ratelog;
pub mod replay;
pub mod scrape;
pub mod server;
pub mod state;
pub mod subscriber;
pub mod worker_check;
