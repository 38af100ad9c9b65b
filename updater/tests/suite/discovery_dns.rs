//! DNS discovery end to end on loopback: a DNS server in the test (a small UDP responder built
//! with hickory-proto) whose records the test changes, simulated workers on two loopback
//! addresses (127.0.71.2 and .3, the same ports, as pods behind a headless Service), and the
//! updater's discovery following the records: a record added brings a worker in (subscribed,
//! identified, in the snapshot of the pool), a record removed drops it and its knowledge.

use crate::common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use kvroute_core::decision::tokenize::model::ModelBundle;
use kvroute_sim::events::{EventConfig, EventEncoding, ReplyShape};
use kvroute_sim::profile::HardwareProfile;
use kvroute_sim::worker::{Ports, Worker, WorkerSpec};
use kvroute_updater::discovery::{self, DiscoveryConfig, Intervals};
use kvroute_updater::limits::Limits;
use kvroute_updater::models::Models;
use kvroute_updater::publish::Answer;
use kvroute_updater::state::State;
use serde_json::json;

/// Records by (lower-case name, type); a name with no records at all is NXDOMAIN.
type Zone = Arc<Mutex<BTreeMap<(String, RecordType), Vec<RData>>>>;

/// A UDP DNS server on 127.0.0.1 answering from `zone` (TTL 1 s); counts the queries.
struct Dns {
    addr: SocketAddr,
    zone: Zone,
    queries: Arc<Mutex<u64>>,
    _task: Task,
}

impl Dns {
    async fn start() -> Dns {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let zone: Zone = Arc::default();
        let queries = Arc::new(Mutex::new(0u64));
        let (z, q) = (Arc::clone(&zone), Arc::clone(&queries));
        let task = spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = sock.recv_from(&mut buf).await else { return };
                let Ok(req) = Message::from_vec(&buf[..n]) else { continue };
                *q.lock().unwrap() += 1;
                let reply = answer(&z, &req);
                let _ = sock.send_to(&reply.to_vec().unwrap(), from).await;
            }
        });
        Dns { addr, zone, queries, _task: task }
    }

    fn set(&self, name: &str, kind: RecordType, data: Vec<RData>) {
        let mut z = self.zone.lock().unwrap();
        if data.is_empty() {
            z.remove(&(name.to_lowercase(), kind));
        } else {
            z.insert((name.to_lowercase(), kind), data);
        }
    }

    fn set_a(&self, name: &str, ips: &[Ipv4Addr]) {
        self.set(name, RecordType::A, ips.iter().map(|ip| RData::A(A(*ip))).collect());
    }

    fn queries(&self) -> u64 {
        *self.queries.lock().unwrap()
    }
}

fn answer(zone: &Zone, req: &Message) -> Message {
    let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
    resp.metadata.message_type = MessageType::Response;
    resp.metadata.authoritative = true;
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    let z = zone.lock().unwrap();
    for q in &req.queries {
        resp.add_query(q.clone());
        let name = q.name().to_string().to_lowercase();
        match z.get(&(name.clone(), q.query_type())) {
            Some(data) => {
                for d in data {
                    resp.add_answer(Record::from_rdata(q.name().clone(), 1, d.clone()));
                }
            }
            None if z.keys().any(|(n, _)| *n == name) => {} // no data
            None => resp.metadata.response_code = ResponseCode::NXDomain,
        }
    }
    resp
}

const NAME: &str = "workers.kvroute.test.";

/// Two simulated workers of the demo model on 127.0.71.2 and 127.0.71.3, on the same ports.
async fn two_workers() -> (Vec<Arc<Worker>>, Ports) {
    let start = |ip: [u8; 4], ports: Ports| async move {
        let events = EventConfig {
            topic: String::new(),
            encoding: EventEncoding::Map,
            reply_shape: ReplyShape::Triple,
            buffer_steps: 1000,
        };
        let profile = HardwareProfile::load("llama3-8b-h100").unwrap();
        let spec = WorkerSpec {
            host: IpAddr::V4(Ipv4Addr::from(ip)),
            ..WorkerSpec::loopback("kvroute-demo", profile, events)
        };
        let w = Worker::new(spec, ModelBundle::demo().unwrap(), ports);
        let p = w.start().await.unwrap();
        (w, p)
    };
    let (a, ports) = start([127, 0, 71, 2], Ports::default()).await;
    let (b, _) = start([127, 0, 71, 3], Ports { admin: 0, ..ports }).await;
    (vec![a, b], ports)
}

