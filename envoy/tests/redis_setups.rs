//! Redis as teams run it, each against real processes: TLS with a CA, client
//! certificates and hostname checks (Debian's redis-server built with TLS, certificates made
//! here with `openssl`), passwords of any bytes and ACL users, Sentinel through a failover
//! and over TLS (`redis-server --sentinel`), start-up retries while Redis is not there yet,
//! per-second limits on a second Redis, and `REDIS_TIMEOUT` against a stopped Redis.
//!
//! Time: limits are 2 or 1 per minute, so refill cannot change a count within a test; the
//! per-second one is 1 per second, and its checks follow each other within milliseconds.

#![cfg(test)]

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{free_port, one, openssl, Service};

const CONFIG: &str = "
domain: setups
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

/// A redis-server (or sentinel) with `args`, killed on drop.
struct Proc {
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Proc {
    /// Starts `redis-server args…` in a temp dir and waits until `port` accepts.
    fn start(args: &[String], port: u16) -> Proc {
        let dir = tempfile::tempdir().expect("temp dir");
        let child = Command::new(rl_testkit::server_binary())
            .args(args)
            .args(["--dir", &dir.path().display().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let proc = Proc {
            child: Some(child),
            _dir: dir,
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "port {port} never opened"
            );
            sleep(Duration::from_millis(20));
        }
        proc
    }

    /// SIGSTOP or SIGCONT: a Redis that holds its connections open and answers nothing.
    fn signal(&self, signal: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(c.id().to_string())
                .status();
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn args(list: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    all.extend(list.iter().map(|s| s.to_string()));
    all
}

/// Two requests of a limit of 2 pass, the third is over: Redis decided.
fn decides(svc: &Service, value: &str) {
    let body = one("setups", &[("k", value)]);
    assert_eq!(svc.json(&body).status, 200, "{}", svc.log());
    assert_eq!(svc.json(&body).status, 200);
    assert_eq!(svc.json(&body).status, 429);
}

/// The service's start with `env`, expected to stop; its log.
fn refused(redis_url: &str, env: &[(&str, &str)]) -> String {
    match Service::try_start(redis_url, &[("setups.yaml", CONFIG)], env) {
        Ok(svc) => panic!("started although it must not: {}", svc.log()),
        Err(e) => e,
    }
}

#[test]
fn passwords_of_any_bytes_and_acl_users() {
    let port = free_port();
    let password = "p#w/rd@x?y%z";
    let _redis = Proc::start(
        &args(&[
            "--port",
            &port.to_string(),
            "--requirepass",
            password,
            "--user",
            "alice",
            "on",
            ">s3:cr@t/#",
            "~*",
            "+@all",
        ]),
        port,
    );
    let url = format!("127.0.0.1:{port}");
    // Before: `#`, `/` and `@` broke the URL the password was pasted into.
    let svc = Service::start(
        &url,
        &[("setups.yaml", CONFIG)],
        &[("REDIS_AUTH", password)],
    );
    decides(&svc, "default-user");
    drop(svc);
    let svc = Service::start(
        &url,
        &[("setups.yaml", CONFIG)],
        &[("REDIS_AUTH", "alice:s3:cr@t/#")],
    );
    decides(&svc, "alice");
    drop(svc);
    // A wrong password is a misconfiguration: the service stops at once, naming it, with no
    // start-up retries (they cannot fix it).
    let e = refused(&url, &[("REDIS_AUTH", "alice:wrong")]);
    assert!(
        e.contains("misconfigured") && e.contains("authentication failed"),
        "{e}"
    );
}

/// A CA, a server certificate for `san`, and a client certificate, in `dir`.
fn certificates(dir: &Path, server: &str, san: &str) {
    if !dir.join("ca.pem").exists() {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        );
    }
    for (name, ext) in [
        (server, format!("subjectAltName={san}")),
        ("client", "extendedKeyUsage=clientAuth".to_string()),
    ] {
        if dir.join(format!("{name}.pem")).exists() {
            continue;
        }
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=redis-rl test",
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        std::fs::write(dir.join(format!("{name}.ext")), &ext).expect("ext");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &pem,
            ],
        );
    }
}

fn tls_redis(dir: &Path, server: &str, auth_clients: &str) -> (Proc, u16) {
    let port = free_port();
    let path = |f: &str| dir.join(f).display().to_string();
    let redis = Proc::start(
        &args(&[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &path(&format!("{server}.pem")),
            "--tls-key-file",
            &path(&format!("{server}.key")),
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            auth_clients,
        ]),
        port,
    );
    (redis, port)
}

#[test]
fn tls_is_honoured_or_start_up_is_refused() {
    let certs = tempfile::tempdir().expect("temp dir");
    let dir = certs.path();
    certificates(dir, "right", "IP:127.0.0.1");
    certificates(dir, "wrong", "DNS:elsewhere.invalid");
    let ca = dir.join("ca.pem").display().to_string();
    let no_retry = ("REDIS_STARTUP_RETRY_ENABLED", "false");

    // TLS with the test's CA, no client certificate asked.
    let (redis, port) = tls_redis(dir, "right", "no");
    let url = format!("127.0.0.1:{port}");
    let svc = Service::start(
        &url,
        &[("setups.yaml", CONFIG)],
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)],
    );
    decides(&svc, "tls");
    drop(svc);
    // Without the CA the certificate is not trusted: refused, not downgraded.
    let e = refused(&url, &[("REDIS_TLS", "true"), no_retry]);
    assert!(e.contains("cannot reach Redis"), "{e}");
    drop(redis);

    // A certificate for another name: refused, unless hostname checks are turned off (the
    // chain is still checked against the CA).
    let (_wrong, port) = tls_redis(dir, "wrong", "no");
    let url = format!("127.0.0.1:{port}");
    let e = refused(
        &url,
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca), no_retry],
    );
    assert!(e.contains("cannot reach Redis"), "{e}");
    let svc = Service::start(
        &url,
        &[("setups.yaml", CONFIG)],
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", &ca),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ],
    );
    decides(&svc, "any-hostname");
    drop(svc);

    // Client certificates: Redis asks for one, so it must be sent.
    let (_mtls, port) = tls_redis(dir, "right", "yes");
    let url = format!("127.0.0.1:{port}");
    let e = refused(
        &url,
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca), no_retry],
    );
    assert!(e.contains("cannot reach Redis"), "{e}");
    let svc = Service::start(
        &url,
        &[("setups.yaml", CONFIG)],
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", &ca),
            (
                "REDIS_TLS_CLIENT_CERT",
                &dir.join("client.pem").display().to_string(),
            ),
            (
                "REDIS_TLS_CLIENT_KEY",
                &dir.join("client.key").display().to_string(),
            ),
        ],
    );
    decides(&svc, "mtls");
    drop(svc);

    // TLS asked for but not possible: a plaintext Redis, a unix socket, a missing CA file.
    // Before, the first connected in plaintext with a warning.
    let plain_port = free_port();
    let _plain = Proc::start(&args(&["--port", &plain_port.to_string()]), plain_port);
    let e = refused(
        &format!("127.0.0.1:{plain_port}"),
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca), no_retry],
    );
    assert!(e.contains("cannot reach Redis"), "{e}");
    let e = refused(
        "/tmp/none.sock",
        &[("REDIS_TLS", "true"), ("REDIS_SOCKET_TYPE", "unix")],
    );
    assert!(
        e.contains("REDIS_TLS is true but REDIS_SOCKET_TYPE is unix"),
        "{e}"
    );
    let e = refused(
        &url,
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/nonexistent/ca.pem"),
        ],
    );
    assert!(e.contains("REDIS_TLS_CACERT: cannot read"), "{e}");
}

