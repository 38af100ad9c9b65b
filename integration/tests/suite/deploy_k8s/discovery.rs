//! The updater follows the pool (`--discover`) instead of a static `--worker` list: the source
//! names the Service the gateways route to and its HTTP port is that route's port (the filter
//! names workers `ip:port` as the route's cluster lists them); the NetworkPolicy opens the
//! discovered workers' HTTP, event and replay ports and the API server; the RBAC grants exactly
//! what the source reads, bound to the ServiceAccount the updater's Deployment runs as, whose
//! token the pod mounts. And the built updater accepts the manifest's flags (`--check`).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use anyhow::{bail, ensure, Context};
use kvroute_core::decision::config::FilterConfig;
use kvroute_stack::paths;
use serde_json::{json, Value};

use crate::deploy_k8s::checks::{flag_values, updater_args, updater_container};
use crate::deploy_k8s::manifests::{at, find, Doc};

/// The API server's ports the NetworkPolicy opens: the `kubernetes` Service's, and the one it
/// is usually translated to before egress rules apply.
pub const API_SERVER_PORTS: [u16; 2] = [443, 6443];

/// A `--discover` source the manifests may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeSource {
    /// `kube:NAMESPACE/SERVICE`.
    Kube { namespace: String, service: String },
    /// `kube-pool:NAMESPACE/POOL`.
    KubePool { namespace: String, pool: String },
}

impl KubeSource {
    fn parse(s: &str) -> anyhow::Result<KubeSource> {
        let split = |rest: &str| -> anyhow::Result<(String, String)> {
            let (ns, name) = rest.split_once('/').with_context(|| format!("'{s}': no NS/NAME"))?;
            ensure!(!ns.is_empty() && !name.is_empty(), "'{s}': empty namespace or name");
            Ok((ns.to_owned(), name.to_owned()))
        };
        if let Some(rest) = s.strip_prefix("kube:") {
            let (namespace, service) = split(rest)?;
            return Ok(KubeSource::Kube { namespace, service });
        }
        if let Some(rest) = s.strip_prefix("kube-pool:") {
            let (namespace, pool) = split(rest)?;
            return Ok(KubeSource::KubePool { namespace, pool });
        }
        bail!("--discover={s}: the Kubernetes examples discover with kube: or kube-pool:")
    }

    fn namespace(&self) -> &str {
        match self {
            KubeSource::Kube { namespace, .. } | KubeSource::KubePool { namespace, .. } => {
                namespace
            }
        }
    }

    /// What the source reads: (API group, resource, verb), as RBAC spells them.
    pub fn grants(&self) -> BTreeSet<(String, String, String)> {
        let g = |group: &str, res: &str, verb: &str| (group.into(), res.into(), verb.into());
        match self {
            KubeSource::Kube { .. } => BTreeSet::from([
                g("discovery.k8s.io", "endpointslices", "list"),
                g("discovery.k8s.io", "endpointslices", "watch"),
            ]),
            KubeSource::KubePool { .. } => BTreeSet::from([
                g("inference.networking.k8s.io", "inferencepools", "get"),
                g("", "pods", "list"),
                g("", "pods", "watch"),
            ]),
        }
    }
}

/// The updater's discovery flags, as the Deployment passes them.
#[derive(Debug, Clone)]
pub struct Discovery {
    pub source: KubeSource,
    pub http: u16,
    pub events: u16,
    pub replay: u16,
}

fn one_port(args: &[(String, Option<String>)], flag: &str) -> anyhow::Result<u16> {
    let v = flag_values(args, flag);
    ensure!(v.len() == 1, "the updater needs exactly one --{flag} (has {})", v.len());
    v[0].parse().with_context(|| format!("--{flag}={}: not a port", v[0]))
}

/// The Deployment's `--discover*` flags; no `--worker` beside them.
pub fn discovery(docs: &[Doc]) -> anyhow::Result<Discovery> {
    let args = updater_args(docs)?;
    let listed = flag_values(&args, "worker");
    ensure!(listed.is_empty(), "the updater lists --worker {listed:?} and discovers: choose one");
    let src = flag_values(&args, "discover");
    ensure!(src.len() == 1, "the updater needs exactly one --discover (has {src:?})");
    Ok(Discovery {
        source: KubeSource::parse(&src[0])?,
        http: one_port(&args, "discover-http-port")?,
        events: one_port(&args, "discover-events-port")?,
        replay: one_port(&args, "discover-replay-port")?,
    })
}

