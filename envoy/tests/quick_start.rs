//! What the service says when its rules are not where the variables point: a warning at
//! start-up naming `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY` and the directory looked at when it
//! does not exist or holds no domain, and one warning per unknown domain asked for. Without
//! them, rules mounted in the wrong place answer `OK` to every call in silence.

#![cfg(test)]

use rl_testkit as common;
mod support;

use support::{one, Service};

const RULES: &str = "
domain: known
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
";

fn redis_url(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

fn warnings_with(log: &str, text: &str) -> usize {
    log.lines()
        .filter(|l| l.to_ascii_lowercase().contains("warn") && l.contains(text))
        .count()
}

#[test]
fn a_runtime_directory_that_does_not_exist_is_named_at_startup() {
    let redis = common::Server::start();
    let root = tempfile::tempdir().expect("temp dir");
    let missing = root.path().join("nowhere");
    let service = Service::try_start_in(
        root,
        &redis_url(redis.port),
        &[
            ("RUNTIME_ROOT", missing.to_str().expect("utf-8 path")),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ],
    )
    .expect("the service starts without rules");
    let log = service.log();
    let looked_at = missing.join("ratelimit").join("config");
    let line = log
        .lines()
        .find(|l| l.contains("no config directory at"))
        .unwrap_or_else(|| panic!("no warning about the missing directory: {log}"));
    assert!(
        line.contains(&looked_at.display().to_string()),
        "names the path looked at: {line}"
    );
    assert!(line.contains("RUNTIME_ROOT=") && line.contains("RUNTIME_SUBDIRECTORY=\"ratelimit\""));
    assert_eq!(warnings_with(&log, "no config directory at"), 1, "{log}");
}

#[test]
fn an_empty_runtime_directory_warns_and_a_loaded_domain_does_not() {
    let redis = common::Server::start();
    let empty = Service::start(&redis_url(redis.port), &[], &[]);
    let log = empty.log();
    let dir = Service::config_dir(empty.root.path());
    let line = log
        .lines()
        .find(|l| l.contains("no domain in"))
        .unwrap_or_else(|| panic!("no warning about the empty directory: {log}"));
    assert!(line.contains(&dir.display().to_string()), "{line}");
    assert!(line.contains("RUNTIME_ROOT="), "{line}");

    let loaded = Service::start(&redis_url(redis.port), &[("rules.yaml", RULES)], &[]);
    let log = loaded.log();
    assert_eq!(warnings_with(&log, "no domain in"), 0, "{log}");
    assert_eq!(warnings_with(&log, "no config directory"), 0, "{log}");
}

#[test]
fn each_unknown_domain_is_warned_about_once() {
    let redis = common::Server::start();
    let service = Service::start(&redis_url(redis.port), &[("rules.yaml", RULES)], &[]);
    for _ in 0..3 {
        let r = service.json(&one("typo", &[("user", "a")]));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["overallCode"], "OK");
    }
    service.json(&one("other", &[("user", "a")]));
    // A known domain is not an unknown one.
    service.json(&one("known", &[("user", "a")]));
    let log = service.log();
    assert_eq!(
        warnings_with(&log, "\"typo\" is not in the config"),
        1,
        "{log}"
    );
    assert_eq!(
        warnings_with(&log, "\"other\" is not in the config"),
        1,
        "{log}"
    );
    assert_eq!(
        warnings_with(&log, "\"known\" is not in the config"),
        0,
        "{log}"
    );
}

/// The `ENV NAME=value` lines of the service's image.
fn image_env() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/images/envoy.Containerfile"
    );
    let text = std::fs::read_to_string(path).expect("envoy.Containerfile");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("ENV "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Where docs/deploy.md's podman command mounts the rules inside the container.
fn deploy_doc_mount() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/deploy.md");
    let text = std::fs::read_to_string(path).expect("docs/deploy.md");
    let section = text
        .split("## Running them with podman")
        .nth(1)
        .expect("deploy.md has a podman section");
    let mount = section
        .split_whitespace()
        .skip_while(|w| *w != "-v")
        .nth(1)
        .expect("the podman command mounts the rules with -v");
    // "$PWD/examples/envoy/config:/data/ratelimit/config:ro"
    let fields: Vec<&str> = mount.trim_matches('"').split(':').collect();
    fields.get(1).expect("a mount target").to_string()
}

#[test]
fn the_image_defaults_read_the_rules_where_the_deploy_guide_mounts_them() {
    let env = image_env();
    let get = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the image sets no {name}: {env:?}"))
    };
    let (root, sub) = (get("RUNTIME_ROOT"), get("RUNTIME_SUBDIRECTORY"));
    assert_eq!(
        deploy_doc_mount(),
        format!("{root}/{sub}/config"),
        "docs/deploy.md mounts the rules where the image's RUNTIME_ROOT and RUNTIME_SUBDIRECTORY point"
    );

    // The service with the image's variables, its root moved under a temp dir (the test
    // cannot write /data), and examples/envoy/config where the guide mounts it.
    let redis = common::Server::start();
    let tmp = tempfile::tempdir().expect("temp dir");
    let moved_root = tmp.path().join(root.trim_start_matches('/'));
    let rules = moved_root.join(&sub).join("config");
    std::fs::create_dir_all(&rules).expect("rules dir");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/envoy/config/ratelimit.yaml"
    );
    std::fs::copy(example, rules.join("ratelimit.yaml")).expect("copy the example rules");
    let mut vars: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| k != "RUNTIME_ROOT")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let moved = moved_root.to_str().expect("utf-8 path").to_string();
    vars.push(("RUNTIME_ROOT", &moved));
    // The harness sets RUNTIME_WATCH_ROOT=false; the image's, or the service's default.
    if !vars.iter().any(|(k, _)| *k == "RUNTIME_WATCH_ROOT") {
        vars.push(("RUNTIME_WATCH_ROOT", "true"));
    }
    let service = Service::try_start_in(tmp, &redis_url(redis.port), &vars).expect("starts");
    let codes: Vec<u16> = (0..6)
        .map(|_| service.json(&one("demo", &[("user", "alice")])).status)
        .collect();
    assert_eq!(codes, [200, 200, 200, 200, 200, 429], "{}", service.log());
    assert_eq!(
        warnings_with(&service.log(), "limits nothing"),
        0,
        "{}",
        service.log()
    );
}