fn listed(state: &State) -> Vec<(String, String, bool)> {
    let Answer::Full(s) = state.answer_with(None, None, true) else { panic!("a full snapshot") };
    s.workers.iter().map(|w| (w.worker.clone(), w.model.clone(), !w.gpu.is_empty())).collect()
}

fn member(state: &State, name: &str) -> bool {
    listed(state).iter().any(|(w, model, _)| w == name && model == "kvroute-demo")
        && state.status()["workers"][name]["connected"] == true
}

async fn chat(http: &str, text: &str) {
    let body = json!({"model": "kvroute-demo", "messages": [{"role": "user", "content": text}], "max_tokens": 2});
    let r = reqwest::Client::new()
        .post(format!("http://{http}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_records_bring_workers_in_and_take_them_out() {
    let dns = Dns::start().await;
    let (_workers, ports) = two_workers().await;
    let (a, b) = ("127.0.71.2", "127.0.71.3");
    let name = |ip: &str| format!("{ip}:{}", ports.http);
    dns.set_a(NAME, &[a.parse().unwrap()]);

    let models = Models::load(&["kvroute-demo".parse().unwrap()], &[]).unwrap();
    let state = Arc::new(State::for_models(Arc::new(models), Vec::new(), Limits::default()));
    let cfg = DiscoveryConfig {
        source: format!("dns:{NAME}").parse().unwrap(),
        dns_server: Some(dns.addr),
        http_port: Some(ports.http),
        events_port: Some(ports.events),
        replay_port: Some(ports.replay),
        min_ttl_ms: 100,
        max_ttl_ms: 500,
        site: Some("dc-1".into()),
        ..Default::default()
    };
    cfg.validate(0).unwrap();
    let intervals =
        Intervals { scrape: Duration::from_millis(100), align: Duration::from_secs(3600) };
    let st = Arc::clone(&state);
    let _discovery = spawn(async move {
        discovery::run(st, cfg, Vec::new(), intervals).await.unwrap();
    });

    // A is in: identified (its /v1/models), subscribed, listed with its model.
    assert!(until(20, || member(&state, &name(a))).await, "{:?}", state.status());
    assert_eq!(state.workers(), [name(a)]);
    assert!(state.snapshot().pool, "a discovered pool is flagged as the whole pool");
    chat(&name(a), &"a shared prefix long enough for blocks ".repeat(20)).await;
    assert!(until(10, || listed(&state).iter().any(|(w, _, held)| *w == name(a) && *held)).await);

    // B's record appears: B joins.
    let t = std::time::Instant::now();
    dns.set_a(NAME, &[a.parse().unwrap(), b.parse().unwrap()]);
    assert!(until(20, || member(&state, &name(b))).await, "{:?}", state.status());
    // Reported, not asserted (TTL ceiling 500 ms here, then the alignment check).
    eprintln!("record added -> identified member in the snapshot: {:?}", t.elapsed());
    let before = state.version();

    // A's record goes: A and its knowledge leave at once.
    let t = std::time::Instant::now();
    dns.set_a(NAME, &[b.parse().unwrap()]);
    assert!(until(10, || !state.workers().contains(&name(a))).await);
    eprintln!("record removed -> out of the snapshot: {:?}", t.elapsed());
    let now: Vec<String> = listed(&state).into_iter().map(|(w, _, _)| w).collect();
    assert_eq!(now, [name(b)], "the next snapshot no longer lists A");
    assert!(state.status()["workers"].get(name(a)).is_none());
    // A caller holding the earlier version gets a delta that removes A; an old caller (no
    // pool=1) gets A as an incompatible worker that holds nothing.
    let Answer::Delta(d) = state.answer_with(Some(before), None, true) else { panic!("a delta") };
    assert_eq!(d.removed, [name(a)]);
    assert!(d.pool);
    let Answer::Delta(old) = state.answer_with(Some(before), None, false) else {
        panic!("a delta")
    };
    assert!(old.removed.is_empty() && !old.pool);
    let gone = old.workers.iter().find(|w| w.worker == name(a)).unwrap();
    assert!(gone.reset && !gone.compatible && gone.gpu.add.is_empty());

    // The name disappears (NXDOMAIN): the pool is empty. It comes back: B again.
    dns.set(NAME, RecordType::A, vec![]);
    assert!(until(10, || state.workers().is_empty()).await);
    assert!(listed(&state).is_empty());
    dns.set_a(NAME, &[b.parse().unwrap()]);
    assert!(until(20, || member(&state, &name(b))).await);

    // Over HTTP: `pool=1` gets format 5 with the flag, a caller without it format 3.
    let (port, _server) = serve(Arc::clone(&state)).await;
    let get = |q: &'static str| async move {
        let r = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/v1/snapshot?{q}"))
            .header("x-kvroute-token", TOKEN)
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap().to_vec()
    };
    let (new, old) = (get("pool=1").await, get("since=0").await);
    assert_eq!((new[4], old[4]), (5, 3));
    let snap = kvroute_core::wire::snapshot::Snapshot::decode(&new).unwrap();
    assert!(snap.pool && snap.workers.iter().any(|w| w.worker == name(b)));
    assert!(!kvroute_core::wire::snapshot::Snapshot::decode(&old).unwrap().pool);
    // `placement=1`: the workers' placements (here the source's site), to that caller only.
    assert!(snap.placements.is_empty(), "not asked for");
    let placed = get("pool=1&placement=1").await;
    let placed = kvroute_core::wire::snapshot::Snapshot::decode(&placed).unwrap().placements;
    let sites: Vec<_> = placed.iter().map(|p| (p.worker.clone(), p.site.as_deref())).collect();
    assert_eq!(sites, [(name(b), Some("dc-1"))]);

    // Joins and departures are counted (A, B, B again; A, and B at NXDOMAIN).
    let pool = &state.status()["pool"];
    assert_eq!((pool["joined"].as_u64(), pool["left"].as_u64()), (Some(3), Some(2)));
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("kvroute_updater_pool_workers 1\n"), "{metrics}");
    assert!(metrics.contains("kvroute_updater_pool_left_total 2\n"));

    // The TTL (1 s, above the 500 ms ceiling) is cut to the ceiling: resolutions go on.
    let q = dns.queries();
    assert!(until(10, || dns.queries() >= q + 2).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_give_the_ports_and_failures_keep_the_pool() {
    let dns = Dns::start().await;
    let srv = |port: u16, target: &str| {
        RData::SRV(SRV::new(0, 0, port, Name::from_ascii(target).unwrap()))
    };
    dns.set(
        "_http._tcp.pool.kvroute.test.",
        RecordType::SRV,
        vec![srv(8000, "a.kvroute.test."), srv(8001, "b.kvroute.test.")],
    );
    dns.set_a("a.kvroute.test.", &["10.9.0.1".parse().unwrap()]);
    dns.set_a("b.kvroute.test.", &["10.9.0.2".parse().unwrap(), "10.9.0.3".parse().unwrap()]);
    let cfg = DiscoveryConfig {
        source: "dns+srv:_http._tcp.pool.kvroute.test.".parse().unwrap(),
        dns_server: Some(dns.addr),
        events_port: Some(5557),
        ..Default::default()
    };
    let r = discovery::dns::resolver(cfg.dns_server).unwrap();
    let found = discovery::dns::resolve(&r, &cfg).await.unwrap().unwrap();
    let ws = discovery::dns::workers(&cfg, &found.addrs);
    let names: Vec<&str> = ws.iter().map(|w| w.http.as_str()).collect();
    assert_eq!(names, ["10.9.0.1:8000", "10.9.0.2:8001", "10.9.0.3:8001"]);
    assert_eq!(ws[1].events.as_deref(), Some("tcp://10.9.0.2:5557"));
    assert_eq!(found.ttl, Some(Duration::from_secs(1)));

    // A server that does not answer: an error (the pool is kept by the caller), not an
    // empty pool.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let cfg = DiscoveryConfig { dns_server: Some(silent.local_addr().unwrap()), ..cfg };
    let r = discovery::dns::resolver(cfg.dns_server).unwrap();
    assert!(discovery::dns::resolve(&r, &cfg).await.unwrap().is_err());
}
