//! kvroute-updater binary: see the crate docs (`lib.rs`); flags and the config file in
//! [`kvroute_updater::cli`] and [`kvroute_updater::config`].

use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use kvroute_updater::cli::{resolve, Args, Resolved};
use kvroute_updater::conns;
use kvroute_updater::discovery::{self, Intervals};
use kvroute_updater::models::Models;
use kvroute_updater::state::State;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches)?;
    let Resolved { config, token, check } = resolve(&args, &matches)?;
    let models =
        Models::load(&config.model_specs(), &config.block_sizes()).context("loading the models")?;
    if check {
        print!("{}", config.to_toml());
        println!("# token: {} characters from {}", token.expose().chars().count(), token.source);
        println!("# configuration OK");
        return Ok(());
    }
    // Workers join through discovery (the static list at once).
    let state = Arc::new(State::for_models(Arc::new(models), Vec::new(), config.limits()));
    tokio::spawn(Arc::clone(&state).pace_loads());
    let intervals = Intervals { scrape: config.scrape_interval(), align: config.align_interval() };
    let discovered = tokio::spawn(discovery::run(
        Arc::clone(&state),
        config.discovery(),
        config.workers.clone(),
        intervals,
    ));
    if let Some(admin) = config.envoy_admin.clone() {
        tokio::spawn(kvroute_updater::scrape::run_membership(
            Arc::clone(&state),
            admin,
            config.envoy_cluster.clone(),
        ));
    }
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.context("binding the listen address")?;
    let nofile = conns::nofile_limit();
    let limits = config.conn_limits().clamped(nofile);
    let stats = Arc::new(conns::ConnStats::new(&limits, nofile));
    println!(
        "kvroute-updater listening on {} (at most {} connections, open files limit {})",
        listener.local_addr()?,
        limits.max_connections,
        nofile.map_or_else(|| "unknown".to_owned(), |n| n.to_string())
    );
    let app = kvroute_updater::server::router_with(state, token.expose(), Some(Arc::clone(&stats)));
    let serve = conns::serve(listener, app, token.expose(), limits, stats);
    tokio::select! {
        r = serve => r?,
        r = discovered => r.context("discovery stopped")?.context("discovery")?,
    }
    Ok(())
}