/// Everything about discovery that must agree across the manifests.
pub fn check(docs: &[Doc], cfgs: &[(String, FilterConfig)]) -> anyhow::Result<()> {
    let d = discovery(docs)?;
    if let KubeSource::Kube { namespace, service } = &d.source {
        routes(docs, namespace, service, d.http)?;
    }
    fallback_workers(cfgs, d.http)?;
    egress(docs, &d)?;
    rbac(docs, &d.source)?;
    Ok(())
}

/// `kube:NS/SVC` is the Service both gateways route to, on the discovered HTTP port (the
/// EndpointSlices carry the pods' ports; the examples' Service maps 8000 to 8000).
fn routes(docs: &[Doc], ns: &str, svc: &str, http: u16) -> anyhow::Result<()> {
    let host = format!("{svc}.{ns}.svc.cluster.local");
    let vs = find(docs, "VirtualService", "inference")?;
    let mut n = 0;
    for h in at(vs, "/spec/http")?.as_array().into_iter().flatten() {
        for r in h.get("route").and_then(Value::as_array).into_iter().flatten() {
            let dest = r.get("destination").context("VirtualService route without destination")?;
            ensure!(
                dest.get("host").and_then(Value::as_str) == Some(&host),
                "VirtualService routes to {:?}, the updater discovers {host}",
                dest.get("host")
            );
            ensure!(
                dest.pointer("/port/number").and_then(Value::as_u64) == Some(http.into()),
                "VirtualService port {:?} != --discover-http-port {http}",
                dest.pointer("/port/number")
            );
            n += 1;
        }
    }
    ensure!(n > 0, "the VirtualService routes nowhere");
    let rt = find(docs, "HTTPRoute", "inference")?;
    let mut n = 0;
    for rule in at(rt, "/spec/rules")?.as_array().into_iter().flatten() {
        for b in rule.get("backendRefs").and_then(Value::as_array).into_iter().flatten() {
            let bns = b.get("namespace").and_then(Value::as_str).unwrap_or(&rt.namespace);
            ensure!(
                b.get("name").and_then(Value::as_str) == Some(svc) && bns == ns,
                "HTTPRoute backend {:?} in {bns} is not the discovered Service {ns}/{svc}",
                b.get("name")
            );
            ensure!(
                b.get("port").and_then(Value::as_u64) == Some(http.into()),
                "HTTPRoute backend port {:?} != --discover-http-port {http}",
                b.get("port")
            );
            n += 1;
        }
    }
    ensure!(n > 0, "the HTTPRoute has no backend");
    let ef = find(docs, "EnvoyFilter", "kvroute")?;
    let cluster = at(ef, "/spec/configPatches")?
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p.get("applyTo").and_then(Value::as_str) == Some("CLUSTER"))
        .and_then(|p| p.pointer("/match/cluster"))
        .context("EnvoyFilter kvroute: no CLUSTER patch match")?;
    ensure!(
        cluster.get("service").and_then(Value::as_str) == Some(&host)
            && cluster.get("portNumber").and_then(Value::as_u64) == Some(http.into()),
        "EnvoyFilter CLUSTER patch matches {cluster}, the updater discovers {host}:{http}"
    );
    Ok(())
}

/// The filters' configured workers (the fallback while the updater sends no pool) are
/// endpoints of the same cluster: `ip:` the discovered HTTP port.
fn fallback_workers(cfgs: &[(String, FilterConfig)], http: u16) -> anyhow::Result<()> {
    for (what, c) in cfgs {
        for w in c.models.iter().flat_map(|m| &m.workers) {
            let a: SocketAddr = w.parse().with_context(|| format!("{what}: worker {w}"))?;
            ensure!(
                a.port() == http,
                "{what}: fallback worker {w} is not on --discover-http-port {http}"
            );
        }
    }
    Ok(())
}

fn ports(rule: &Value) -> anyhow::Result<BTreeSet<u16>> {
    let mut out = BTreeSet::new();
    for p in rule.get("ports").and_then(Value::as_array).into_iter().flatten() {
        out.insert(p.get("port").and_then(Value::as_u64).context("egress port")? as u16);
    }
    Ok(out)
}

