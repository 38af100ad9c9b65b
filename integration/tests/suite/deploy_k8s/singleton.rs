//! The singleton bootstrap service each Envoy side embeds: its configuration, cluster, token,
//! vm_id and module file, checked against the filter and the proxy that runs it.

use anyhow::{anyhow, ensure, Context};
use kvroute_core::decision::config::SnapshotSyncConfig;
use serde_json::Value;

use crate::deploy_k8s::checks::{
    istio_wasm_filter, proxies, secret_env, str_or, TEST_TOKEN, TOKEN_ENV,
};
use crate::deploy_k8s::manifests::{at, by_field, find, only, str_at, Doc};

/// Each Envoy side's bootstrap addition, the vm_id its filter VM gets, and its proxy container.
pub fn singletons(docs: &[Doc]) -> anyhow::Result<Vec<(Value, String, Value)>> {
    let proxies = proxies(docs)?;
    // Istio: the ConfigMap the gateway pods' bootstrapOverride annotation names.
    let gw = find(docs, "Deployment", "kvroute-gateway")?;
    let cm_name = gw
        .body
        .pointer("/spec/template/metadata/annotations/sidecar.istio.io~1bootstrapOverride")
        .and_then(Value::as_str)
        .context("the Istio gateway pods have no sidecar.istio.io/bootstrapOverride")?;
    let cm = find(docs, "ConfigMap", cm_name)?;
    let y: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(str_at(cm, "/data/custom_bootstrap.json")?)?;
    let istio = serde_json::to_value(y)?;
    let istio_vm = istio_wasm_filter(docs)?
        .pointer("/typed_config/config/vm_config/vm_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let ep = find(docs, "EnvoyProxy", "kvroute-proxy")?;
    ensure!(str_at(ep, "/spec/bootstrap/type")? == "Merge", "EnvoyProxy bootstrap is not a Merge");
    let y: serde_yaml_ng::Value = serde_yaml_ng::from_str(str_at(ep, "/spec/bootstrap/value")?)?;
    let eg = serde_json::to_value(y)?;
    let eep = only(docs, "EnvoyExtensionPolicy")?;
    // Envoy Gateway names a policy's wasm VM envoyextensionpolicy/<ns>/<name>/wasm/<index>.
    let eg_vm = crate::deploy_k8s::xds::eg_wasm_name(eep, 0);
    Ok(vec![(istio, istio_vm, proxies[0].1.clone()), (eg, eg_vm, proxies[1].1.clone())])
}

/// The singleton's configuration parses, names a cluster of its fragment, reads the token the
/// proxy has, shares the filter's vm_id, and loads the filter's image from the mounted volume.
pub fn singleton(docs: &[Doc], fragment: &Value, vm_id: &str, proxy: &Value) -> anyhow::Result<()> {
    let exts = fragment.get("bootstrap_extensions").context("no bootstrap_extensions")?;
    let svc = by_field(exts, "name", "envoy.bootstrap.wasm")?
        .get("typed_config")
        .context("typed_config")?;
    ensure!(
        svc.get("singleton") == Some(&Value::Bool(true)),
        "the wasm service is not a singleton"
    );
    let vm = svc.pointer("/config/vm_config").context("no vm_config")?;
    let cfg_text = svc
        .pointer("/config/configuration/value")
        .and_then(Value::as_str)
        .context("configuration")?;
    let env = |k: &str| (k == TOKEN_ENV).then(|| TEST_TOKEN.to_owned());
    let cfg = SnapshotSyncConfig::from_json(cfg_text.as_bytes(), &env)?
        .ok_or_else(|| anyhow!("the singleton's configuration is not a snapshot_sync"))?;
    let clusters = fragment.pointer("/static_resources/clusters").context("no clusters")?;
    by_field(clusters, "name", &cfg.cluster)
        .with_context(|| format!("singleton cluster {}", cfg.cluster))?;
    ensure!(cfg.token_env.as_deref() == Some(TOKEN_ENV), "singleton token_env is not {TOKEN_ENV}");
    let keys = vm.pointer("/environment_variables/host_env_keys").and_then(Value::as_array);
    ensure!(
        keys.is_some_and(|k| k.iter().any(|x| x == TOKEN_ENV)),
        "{TOKEN_ENV} not in host_env_keys"
    );
    secret_env(proxy, TOKEN_ENV)?;
    let their_vm = vm.get("vm_id").and_then(Value::as_str).unwrap_or("");
    ensure!(!vm_id.is_empty(), "the filter's vm_id is empty");
    ensure!(their_vm == vm_id, "singleton vm_id '{their_vm}' is not the filter's '{vm_id}'");
    let file = vm.pointer("/code/local/filename").and_then(Value::as_str).context("code.local")?;
    let (dir, name) = file.rsplit_once('/').context("filename")?;
    ensure!(name == "plugin.wasm", "the image holds plugin.wasm, the singleton loads {name}");
    let m =
        by_field(proxy.get("volumeMounts").context("proxy: no volumeMounts")?, "mountPath", dir)?;
    let vol_name = str_or(m, "name")?;
    let volumes = if proxy.get("name").and_then(Value::as_str) == Some("istio-proxy") {
        at(find(docs, "Deployment", "kvroute-gateway")?, "/spec/template/spec/volumes")?
    } else {
        at(
            find(docs, "EnvoyProxy", "kvroute-proxy")?,
            "/spec/provider/kubernetes/envoyDeployment/pod/volumes",
        )?
    };
    let image =
        by_field(volumes, "name", vol_name)?.pointer("/image/reference").and_then(Value::as_str);
    let filter_image = filter_image(docs)?;
    ensure!(
        image == Some(filter_image.as_str()),
        "the singleton's image {image:?} is not the filter's {filter_image}"
    );
    Ok(())
}

/// The filter image: the Istio gateway's volume holding the file the filter loads, and the
/// EnvoyExtensionPolicy's image, the same.
pub fn filter_image(docs: &[Doc]) -> anyhow::Result<String> {
    let file = istio_wasm_filter(docs)?
        .pointer("/typed_config/config/vm_config/code/local/filename")
        .and_then(Value::as_str)
        .context("the Istio wasm filter does not load a local file")?;
    let (dir, _) = file.rsplit_once('/').context("filename")?;
    let gw = find(docs, "Deployment", "kvroute-gateway")?;
    let c = by_field(at(gw, "/spec/template/spec/containers")?, "name", "istio-proxy")?;
    let m =
        by_field(c.get("volumeMounts").context("istio-proxy: no volumeMounts")?, "mountPath", dir)?;
    let v = by_field(at(gw, "/spec/template/spec/volumes")?, "name", str_or(m, "name")?)?;
    let istio =
        v.pointer("/image/reference").and_then(Value::as_str).context("not an image volume")?;
    let eep = only(docs, "EnvoyExtensionPolicy")?;
    ensure!(str_at(eep, "/spec/wasm/0/code/image/url")? == istio, "the two filter images differ");
    Ok(istio.to_owned())
}
