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
