//! kvroute-updater: the knowledge plane's daemon. It follows each worker's KV-event stream,
//! re-hashes every stored block canonically (kvroute's chain hash over the token ids, seeded by
//! the cache domain), and serves the result as versioned snapshots.
//!
//! Where to start: [`subscriber::follow`] runs per worker (SUB socket, gaps, replay, resync);
//! [`ingest::WorkerKnowledge`] applies decoded batches ([`decode`]); [`state::State`] holds all
//! workers and the snapshot version; [`alignment`] checks each worker's announced config;
//! [`server`] is the HTTP surface.

pub mod alignment;
pub mod decode;
pub mod ingest;
pub mod publish;
pub mod scrape;
pub mod server;
pub mod state;
pub mod subscriber;