/// The updater may reach exactly the discovered workers' three ports (a rule to pods) and the
/// API server (a rule to addresses, not pods).
fn egress(docs: &[Doc], d: &Discovery) -> anyhow::Result<()> {
    let np = find(docs, "NetworkPolicy", "kvroute-updater")?;
    let (mut to_pods, mut to_api) = (BTreeSet::new(), BTreeSet::new());
    for rule in at(np, "/spec/egress")?.as_array().into_iter().flatten() {
        let to = rule.get("to").and_then(Value::as_array).cloned().unwrap_or_default();
        let pods = !to.is_empty() && to.iter().all(|t| t.get("podSelector").is_some());
        let mut p = ports(rule)?;
        if pods {
            to_pods.append(&mut p);
        } else {
            to_api.append(&mut p);
        }
    }
    let workers = BTreeSet::from([d.http, d.events, d.replay]);
    ensure!(
        to_pods == workers,
        "NetworkPolicy egress to pods opens {to_pods:?}, the discovered workers use {workers:?}"
    );
    let api = BTreeSet::from(API_SERVER_PORTS);
    ensure!(
        to_api == api,
        "NetworkPolicy egress to the API server opens {to_api:?}, not {api:?} (discovery \
         watches the API server)"
    );
    Ok(())
}

/// Every (group, resource, verb) a Role grants; wildcards and resourceNames are refused (the
/// grant must be exactly what the source reads).
fn role_grants(role: &Doc) -> anyhow::Result<BTreeSet<(String, String, String)>> {
    let mut out = BTreeSet::new();
    for r in at(role, "/rules")?.as_array().into_iter().flatten() {
        ensure!(r.get("resourceNames").is_none(), "Role {}: resourceNames", role.name);
        let list = |k: &str| -> anyhow::Result<Vec<String>> {
            let v: Vec<String> = serde_json::from_value(r.get(k).cloned().unwrap_or(json!([])))?;
            ensure!(!v.iter().any(|x| x == "*"), "Role {}: {k} has a wildcard", role.name);
            Ok(v)
        };
        for g in list("apiGroups")? {
            for res in list("resources")? {
                for v in list("verbs")? {
                    out.insert((g.clone(), res.clone(), v));
                }
            }
        }
    }
    Ok(out)
}

/// The Deployment runs as a ServiceAccount of its namespace whose token it mounts; the Roles
/// bound to it in the discovered namespace grant exactly what the source reads.
fn rbac(docs: &[Doc], source: &KubeSource) -> anyhow::Result<()> {
    let (dep, _) = updater_container(docs)?;
    let spec = at(dep, "/spec/template/spec")?;
    let sa_name = spec.get("serviceAccountName").and_then(Value::as_str).context(
        "the updater's Deployment names no serviceAccountName (it would run as default)",
    )?;
    let sa = find(docs, "ServiceAccount", sa_name)?;
    ensure!(
        sa.namespace == dep.namespace,
        "ServiceAccount {sa_name} is in {}, the updater in {}",
        sa.namespace,
        dep.namespace
    );
    // The pod's setting wins over the ServiceAccount's; both absent: mounted.
    let mounted = spec
        .get("automountServiceAccountToken")
        .or_else(|| sa.body.get("automountServiceAccountToken"))
        .map_or(Some(true), Value::as_bool);
    let own_token = !flag_values(&updater_args(docs)?, "discover-kube-token-file").is_empty();
    ensure!(
        mounted == Some(true) || own_token,
        "the updater's pod does not mount its service account token (automountServiceAccountToken)"
    );
    let ns = source.namespace();
    let mut granted = BTreeSet::new();
    let mut bindings = 0;
    for rb in docs.iter().filter(|d| d.kind == "RoleBinding" && d.namespace == ns) {
        let subjects = at(rb, "/subjects")?.as_array().context("subjects")?;
        let binds = subjects.iter().any(|s| {
            s.get("kind").and_then(Value::as_str) == Some("ServiceAccount")
                && s.get("name").and_then(Value::as_str) == Some(sa_name)
                && s.get("namespace").and_then(Value::as_str) == Some(&sa.namespace)
        });
        if !binds {
            continue;
        }
        bindings += 1;
        let r = at(rb, "/roleRef")?;
        ensure!(
            r.get("apiGroup").and_then(Value::as_str) == Some("rbac.authorization.k8s.io")
                && r.get("kind").and_then(Value::as_str) == Some("Role"),
            "RoleBinding {}: roleRef is not a Role",
            rb.name
        );
        let name = r.get("name").and_then(Value::as_str).context("roleRef.name")?;
        let role = docs
            .iter()
            .find(|d| d.kind == "Role" && d.name == name && d.namespace == ns)
            .with_context(|| format!("RoleBinding {}: no Role {name} in {ns}", rb.name))?;
        granted.append(&mut role_grants(role)?);
    }
    ensure!(bindings > 0, "no RoleBinding in {ns} binds ServiceAccount {}/{sa_name}", sa.namespace);
    let want = source.grants();
    ensure!(
        granted == want,
        "the updater's Roles in {ns} grant {granted:?}; --discover={source:?} needs exactly {want:?}"
    );
    Ok(())
}

