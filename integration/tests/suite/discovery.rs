//! Membership that follows the pool, end to end with real Envoy: a DNS server in the test
//! (a UDP responder built with hickory-proto) names the workers; Envoy's `workers` cluster is
//! STRICT_DNS on that name through c-ares pointed at the test's server; kvroute-updater runs
//! with `--discover dns:NAME` against the same server; the filter's configured pool names the
//! first worker only (the fallback). A record added must bring the new worker traffic (through
//! the updater's pool); a record removed must take it away. Measured and printed (not
//! asserted): the time from the record change to the first request served by the new worker,
//! and the number of requests the filter still sent to the removed worker.
//!
//! Needs the filter to ask the updater for the pool (`pool=1` on `/v1/snapshot`).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use kvroute_stack::client::chat;
use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::process::Guard;
use kvroute_stack::stack::{filter_config, write_config_text, StackOptions, StackPorts};
use serde_json::json;

const NAME: &str = "workers.kvroute.test.";

/// A UDP DNS server answering A queries for [`NAME`] (TTL 1 s) from a list the test changes.
struct Dns {
    addr: SocketAddr,
    ips: Arc<Mutex<Vec<Ipv4Addr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Dns {
    async fn start(ips: &[Ipv4Addr]) -> anyhow::Result<Dns> {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
        let addr = sock.local_addr()?;
        let list = Arc::new(Mutex::new(ips.to_vec()));
        let l = Arc::clone(&list);
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = sock.recv_from(&mut buf).await else { return };
                let Ok(req) = Message::from_vec(&buf[..n]) else { continue };
                let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
                resp.metadata.message_type = MessageType::Response;
                resp.metadata.authoritative = true;
                resp.metadata.recursion_desired = req.metadata.recursion_desired;
                let ips = l.lock().map(|v| v.clone()).unwrap_or_default();
                for q in &req.queries {
                    resp.add_query(q.clone());
                    let ours = q.name().to_string().eq_ignore_ascii_case(NAME);
                    if !ours || ips.is_empty() {
                        resp.metadata.response_code = ResponseCode::NXDomain;
                    } else if q.query_type() == RecordType::A {
                        for ip in &ips {
                            resp.add_answer(Record::from_rdata(
                                q.name().clone(),
                                1,
                                RData::A(A(*ip)),
                            ));
                        }
                    }
                }
                if let Ok(bytes) = resp.to_vec() {
                    let _ = sock.send_to(&bytes, from).await;
                }
            }
        });
        Ok(Dns { addr, ips: list, task })
    }

    fn set(&self, ips: &[Ipv4Addr]) {
        if let Ok(mut v) = self.ips.lock() {
            *v = ips.to_vec();
        }
    }
}

/// A simulated worker on `host` (ports 0: free ones); its HTTP, events and replay ports.
async fn sim(
    host: Ipv4Addr,
    ports: Option<(u16, u16, u16)>,
    dir: &std::path::Path,
) -> anyhow::Result<(Guard, (u16, u16, u16))> {
    let (h, e, r) = ports.unwrap_or((0, 0, 0));
    let mut cmd = tokio::process::Command::new(paths::sim_bin()?);
    cmd.args(["--workers", "1", "--host", &host.to_string()])
        .args(["--base-port", &h.to_string(), "--events-base-port", &e.to_string()])
        .args(["--replay-base-port", &r.to_string()]);
    let mut g = Guard::spawn(&format!("sim-{host}"), cmd, &dir.join(format!("sim-{host}.log")))?;
    let line = g.wait_line("listening on", Duration::from_secs(30)).await?;
    let after = |k: &str| -> anyhow::Result<&str> {
        let mut w = line.split_whitespace();
        w.find(|x| *x == k).context("sim line")?;
        w.next().context("sim line")
    };
    let http: SocketAddr = after("on")?.parse()?;
    Ok((g, (http.port(), after("events")?.parse()?, after("replay")?.parse()?)))
}

