//! Every integration test in one binary (one link instead of one per file: the suite's debug
//! binaries are large, and CI builds them on 2 cores). Each module is one concern; run one with
//! `cargo test -p kvroute-integration --test suite <module>::`. They run with
//! `--test-threads=1` in `./dev test`: each starts its own Envoy, updater and workers.

mod bad_input;
mod bundles;
mod calibration;
mod compose;
mod configs;
mod dashboard;
mod deploy_k8s;
mod discovery;
mod dynamo;
mod engine_sglang;
mod engine_vllm;
mod failsafe;
mod filter_bench;
mod health;
mod knowledge;
mod last_token;
mod layout;
mod lora;
mod misdeploy;
mod models;
mod peers;
mod prefill_ends;
mod priority;
mod replicas;
mod robustness;
mod routing;
mod schema;
mod sdk;
mod shedding;
mod siege;
mod siege_envoy;
mod siege_updater;
mod startup;
mod topology_eval;
mod topology_route;
mod topology_sim;
mod up;