#[test]
fn start_up_waits_for_redis_and_is_unhealthy_until_then() {
    let port = free_port();
    // Redis comes up 11 s after the service starts: later than the ~9.5 s the redis crate's
    // own reconnection attempts lasted before the service gave up and exited.
    let late = std::thread::spawn(move || {
        sleep(Duration::from_secs(11));
        Proc::start(&args(&["--port", &port.to_string()]), port)
    });
    let started = Instant::now();
    // Before: the service exited at once ("cannot reach Redis").
    let svc = Service::start(
        &format!("127.0.0.1:{port}"),
        &[("setups.yaml", CONFIG)],
        &[
            ("REDIS_STARTUP_RETRY_INITIAL_INTERVAL", "100ms"),
            ("REDIS_STARTUP_RETRY_MAX_INTERVAL", "1s"),
        ],
    );
    // `Service::start` returns at the first 200 from /healthcheck: not before Redis was up.
    assert!(
        started.elapsed() >= Duration::from_secs(11),
        "{}",
        svc.log()
    );
    let _redis = late.join().expect("redis thread");
    assert!(svc.log().contains("trying again"), "{}", svc.log());
    decides(&svc, "late");
    // A bound on the attempts still stops a start-up that never connects.
    let e = refused(
        &format!("127.0.0.1:{}", free_port()),
        &[
            ("REDIS_STARTUP_RETRY_MAX_ATTEMPTS", "3"),
            ("REDIS_STARTUP_RETRY_INITIAL_INTERVAL", "10ms"),
        ],
    );
    assert_eq!(e.matches("trying again").count(), 2, "{e}");
}

