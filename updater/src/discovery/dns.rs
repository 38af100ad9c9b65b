//! DNS discovery (`dns:NAME`, `dns+srv:NAME`) with hickory-resolver: the A and AAAA records
//! of a name (a Kubernetes headless Service lists its ready pods so) on the configured HTTP
//! port, or the SRV records of a name (each target's addresses on the record's port).
//! Resolved again when the shortest TTL of the answer runs out, never sooner than the floor
//! nor later than the ceiling. An answer without records (NXDOMAIN, no data) is an empty
//! pool; a failed resolution (timeout, refused) keeps the pool as it was and tries again at
//! the floor.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use thiserror::Error;
use tokio::sync::watch;

use super::WorkerEntry;
use super::{log_line, DiscoveryConfig, DiscoverySource};

/// Why DNS discovery could not start.
#[derive(Debug, Error)]
pub enum DnsError {
    #[error("building the DNS resolver: {0}")]
    Resolver(#[source] NetError),
    #[error("DNS discovery needs a dns: or dns+srv: source")]
    NotDns,
}

/// What one resolution found: every worker's HTTP address, and how long the answer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub addrs: BTreeSet<SocketAddr>,
    /// The shortest TTL of the records used (`None`: no records).
    pub ttl: Option<Duration>,
}

/// A resolver asking `server` (UDP, then TCP for long answers), or the system's resolvers.
/// Answers are not cached: each resolution asks the server.
pub fn resolver(server: Option<SocketAddr>) -> Result<TokioResolver, DnsError> {
    let builder = match server {
        Some(addr) => {
            let conn = |mut c: ConnectionConfig| {
                c.port = addr.port();
                c
            };
            let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
            ns.connections = vec![conn(ConnectionConfig::udp()), conn(ConnectionConfig::tcp())];
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![ns]),
                TokioRuntimeProvider::default(),
            )
        }
        None => TokioResolver::builder_tokio().map_err(DnsError::Resolver)?,
    };
    let mut opts = ResolverOpts::default();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.cache_size = 0;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    builder.with_options(opts).build().map_err(DnsError::Resolver)
}

fn min_ttl(ttls: impl Iterator<Item = u32>) -> Option<Duration> {
    ttls.min().map(|t| Duration::from_secs(u64::from(t)))
}

/// The A and AAAA records of `name`, each on `port`.
pub async fn resolve_ip(r: &TokioResolver, name: &str, port: u16) -> Result<Found, NetError> {
    match r.lookup_ip(name).await {
        Ok(l) => Ok(Found {
            addrs: l.iter().map(|ip| SocketAddr::new(ip, port)).collect(),
            ttl: min_ttl(l.as_lookup().answers().iter().map(|a| a.ttl)),
        }),
        Err(e) if e.is_no_records_found() => Ok(Found { addrs: BTreeSet::new(), ttl: None }),
        Err(e) => Err(e),
    }
}

/// The SRV records of `name`: each target's A and AAAA records on the record's port.
pub async fn resolve_srv(r: &TokioResolver, name: &str) -> Result<Found, NetError> {
    let srv = match r.lookup(name, RecordType::SRV).await {
        Ok(l) => l,
        Err(e) if e.is_no_records_found() => {
            return Ok(Found { addrs: BTreeSet::new(), ttl: None });
        }
        Err(e) => return Err(e),
    };
    let mut found = Found { addrs: BTreeSet::new(), ttl: None };
    let mut ttls: Vec<u32> = Vec::new();
    for rec in srv.answers() {
        let RData::SRV(s) = &rec.data else { continue };
        ttls.push(rec.ttl);
        let target = s.target.to_string();
        let ips = resolve_ip(r, &target, s.port).await?;
        found.addrs.extend(ips.addrs);
        ttls.extend(ips.ttl.map(|t| t.as_secs().min(u64::from(u32::MAX)) as u32));
    }
    found.ttl = min_ttl(ttls.into_iter());
    Ok(found)
}

/// Resolves the configured source once.
pub async fn resolve(
    r: &TokioResolver,
    cfg: &DiscoveryConfig,
) -> Result<Result<Found, NetError>, DnsError> {
    Ok(match &cfg.source {
        DiscoverySource::Dns(name) => resolve_ip(r, name, cfg.http_port.unwrap_or(80)).await,
        DiscoverySource::DnsSrv(name) => resolve_srv(r, name).await,
        _ => return Err(DnsError::NotDns),
    })
}

/// The workers at `addrs`, named and given endpoints by `cfg`.
pub fn workers(cfg: &DiscoveryConfig, addrs: &BTreeSet<SocketAddr>) -> Vec<WorkerEntry> {
    addrs.iter().map(|a| cfg.worker(canonical(a.ip()), a.port())).collect()
}

/// An IPv4 address mapped into IPv6 is named as IPv4 (as Envoy names it).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Resolves again and again, sending each new set of workers; never returns unless the
/// resolver cannot be built or nobody listens any more.
pub async fn run(
    cfg: &DiscoveryConfig,
    tx: watch::Sender<Option<Vec<WorkerEntry>>>,
) -> Result<(), DnsError> {
    let r = resolver(cfg.dns_server)?;
    let (floor, ceiling) = cfg.ttl_bounds();
    let mut failing = false;
    loop {
        let wait = match resolve(&r, cfg).await? {
            Ok(found) => {
                if std::mem::take(&mut failing) {
                    log_line(&format!("{}: resolving again", cfg.source));
                }
                let want = workers(cfg, &found.addrs);
                tx.send_if_modified(|cur| {
                    let changed = cur.as_ref() != Some(&want);
                    *cur = Some(want);
                    changed
                });
                found.ttl.unwrap_or(floor).clamp(floor, ceiling)
            }
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    log_line(&format!("{}: {e}; the pool stays as it was", cfg.source));
                }
                floor
            }
        };
        if tx.is_closed() {
            return Ok(());
        }
        tokio::time::sleep(wait).await;
    }
}