/// The updater's arguments with each path under one of its volume mounts moved to a local
/// stand-in: the token Secret's file holds a test token, a model directory under the tokenizer
/// volume is the repository's demo tokenizer bundle.
fn local_args(docs: &[Doc], dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let (_, c) = updater_container(docs)?;
    let args: Vec<String> = serde_json::from_value(c.get("args").cloned().context("no args")?)?;
    let demo = paths::repo_root().join("assets/demo-model");
    let mut out = Vec::new();
    for a in args {
        if let Some(path) = a.strip_prefix("--token-file=") {
            let local = dir.join("token");
            std::fs::write(&local, crate::deploy_k8s::checks::TEST_TOKEN)?;
            ensure!(path.starts_with('/'), "--token-file={path}: not an absolute path");
            out.push(format!("--token-file={}", local.display()));
        } else if let Some(spec) = a.strip_prefix("--model=") {
            let Some((name, path)) = spec.split_once('=') else {
                out.push(a);
                continue;
            };
            let mounts = c.get("volumeMounts").context("no volumeMounts")?;
            let mount = mounts
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("mountPath").and_then(Value::as_str))
                .find(|m| path.starts_with(&format!("{m}/")))
                .with_context(|| format!("--model dir {path} is under no volume mount"))?;
            let local = dir.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&local)?;
            for f in ["tokenizer.json", "tokenizer_config.json"] {
                std::fs::copy(demo.join(f), local.join(f))?;
            }
            eprintln!("--model {name}: {path} (under {mount}) -> the demo bundle");
            out.push(format!("--model={name}={}", local.display()));
        } else {
            out.push(a);
        }
    }
    Ok(out)
}

