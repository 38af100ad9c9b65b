//! kvroute-updater binary: see the crate docs (`lib.rs`); flags and the config file in
//! [`kvroute_updater::cli`] and [`kvroute_updater::config`].

use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use kvroute_updater::cli::{resolve, Args, Resolved};
use kvroute_updater::models::Models;
use kvroute_updater::state::State;
use kvroute_updater::subscriber::follow;

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
    let eps = config.endpoints();
    let names: Vec<String> = eps.iter().map(|(w, _)| w.clone()).collect();
    let state =
        Arc::new(State::for_models(Arc::new(models), names.iter().cloned(), config.limits()));
    for ep in eps.into_iter().filter_map(|(_, ep)| ep) {
        tokio::spawn(follow(Arc::clone(&state), ep));
    }
    tokio::spawn(kvroute_updater::scrape::run_scrape(
        Arc::clone(&state),
        names.clone(),
        config.scrape_interval(),
    ));
    if let Some(admin) = config.envoy_admin.clone() {
        tokio::spawn(kvroute_updater::scrape::run_membership(
            Arc::clone(&state),
            admin,
            config.envoy_cluster.clone(),
            names.clone(),
        ));
    }
    tokio::spawn(kvroute_updater::alignment::run(
        Arc::clone(&state),
        names,
        config.align_interval(),
    ));
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.context("binding the listen address")?;
    println!("kvroute-updater listening on {}", listener.local_addr()?);
    axum::serve(listener, kvroute_updater::server::router(state, token.expose())).await?;
    Ok(())
}
