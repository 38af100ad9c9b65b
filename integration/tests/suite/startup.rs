//! Starting Envoy: a port taken between picking it and Envoy binding it is tried again on other
//! ports; any other failure at startup is reported with what Envoy said, and not retried.

use std::cell::RefCell;

use kvroute_stack::envoy::Envoy;
use kvroute_stack::paths;
use kvroute_stack::stack::{filter_config, write_config, StackOptions, StackPorts};

/// Ports tried by `start_retrying_ports` and the config writer it is given.
fn writer<'a>(
    dir: &'a std::path::Path,
    tried: &'a RefCell<Vec<(u16, u16)>>,
    template: &'a str,
) -> impl FnMut(u16, u16) -> anyhow::Result<std::path::PathBuf> + 'a {
    // No worker needs to answer for Envoy to become ready.
    let addrs = vec!["127.0.0.1:9".to_string()];
    let filter = filter_config(&addrs, &StackOptions::default());
    move |admin, listen| {
        tried.borrow_mut().push((admin, listen));
        write_config(template, dir, StackPorts { admin, listen, updater: 9 }, &addrs, &filter)
    }
}

#[tokio::test]
async fn an_admin_port_taken_before_envoy_binds_it_is_replaced() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = paths::scratch_dir("taken-port").unwrap();
    let tried = RefCell::new(Vec::new());
    let first = (port, paths::free_port().unwrap());
    let config = writer(&dir, &tried, "least-request.yaml");
    let envoy = Envoy::start_retrying_ports(first, &dir, 1, config).await.unwrap();
    let tried = tried.into_inner();
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert_eq!(tried[0], first);
    assert_ne!(envoy.admin_port, port);
    assert_eq!((envoy.admin_port, envoy.listen_port), tried[1]);
    let ready = reqwest::get(format!("{}/ready", envoy.admin_url())).await.unwrap();
    assert!(ready.status().is_success());
    drop(taken);
}

#[tokio::test]
async fn a_bad_bootstrap_is_not_retried_and_envoy_s_complaint_is_shown() {
    let dir = paths::scratch_dir("bad-bootstrap").unwrap();
    std::fs::write(dir.join("bad.yaml"), "static_resources: {listeners: [{name: 7}]}\n").unwrap();
    let tried = RefCell::new(Vec::new());
    let mut write = writer(&dir, &tried, "least-request.yaml");
    let config = |admin, listen| {
        write(admin, listen)?;
        Ok(dir.join("bad.yaml"))
    };
    let first = (paths::free_port().unwrap(), paths::free_port().unwrap());
    let err = Envoy::start_retrying_ports(first, &dir, 1, config).await.err().unwrap();
    assert_eq!(tried.borrow().len(), 1);
    let said = format!("{err:#}");
    assert!(said.contains("did not become ready"), "{said}");
    assert!(said.contains("][critical]["), "Envoy's reason is not shown: {said}");
}