#[test]
fn sigterm_while_waiting_for_redis_stops_the_service() {
    // Before: no SIGTERM handler until Redis answered, so a pod whose Redis was unreachable
    // could not be stopped (as PID 1 in a container the signal is ignored; here, outside one,
    // it killed the process without a clean exit).
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(Service::config_dir(root.path())).expect("config dir");
    std::fs::write(Service::config_dir(root.path()).join("setups.yaml"), CONFIG).expect("config");
    let mut svc = Service::spawn(
        root,
        &format!("127.0.0.1:{}", free_port()),
        &[("REDIS_STARTUP_RETRY_INITIAL_INTERVAL", "100ms")],
    );
    let waited = Instant::now();
    while !svc.log().contains("trying again") {
        assert!(waited.elapsed() < Duration::from_secs(20), "{}", svc.log());
        sleep(Duration::from_millis(50));
    }
    let asked = Instant::now();
    svc.signal("TERM");
    let status = svc.wait_exit().expect("exit status");
    assert!(status.success(), "{status}: {}", svc.log());
    assert!(asked.elapsed() < Duration::from_secs(5), "{}", svc.log());
    assert!(
        svc.log().contains("SIGTERM before the service was ready"),
        "{}",
        svc.log()
    );
}

fn replication_up(port: u16, password: &str) -> bool {
    // Not a URL: the password holds `#`.
    use redis::IntoConnectionInfo;
    let Ok(info) = redis::ConnectionAddr::Tcp("127.0.0.1".into(), port).into_connection_info()
    else {
        return false;
    };
    let settings = redis::RedisConnectionInfo::default().set_password(password);
    let Ok(client) = redis::Client::open(info.set_redis_settings(settings)) else {
        return false;
    };
    let Ok(mut con) = client.get_connection() else {
        return false;
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .unwrap_or_default();
    info.contains("master_link_status:up")
}

#[test]
fn sentinel_with_its_own_password_survives_a_failover() {
    let (primary_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
    let data_password = "data#pw";
    let mut primary = Proc::start(
        &args(&[
            "--port",
            &primary_port.to_string(),
            "--requirepass",
            data_password,
            "--masterauth",
            data_password,
        ]),
        primary_port,
    );
    let _replica = Proc::start(
        &args(&[
            "--port",
            &replica_port.to_string(),
            "--requirepass",
            data_password,
            "--masterauth",
            data_password,
            "--replicaof",
            "127.0.0.1",
            &primary_port.to_string(),
        ]),
        replica_port,
    );
    let started = Instant::now();
    while !replication_up(replica_port, data_password) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "replica never synced"
        );
        sleep(Duration::from_millis(50));
    }
    let sentinel_dir = tempfile::tempdir().expect("temp dir");
    let conf = sentinel_dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\nrequirepass sentinel-pw\n\
             sentinel monitor mymaster 127.0.0.1 {primary_port} 1\n\
             sentinel auth-pass mymaster {data_password}\n\
             sentinel down-after-milliseconds mymaster 500\n\
             sentinel failover-timeout mymaster 3000\n"
        ),
    )
    .expect("sentinel.conf");
    let _sentinel = Proc::start(
        &[conf.display().to_string(), "--sentinel".to_string()],
        sentinel_port,
    );
    // Before: REDIS_TYPE=sentinel exited 2.
    let svc = Service::start(
        &format!("mymaster,127.0.0.1:{sentinel_port}"),
        &[("setups.yaml", CONFIG)],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_AUTH", data_password),
            ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
        ],
    );
    decides(&svc, "before");
    primary.kill();
    // The sentinel promotes the replica; the service asks it again after the failed calls.
    let body = one("setups", &[("k", "after")]);
    let started = Instant::now();
    loop {
        if svc.json(&body).status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no decision after the failover: {}",
            svc.log()
        );
        sleep(Duration::from_millis(200));
    }
    assert_eq!(svc.json(&body).status, 200);
    assert_eq!(svc.json(&body).status, 429);
}

const PER_SECOND: &str = "
domain: setups
descriptors:
  - key: fast
    rate_limit:
      unit: second
      requests_per_unit: 1
  - key: slow
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