/// `kvroute-updater --check` with the manifest's flags: valid, and the resolved `[discovery]`
/// is the source and ports the manifests agree on.
#[test]
fn the_built_updater_accepts_the_manifest_flags() {
    let docs = crate::deploy_k8s::docs();
    let d = discovery(&docs).unwrap();
    let dir = paths::scratch_dir("deploy-k8s-check").unwrap();
    let args = local_args(&docs, &dir).unwrap();
    let bin = paths::updater_bin().expect("kvroute-updater (./dev build)");
    let out = std::process::Command::new(bin).args(&args).arg("--check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kvroute-updater --check {args:?} failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("# configuration OK"), "{text}");
    let resolved: toml::Value = toml::from_str(&text).unwrap();
    let disc = resolved.get("discovery").expect("no [discovery] in the resolved configuration");
    let source = match &d.source {
        KubeSource::Kube { namespace, service } => format!("kube:{namespace}/{service}"),
        KubeSource::KubePool { namespace, pool } => format!("kube-pool:{namespace}/{pool}"),
    };
    assert_eq!(disc.get("source").and_then(toml::Value::as_str), Some(source.as_str()));
    for (k, v) in [("http_port", d.http), ("events_port", d.events), ("replay_port", d.replay)] {
        assert_eq!(disc.get(k).and_then(toml::Value::as_integer), Some(v.into()), "{k}");
    }
    let workers = resolved.get("workers").and_then(toml::Value::as_array);
    assert!(workers.is_none_or(|w| w.is_empty()), "the resolved configuration lists workers");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each change breaks one discovery agreement; the checks must fail, naming it.
#[test]
fn a_wrong_discovery_or_rbac_field_is_caught() {
    use crate::deploy_k8s::{doc_mut, set};
    let help = crate::deploy_k8s::updater_help_flags();
    let server = crate::deploy_k8s::server_rs();
    let base = crate::deploy_k8s::docs();
    crate::deploy_k8s::checks::check_all(&base, &help, &server)
        .expect("the committed manifests agree");
    const ARGS: &str = "/spec/template/spec/containers/0/args";
    type Mutate = Box<dyn Fn(&mut Vec<Doc>)>;
    let arg = |from: &'static str, to: Option<&'static str>| -> Mutate {
        Box::new(move |d: &mut Vec<Doc>| {
            let args = doc_mut(d, "Deployment", "kvroute-updater")
                .pointer_mut(ARGS)
                .unwrap()
                .as_array_mut()
                .unwrap();
            let i = args.iter().position(|a| a == from).unwrap_or_else(|| panic!("no {from}"));
            match to {
                Some(to) => args[i] = json!(to),
                None => {
                    args.remove(i);
                }
            }
        })
    };
    let role_rule = |edit: fn(&mut Value)| -> Mutate {
        Box::new(move |d: &mut Vec<Doc>| edit(doc_mut(d, "Role", "kvroute-updater-discovery")))
    };
    let mutations: Vec<(&str, &str, Mutate)> = vec![
        (
            "another Service",
            "VirtualService routes to",
            arg("--discover=kube:inference/vllm", Some("--discover=kube:inference/other")),
        ),
        (
            "another HTTP port",
            "--discover-http-port 8001",
            arg("--discover-http-port=8000", Some("--discover-http-port=8001")),
        ),
        ("no events port", "--discover-events-port", arg("--discover-events-port=5557", None)),
        (
            "a --worker beside discovery",
            "choose one",
            Box::new(|d| {
                doc_mut(d, "Deployment", "kvroute-updater")
                    .pointer_mut(ARGS)
                    .unwrap()
                    .as_array_mut()
                    .unwrap()
                    .push(json!("--worker=10.0.1.11:8000"))
            }),
        ),
        (
            "a fallback worker on another port",
            "fallback worker",
            Box::new(|d| {
                let eep = d.iter_mut().find(|d| d.kind == "EnvoyExtensionPolicy").unwrap();
                eep.body["spec"]["wasm"][0]["config"]["models"][0]["workers"][0] =
                    json!("10.0.1.11:8001");
            }),
        ),
        (
            "NetworkPolicy without the replay port",
            "egress to pods",
            Box::new(|d| {
                doc_mut(d, "NetworkPolicy", "kvroute-updater")["spec"]["egress"][0]["ports"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            }),
        ),
        (
            "NetworkPolicy without the API server",
            "egress to the API server",
            Box::new(|d| {
                doc_mut(d, "NetworkPolicy", "kvroute-updater")["spec"]["egress"]
                    .as_array_mut()
                    .unwrap()
                    .truncate(1);
            }),
        ),
        (
            "Role grants get too",
            "needs exactly",
            role_rule(|r| r["rules"][0]["verbs"] = json!(["get", "list", "watch"])),
        ),
        (
            "Role without watch",
            "needs exactly",
            role_rule(|r| r["rules"][0]["verbs"] = json!(["list"])),
        ),
        (
            "Role on the core group",
            "needs exactly",
            role_rule(|r| r["rules"][0]["apiGroups"] = json!([""])),
        ),
        (
            "Role with a wildcard",
            "wildcard",
            role_rule(|r| r["rules"][0]["resources"] = json!(["*"])),
        ),
        (
            "Role in another namespace",
            "no Role",
            Box::new(|d| {
                let r = d.iter_mut().find(|d| d.kind == "Role").unwrap();
                r.namespace = "default".into();
                r.body["metadata"]["namespace"] = json!("default");
            }),
        ),
        (
            "RoleBinding to another ServiceAccount",
            "binds ServiceAccount",
            Box::new(|d| {
                set(d, "RoleBinding", "kvroute-updater-discovery", "/subjects/0/name", json!("x"))
            }),
        ),
        (
            "RoleBinding to another Role",
            "no Role",
            Box::new(|d| {
                set(d, "RoleBinding", "kvroute-updater-discovery", "/roleRef/name", json!("x"))
            }),
        ),
        (
            "Deployment without its ServiceAccount",
            "serviceAccountName",
            Box::new(|d| {
                doc_mut(d, "Deployment", "kvroute-updater")["spec"]["template"]["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("serviceAccountName");
            }),
        ),
        (
            "the token not mounted",
            "automountServiceAccountToken",
            Box::new(|d| {
                set(
                    d,
                    "Deployment",
                    "kvroute-updater",
                    "/spec/template/spec/automountServiceAccountToken",
                    json!(false),
                )
            }),
        ),
    ];
    for (what, named, mutate) in mutations {
        let mut docs = base.clone();
        mutate(&mut docs);
        let r = crate::deploy_k8s::checks::check_all(&docs, &help, &server);
        let e = format!("{:#}", r.expect_err(what));
        assert!(e.contains(named), "{what}: caught, but not by name ('{named}'): {e}");
        eprintln!("{what}: {e}");
    }
}
