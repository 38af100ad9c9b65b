//! kvroute-doctor: what of a kvroute deployment is missing or broken, in plain words. The
//! checks are `kvroute_updater::doctor::diagnose`; this binary only fetches what it reads.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kvroute_updater::doctor::{diagnose, Inputs};

/// Reads a running Envoy's admin (/config_dump, /stats, /server_info) and the updater's
/// /status, and prints one line per check: `ok` or `PROBLEM` and what to change. Exits 1 when
/// any problem is found.
#[derive(Parser, Debug)]
#[command(name = "kvroute-doctor", version, about)]
struct Args {
    /// Envoy's admin address, e.g. http://127.0.0.1:9901 (kubectl port-forward to the gateway
    /// pod's admin port).
    #[arg(long, value_name = "URL")]
    envoy_admin: String,
    /// kvroute-updater's address, e.g. http://127.0.0.1:9100.
    #[arg(long, value_name = "URL")]
    updater: Option<String>,
    /// Seconds to wait for each answer.
    #[arg(long, default_value_t = 5)]
    timeout_s: u64,
}

async fn get(http: &reqwest::Client, url: String) -> Option<String> {
    let r = http.get(&url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.text().await.ok()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout_s))
        .build()
        .context("building the HTTP client")?;
    let admin = args.envoy_admin.trim_end_matches('/');
    let json = |t: Option<String>| t.and_then(|t| serde_json::from_str(&t).ok());
    let inputs = Inputs {
        config_dump: json(get(&http, format!("{admin}/config_dump?include_eds")).await),
        stats: get(&http, format!("{admin}/stats?filter=kvroute")).await,
        server_info: json(get(&http, format!("{admin}/server_info")).await),
        updater_status: match &args.updater {
            Some(u) => json(get(&http, format!("{}/status", u.trim_end_matches('/'))).await),
            None => None,
        },
        updater_asked: args.updater.is_some(),
    };
    let findings = diagnose(&inputs);
    let problems = findings.iter().filter(|f| !f.ok).count();
    for f in &findings {
        println!("{} {}", if f.ok { "ok     " } else { "PROBLEM" }, f.text);
    }
    if problems == 0 {
        println!("ok: kvroute is deployed as it needs to be");
        Ok(())
    } else {
        println!("{problems} problem(s) found");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn help_is_complete() {
        let cmd = super::Args::command();
        cmd.clone().debug_assert();
        assert!(cmd.get_about().is_some());
        for a in cmd.get_arguments().filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        {
            assert!(a.get_help().is_some(), "{} has no help", a.get_id());
        }
    }
}