/// Envoy's template with the `workers` cluster resolved from [`NAME`] by c-ares at `dns`.
fn strict_dns(template: &str, dns: SocketAddr, port: u16) -> anyhow::Result<String> {
    let from = "  - name: workers\n    type: STATIC\n";
    anyhow::ensure!(template.contains(from), "kvroute.yaml has no STATIC workers cluster");
    let to = format!(
        "  - name: workers\n    type: STRICT_DNS\n    dns_refresh_rate: 1s\n    respect_dns_ttl: true\n    \
         dns_lookup_family: V4_ONLY\n    typed_dns_resolver_config:\n      name: envoy.network.dns_resolver.cares\n      \
         typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig\n        \
         resolvers: [{{ socket_address: {{ address: {}, port_value: {} }} }}]\n        \
         use_resolvers_as_fallback: false\n",
        dns.ip(),
        dns.port()
    );
    let eps = "      - lb_endpoints: ${ENDPOINTS}";
    anyhow::ensure!(template.contains(eps), "kvroute.yaml has no ${{ENDPOINTS}}");
    let host = NAME.trim_end_matches('.');
    let named = format!(
        "      - lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }} }}]"
    );
    Ok(template.replace(from, &to).replace(eps, &named))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_membership_reaches_envoy_and_the_filter() -> anyhow::Result<()> {
    let dir = paths::scratch_dir("discovery")?;
    let (a, b): (Ipv4Addr, Ipv4Addr) = ("127.0.74.2".parse()?, "127.0.74.3".parse()?);
    let (_sim_a, ports) = sim(a, None, &dir).await?;
    let (_sim_b, _) = sim(b, Some(ports), &dir).await?;
    let (http, events, replay) = ports;
    let (wa, wb) = (format!("{a}:{http}"), format!("{b}:{http}"));
    let dns = Dns::start(&[a]).await?;

    let p = StackPorts {
        admin: paths::free_port()?,
        listen: paths::free_port()?,
        updater: paths::free_port()?,
    };
    let mut cmd = tokio::process::Command::new(paths::updater_bin()?);
    cmd.args(["--listen", &format!("127.0.0.1:{}", p.updater)])
        .args(["--token", kvroute_stack::stack::UPDATER_TOKEN])
        .args(["--discover", &format!("dns:{NAME}")])
        .args(["--discover-dns-server", &dns.addr.to_string()])
        .args(["--discover-http-port", &http.to_string()])
        .args(["--discover-events-port", &events.to_string()])
        .args(["--discover-replay-port", &replay.to_string()])
        .args(["--discover-min-ttl-ms", "200", "--discover-max-ttl-ms", "1000"]);
    let mut updater = Guard::spawn("kvroute-updater", cmd, &dir.join("updater.log"))?;
    updater.wait_line("listening on", Duration::from_secs(30)).await?;

    // The filter's configured pool names A only: the fallback while the updater sends none.
    let filter = filter_config(std::slice::from_ref(&wa), &StackOptions::default());
    let template = std::fs::read_to_string(paths::repo_root().join("envoy/kvroute.yaml"))?;
    let text = strict_dns(&template, dns.addr, http)?;
    let config =
        write_config_text("kvroute.yaml", &text, &dir, p, std::slice::from_ref(&wa), &filter)?;
    let envoy = Envoy::start(&config, p.admin, p.listen, &dir, 2).await?;
    let client = reqwest::Client::new();
    let mut n = 0u64;
    let mut ask = || {
        n += 1;
        let body = json!({"model": "kvroute-demo", "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("request {n}: a prompt of its own")}]});
        let (client, url) = (client.clone(), envoy.base_url());
        async move { chat(&client, &url, &body).await }
    };
    let served = |r: &kvroute_stack::client::Reply| r.worker.clone().unwrap_or_default();

    // Only A exists: everything goes to A.
    for _ in 0..10 {
        let r = ask().await?;
        anyhow::ensure!(r.status == 200, "status {}", r.status);
    }

    // B's record appears: the first request B serves.
    let t = Instant::now();
    dns.set(&[a, b]);
    let mut first_b = None;
    let mut sent = 0;
    while t.elapsed() < Duration::from_secs(30) {
        let r = ask().await?;
        sent += 1;
        if served(&r) == wb {
            first_b = Some(t.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_b = first_b.context("B never served a request after its record appeared")?;
    println!(
        "record added -> first request served by the new worker: {first_b:?} ({sent} requests)"
    );

    // Both serve: the filter's pool is A and B (B was not in its configured pool).
    let mut by_worker: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..30 {
        *by_worker.entry(served(&ask().await?)).or_default() += 1;
    }
    println!("with both records, 30 requests served by: {by_worker:?}");
    anyhow::ensure!(by_worker.len() == 2, "both workers serve: {by_worker:?}");
    // The discovered worker has its own stats (defined on first use, not at configure).
    let seg = wb.replace(['.', ':'], "_");
    let decisions = format!("kvroute_worker_decisions{{kvroute_worker=\"{seg}\"}}");
    let m = envoy.prometheus().await?;
    anyhow::ensure!(m.get(&decisions).copied().unwrap_or(0.0) >= 1.0, "no {decisions}");

    // A's record goes: requests the filter still sends to A, until 20 in a row avoid it.
    let t = Instant::now();
    dns.set(&[b]);
    let (mut to_a, mut streak, mut last_a) = (0u32, 0u32, Duration::ZERO);
    while streak < 20 && t.elapsed() < Duration::from_secs(30) {
        let r = ask().await?;
        if served(&r) == wa {
            to_a += 1;
            streak = 0;
            last_a = t.elapsed();
        } else {
            streak += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::ensure!(streak >= 20, "A still got requests 30 s after its record went");
    println!("record removed -> {to_a} requests still went to the removed worker, the last after {last_a:?}");
    drop(envoy);
    updater.kill().await;
    Ok(())
}
