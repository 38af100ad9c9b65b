//! `kvroute-updater --check`: validates a configuration, prints it without the token and exits
//! without binding anything.

use std::path::PathBuf;
use std::process::Command;

const TOKEN: &str = "check-test-token-0123456789";

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvroute-check-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn check_prints_the_resolved_config_and_binds_nothing() {
    let dir = scratch("ok");
    std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
    // A port held by this test: an updater that tried to listen on it would fail.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let config = dir.join("updater.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ntoken_file = \"token\"\nscrape_interval_ms = 250\n\
             [[workers]]\nhttp = \"127.0.0.1:8000\"\nevents = \"tcp://127.0.0.1:5557\"\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-updater"))
        .arg("--config")
        .arg(&config)
        .args(["--align-interval-ms", "700", "--check"])
        .env_remove("KVROUTE_UPDATER_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--check failed: {stdout}\n{stderr}");
    assert!(!stdout.contains(TOKEN) && !stderr.contains(TOKEN), "the token was printed");
    for want in [
        format!("listen = \"127.0.0.1:{port}\""),
        "scrape_interval_ms = 250".into(),
        "align_interval_ms = 700".into(),
        "configuration OK".into(),
    ] {
        assert!(stdout.contains(&want), "no `{want}` in:\n{stdout}");
    }
    assert!(!stdout.contains("listening on"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_fails_clearly_on_a_bad_config() {
    let dir = scratch("bad");
    let config = dir.join("updater.toml");
    std::fs::write(&config, "[[workers]]\nhttp = \"127.0.0.1:8000\"\nlisten_port = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-updater"))
        .arg("--config")
        .arg(&config)
        .args(["--token", TOKEN, "--check"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("listen_port"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-updater"))
        .args(["--worker", "127.0.0.1:8000", "--check"])
        .env_remove("KVROUTE_UPDATER_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no token"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
