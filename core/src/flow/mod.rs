//! A request's and the snapshot-sync singleton's state machines, without I/O: the filter
//! (`kvroute-filter`) feeds them host values and events and carries out what they decide.
//!
//! - [`lifecycle`]: one request through the filter: [`lifecycle::Intake`] (route it or not,
//!   wait for the body, refuse it, decide) and [`lifecycle::Lifecycle`] (a routed request's
//!   routing credit, load and passive health marks until its stream ends, as ordered
//!   [`lifecycle::Effect`]s).
//! - [`admission`]: a decided request's deadline and class: reordered, or shed with a 429.
//! - [`claim`]: a decision's new request written into the thread's load shard, ordered against
//!   the other threads' decisions of the same instant (ranked again when one came between).
//! - [`sync`]: the singleton's scheduler ([`sync::SyncFlow`]): the updater's long poll, peer
//!   reports and bundle downloads, over a small host trait ([`sync::SyncHost`]).

pub mod admission;
pub mod claim;
pub mod lifecycle;
pub mod sync;

#[cfg(test)]
mod tests;