fn dbsize(port: u16) -> i64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut con = client.get_connection().expect("connection");
    redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE")
}

#[test]
fn per_second_limits_go_to_their_own_redis_all_or_nothing() {
    let (main_port, fast_port) = (free_port(), free_port());
    let _main = Proc::start(&args(&["--port", &main_port.to_string()]), main_port);
    let _fast = Proc::start(&args(&["--port", &fast_port.to_string()]), fast_port);
    let svc = Service::start(
        &format!("127.0.0.1:{main_port}"),
        &[("setups.yaml", PER_SECOND)],
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", &format!("127.0.0.1:{fast_port}")),
        ],
    );
    let both = serde_json::json!({"domain": "setups", "descriptors": [
        {"entries": [{"key": "fast", "value": "a"}]},
        {"entries": [{"key": "slow", "value": "a"}]},
    ]})
    .to_string();
    // The minute limit is used up on the main Redis.
    assert_eq!(svc.json(&one("setups", &[("slow", "a")])).status, 200);
    // Both: the minute one refuses, so the per-second token taken first is given back…
    assert_eq!(svc.json(&both).status, 429, "{}", svc.log());
    // …and is there for the next request (1 per second: no refill within these calls).
    let fast = one("setups", &[("fast", "a")]);
    assert_eq!(svc.json(&fast).status, 200, "{}", svc.log());
    assert_eq!(svc.json(&fast).status, 429);
    // Before, REDIS_PERSECOND was a warning and both buckets lived on REDIS_URL.
    assert_eq!((dbsize(main_port), dbsize(fast_port)), (1, 1));
}

#[test]
fn redis_timeout_bounds_a_call_and_pool_on_empty_is_checked() {
    let port = free_port();
    let redis = Proc::start(&args(&["--port", &port.to_string()]), port);
    let url = format!("127.0.0.1:{port}");
    let svc = Service::start(
        &url,
        &[("setups.yaml", CONFIG)],
        &[
            ("REDIS_TIMEOUT", "300ms"),
            ("RL_ON_ERROR", "open"),
            ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "ERROR"),
            ("REDIS_POOL_ON_EMPTY_WAIT_DURATION", "250ms"),
        ],
    );
    assert!(
        svc.log()
            .contains("REDIS_POOL_ON_EMPTY_BEHAVIOR=ERROR (wait 250 ms) has no effect"),
        "{}",
        svc.log()
    );
    let body = one("setups", &[("k", "timeout")]);
    assert_eq!(svc.json(&body).status, 200);
    // A Redis that answers nothing: the call is decided by the policy (open) at the
    // REDIS_TIMEOUT deadline, not the 2 s default.
    redis.signal("STOP");
    let started = Instant::now();
    let status = svc.json(&body).status;
    let took = started.elapsed();
    redis.signal("CONT");
    assert_eq!(status, 200, "{}", svc.log());
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    let e = refused(&url, &[("REDIS_POOL_ON_EMPTY_BEHAVIOR", "block")]);
    assert!(
        e.contains("REDIS_POOL_ON_EMPTY_BEHAVIOR must be CREATE, ERROR or WAIT"),
        "{e}"
    );
}

#[test]
fn sentinel_over_tls() {
    let certs = tempfile::tempdir().expect("temp dir");
    let dir = certs.path();
    certificates(dir, "right", "IP:127.0.0.1");
    let path = |f: &str| dir.join(f).display().to_string();
    let tls = |port: u16| -> Vec<String> {
        [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &path("right.pem"),
            "--tls-key-file",
            &path("right.key"),
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            "no",
            "--tls-replication",
            "yes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let (primary_port, sentinel_port) = (free_port(), free_port());
    let mut primary_args = args(&[]);
    primary_args.extend(tls(primary_port));
    let _primary = Proc::start(&primary_args, primary_port);
    let sentinel_dir = tempfile::tempdir().expect("temp dir");
    let conf = sentinel_dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {sentinel_port}\nbind 127.0.0.1\n\
             tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {primary_port} 1\n",
            path("right.pem"),
            path("right.key"),
            path("ca.pem")
        ),
    )
    .expect("sentinel.conf");
    let _sentinel = Proc::start(
        &[conf.display().to_string(), "--sentinel".to_string()],
        sentinel_port,
    );
    let svc = Service::start(
        &format!("mymaster,127.0.0.1:{sentinel_port}"),
        &[("setups.yaml", CONFIG)],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", &path("ca.pem")),
        ],
    );
    decides(&svc, "sentinel-tls");
}
