//! Persistence against a real server: a bucket's exact state (its `full_at_ns` and
//! `full_at_frac`, compared as `DUMP` bytes, and its absolute expiry, compared as
//! `PEXPIRETIME`) survives every path: `DEBUG RELOAD`, `SAVE` and restart, AOF replay with and
//! without the RDB preamble, AOF rewrite, `DUMP`/`RESTORE` and `COPY`, for whole-nanosecond
//! states (inline in the value pointer) and states with a fraction of a nanosecond (a heap
//! allocation). Corrupt payloads are refused without a crash, and what 0.1.0 wrote still
//! loads as the same bucket: the checked-in v1 `DUMP`, RDB file and AOF file fixtures.
//!
//! Time: every bucket is at least 180 s from full (rates of 0.0003 to 10 tokens/s with costs
//! to match), so none refills or expires during a test, and the fixtures' states lie in the
//! year 2100. Nothing here asserts a duration; the one reply that depends on the clock is
//! checked against bounds read from `TIME`.
//!
//! Payloads are built by hand in the `DUMP` format: the RDB type byte, the body, the 2-byte
//! RDB version (little endian) and a CRC-64 (Jones, reflected, as Redis's `crc64.c`) of all
//! of it, little endian. A module value's body is its 64-bit module type id (rdbSaveLen
//! encoding; the low 10 bits are the encoding version), then the fields the module saved,
//! each an opcode and a value, then an EOF opcode. Encoding version 2 saves two unsigned
//! fields, `full_at_ns` and `full_at_frac`; version 1 (0.1.0) saved `full_at_ns` alone.

#![cfg(test)]

mod common;

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::aof::{parse_aof, uint_arg};
use common::rdb::{crc64, rdb_len, CRASH_MARKERS};
use common::{acquire, dump, error_text, exists, pexpiretime, Server};
use redis::Connection;

/// The fixture's state: 2100-01-01T00:00:00Z plus 123 ns, so it never expires in a test and
/// its expiry (`ceil(full_at / 1e6)` ms) is not the truncated value.
const FIXTURE_FULL_AT_NS: u64 = 4_102_444_800_000_000_123;
/// A `DUMP` of a bucket written by `RL.SETSTATE k 4102444800000000123`, encoding version 1
/// (Redis 7.0, RDB version 10). Never regenerate it: it proves old payloads still load.
const FIXTURE_V1: &[u8] = include_bytes!("fixtures/v1-bucket.dump");
/// An RDB file that Redis 7.0.15 saved with 0.1.0's module (encoding version 1, RDB version
/// 10), and the AOF directory (manifest, base written by 0.1.0's AOF rewrite, increment of
/// what 0.1.0 propagated) of the same server. `tests/fixtures/README.md` says how they were
/// made; never regenerate them.
const FIXTURE_V1_RDB: &[u8] = include_bytes!("fixtures/v1-buckets.rdb");
const FIXTURE_V1_AOF_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1-aof");
/// The buckets in the RDB fixture, and their `full_at_ns`: three set by `RL.SETSTATE`, and
/// `acquired` moved on by one token at 0.000001/s by 0.1.0's `RL.ACQUIRE`.
const FIXTURE_V1_RDB_BUCKETS: &[(&[u8], u64)] = &[
    (b"a", 4_102_444_800_000_000_123),
    (b"acquired", 4_103_444_800_000_000_123),
    (b"b", 4_102_444_800_000_000_000),
    (b"\xff\xfe\x00bin", 9_223_372_036_854_775_807),
];
/// The buckets the AOF fixture replays to: those of the RDB fixture (its base) and `c`, set
/// in the increment by `RL.SETSTATE` and then moved on by two tokens by `RL.ACQUIRE`.
const FIXTURE_V1_AOF_BUCKETS: &[(&[u8], u64)] = &[
    (b"a", 4_102_444_800_000_000_123),
    (b"acquired", 4_103_444_800_000_000_123),
    (b"b", 4_102_444_800_000_000_000),
    (b"c", 4_104_444_800_000_000_456),
    (b"\xff\xfe\x00bin", 9_223_372_036_854_775_807),
];
/// The encoding version this build writes.
const ENCVER_NOW: u64 = 2;
/// The largest `full_at_ns` and `full_at_frac` (units of 2^-63 ns) a state may hold.
const MAX_NS: u64 = i64::MAX as u64;
const MAX_FRAC: u64 = i64::MAX as u64;

const RDB_TYPE_MODULE_2: u8 = 7;
const OPCODE_EOF: u8 = 0;
const OPCODE_SINT: u8 = 1;
const OPCODE_UINT: u8 = 2;
const OPCODE_STRING: u8 = 5;
const ENCVER_MASK: u64 = (1 << 10) - 1;

const BAD_PAYLOAD: &str = "ERR DUMP payload version or checksum are wrong";
const BAD_DATA: &str = "ERR Bad data format";

// ---------------------------------------------------------------------------------------
// The DUMP format
// ---------------------------------------------------------------------------------------

/// Reads one `rdbSaveLen` value: the value and how many bytes it took.
fn read_rdb_len(bytes: &[u8]) -> (u64, usize) {
    match bytes[0] >> 6 {
        0 => (u64::from(bytes[0] & 0x3f), 1),
        1 => ((u64::from(bytes[0] & 0x3f) << 8) | u64::from(bytes[1]), 2),
        _ if bytes[0] == 0x80 => (
            u64::from(u32::from_be_bytes(bytes[1..5].try_into().unwrap())),
            5,
        ),
        _ if bytes[0] == 0x81 => (u64::from_be_bytes(bytes[1..9].try_into().unwrap()), 9),
        _ => panic!("not an rdbSaveLen length: {:#04x}", bytes[0]),
    }
}

/// A module value's `DUMP` payload, taken apart.
#[derive(Clone, Debug, PartialEq)]
struct ModuleDump {
    /// The module type id: 54 bits of name, 10 bits of encoding version.
    module_id: u64,
    /// What the module saved, then the EOF opcode.
    fields: Vec<u8>,
    /// The RDB version of the server that dumped it.
    rdb_version: u16,
}

impl ModuleDump {
    /// Splits a payload, checking its type byte and checksum.
    fn parse(payload: &[u8]) -> ModuleDump {
        assert!(payload.len() > 11, "payload too short: {payload:02x?}");
        let (body, footer) = payload.split_at(payload.len() - 10);
        let stored_crc = u64::from_le_bytes(footer[2..].try_into().unwrap());
        assert_eq!(
            crc64(&payload[..payload.len() - 8]),
            stored_crc,
            "checksum of {payload:02x?}"
        );
        assert_eq!(body[0], RDB_TYPE_MODULE_2, "a module value, format 2");
        let (module_id, used) = read_rdb_len(&body[1..]);
        ModuleDump {
            module_id,
            fields: body[1 + used..].to_vec(),
            rdb_version: u16::from_le_bytes([footer[0], footer[1]]),
        }
    }

    /// The payload again, with a fresh checksum.
    fn build(&self) -> Vec<u8> {
        let mut body = vec![RDB_TYPE_MODULE_2];
        body.extend(rdb_len(self.module_id));
        body.extend_from_slice(&self.fields);
        seal(body, self.rdb_version)
    }

    /// The bucket's `(full_at_ns, full_at_frac)`: in encoding version 2 exactly two unsigned
    /// fields, in version 1 exactly one (the fraction is 0), then EOF.
    fn state(&self) -> (u64, u64) {
        let want_fields = match self.encoding_version() {
            1 => 1,
            2 => 2,
            other => panic!("encoding version {other}"),
        };
        let mut values = Vec::new();
        let mut rest = &self.fields[..];
        for _ in 0..want_fields {
            assert_eq!(
                rest.first(),
                Some(&OPCODE_UINT),
                "fields {:02x?}",
                self.fields
            );
            let (value, used) = read_rdb_len(&rest[1..]);
            values.push(value);
            rest = &rest[1 + used..];
        }
        assert_eq!(
            rest,
            [OPCODE_EOF],
            "{want_fields} unsigned fields, then EOF: {:02x?}",
            self.fields
        );
        (values[0], values.get(1).copied().unwrap_or(0))
    }

    fn full_at_ns(&self) -> u64 {
        self.state().0
    }

    fn encoding_version(&self) -> u64 {
        self.module_id & ENCVER_MASK
    }
}

/// Appends the RDB version and the checksum to a type byte and body.
fn seal(mut payload: Vec<u8>, rdb_version: u16) -> Vec<u8> {
    payload.extend_from_slice(&rdb_version.to_le_bytes());
    let crc = crc64(&payload);
    payload.extend_from_slice(&crc.to_le_bytes());
    payload
}

/// Unsigned fields holding `values`, then EOF: `[full_at_ns]` is a version 1 body,
/// `[full_at_ns, full_at_frac]` a version 2 one.
fn uint_fields(values: &[u64]) -> Vec<u8> {
    let mut fields = Vec::new();
    for &value in values {
        fields.push(OPCODE_UINT);
        fields.extend(rdb_len(value));
    }
    fields.push(OPCODE_EOF);
    fields
}

/// The key's expiry for a state: `full_at` rounded up to a millisecond, where a fraction
/// counts as part of one more nanosecond.
fn expire_at_ms((full_at_ns, full_at_frac): (u64, u64)) -> i64 {
    let ns_ceil = full_at_ns + u64::from(full_at_frac > 0);
    i64::try_from(ns_ceil.div_ceil(1_000_000)).expect("fits")
}

/// `RL.SETSTATE key full_at_ns [full_at_frac]`.
fn set_state(con: &mut Connection, key: &[u8], full_at_ns: u64, full_at_frac: Option<u64>) {
    let mut cmd = redis::cmd("RL.SETSTATE");
    cmd.arg(key).arg(full_at_ns);
    if let Some(frac) = full_at_frac {
        cmd.arg(frac);
    }
    let ok: String = cmd.query(con).expect("RL.SETSTATE");
    assert_eq!(ok, "OK");
}

/// The stored `(full_at_ns, full_at_frac)` of a bucket, from its `DUMP`.
fn stored_state(con: &mut Connection, key: &[u8]) -> (u64, u64) {
    let payload = dump(con, key).unwrap_or_else(|| panic!("no bucket {key:?}"));
    let parsed = ModuleDump::parse(&payload);
    assert_eq!(parsed.encoding_version(), ENCVER_NOW);
    parsed.state()
}

// ---------------------------------------------------------------------------------------
// Buckets and snapshots
// ---------------------------------------------------------------------------------------

const NON_UTF8_KEY: &[u8] = b"\xff\xfe\x00bin\x80";
/// Every key `populate` writes, and whether its state has a fraction of a nanosecond.
const KEYS: &[(&[u8], bool)] = &[
    (b"plain", true),
    (b"frac", true),
    (NON_UTF8_KEY, true),
    (b"fixed", false),
    (b"whole1", false),
    (b"whole10", false),
    (b"third", true),
    (b"seventh", true),
    (b"fixed-frac", true),
    (b"fixed-zero", false),
];
/// A fraction of a nanosecond for `RL.SETSTATE`: 0.75 ns past the instant.
const FIXED_FRAC: u64 = 3 << 61;

/// Writes the buckets of `KEYS` through `RL.ACQUIRE` and `RL.SETSTATE`, including two calls
/// that change nothing, and checks each state is whole or fractional as `KEYS` says. Returns
/// how many calls changed a bucket: each one propagates exactly one `RL.SETSTATE`.
fn populate(con: &mut Connection) -> usize {
    // Two integer takes at 3 tokens per 10,000 s: a token is 3,333.33… s, not a whole
    // number of nanoseconds.
    assert_eq!(acquire(con, b"plain", "0.0003", "10", Some("3"))[0], 1);
    assert_eq!(acquire(con, b"plain", "0.0003", "10", None)[0], 1);
    // A fractional cost at a rate that does not divide 1e9: 0.7 × 1e9/0.003 ns is not a whole
    // number of nanoseconds, let alone of milliseconds.
    assert_eq!(acquire(con, b"frac", "0.003", "10", Some("0.7"))[0], 1);
    // A zero cost and a denial (9.3 tokens left, 10 asked): both change nothing.
    let [allowed, remaining, ..] = acquire(con, b"frac", "0.003", "10", Some("0"));
    assert_eq!((allowed, remaining), (1, 9));
    assert_eq!(acquire(con, b"frac", "0.003", "10", Some("10"))[0], 0);
    // A binary key, fractional cost and rate.
    assert_eq!(acquire(con, NON_UTF8_KEY, "0.007", "5", Some("1.3"))[0], 1);
    // An exact state, the way replication and AOF rewrite write it.
    set_state(con, b"fixed", FIXTURE_FULL_AT_NS, None);
    // Rates that divide 1e9: whole nanoseconds, inline in the value pointer. Full again in
    // 950 s and 500 s.
    assert_eq!(acquire(con, b"whole1", "1", "1000", Some("900"))[0], 1);
    assert_eq!(acquire(con, b"whole1", "1", "1000", Some("50"))[0], 1);
    assert_eq!(acquire(con, b"whole10", "10", "10000", Some("5000"))[0], 1);
    // Rates that do not: a third and a seventh of a second per token leave a fraction of a
    // nanosecond, held in 16 bytes of their own. Full again in 333.67 s and 999.86 s.
    assert_eq!(acquire(con, b"third", "3", "3000", Some("1000"))[0], 1);
    assert_eq!(acquire(con, b"third", "3", "3000", Some("1"))[0], 1);
    assert_eq!(acquire(con, b"seventh", "7", "7000", Some("6999"))[0], 1);
    // Exact states with and without a fraction, as the 3-argument form writes them.
    set_state(con, b"fixed-frac", FIXTURE_FULL_AT_NS, Some(FIXED_FRAC));
    set_state(con, b"fixed-zero", FIXTURE_FULL_AT_NS + 1, Some(0));
    for &(key, has_fraction) in KEYS {
        let (full_at_ns, full_at_frac) = stored_state(con, key);
        assert_eq!(
            full_at_frac != 0,
            has_fraction,
            "{:?} holds ({full_at_ns}, {full_at_frac})",
            String::from_utf8_lossy(key)
        );
    }
    assert_eq!(
        stored_state(con, b"fixed-frac"),
        (FIXTURE_FULL_AT_NS, FIXED_FRAC)
    );
    assert_eq!(
        stored_state(con, b"fixed-zero"),
        (FIXTURE_FULL_AT_NS + 1, 0)
    );
    assert_ne!(
        stored_state(con, b"frac").0 % 1_000_000,
        0,
        "the fractional state is not a whole millisecond"
    );
    13
}

/// Everything that must survive: each key's `DUMP` and `PEXPIRETIME`, the key count and
/// the dataset digest (which covers values, through the type's digest callback, and expiries).
#[derive(Debug, PartialEq)]
struct Snapshot {
    buckets: Vec<(String, Vec<u8>, i64)>,
    dbsize: i64,
    digest: String,
}

fn snapshot(con: &mut Connection) -> Snapshot {
    let buckets = KEYS
        .iter()
        .map(|&(key, _)| {
            let name = String::from_utf8_lossy(key).into_owned();
            let payload = dump(con, key).unwrap_or_else(|| panic!("bucket {name:?} missing"));
            let expire_at = pexpiretime(con, key);
            // The expiry is the full instant rounded up to a millisecond.
            let parsed = ModuleDump::parse(&payload);
            assert_eq!(parsed.encoding_version(), ENCVER_NOW, "{name:?}");
            assert_eq!(
                expire_at,
                expire_at_ms(parsed.state()),
                "expiry of {name:?}"
            );
            (name, payload, expire_at)
        })
        .collect();
    Snapshot {
        buckets,
        dbsize: redis::cmd("DBSIZE").query(con).expect("DBSIZE"),
        digest: redis::cmd("DEBUG")
            .arg("DIGEST")
            .query(con)
            .expect("DEBUG DIGEST"),
    }
}

fn assert_no_crash(server: &Server) {
    assert!(
        server.is_alive(),
        "server stopped answering PING; log:\n{}",
        server.log()
    );
    let log = server.log();
    for marker in CRASH_MARKERS {
        assert!(!log.contains(marker), "log contains {marker:?}:\n{log}");
    }
}

// ---------------------------------------------------------------------------------------
// AOF files
// ---------------------------------------------------------------------------------------

/// The files the AOF manifest names (Redis 7 keeps them under `appendonlydir/`): base first,
/// then the increments. History files, which may linger while being deleted, are skipped.
fn aof_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let aof_dir = dir.join("appendonlydir");
    let manifest =
        std::fs::read_to_string(aof_dir.join("appendonly.aof.manifest")).expect("AOF manifest");
    let mut files: Vec<(bool, String)> = manifest
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let name = words.get(words.iter().position(|w| *w == "file")? + 1)?;
            let kind = words.get(words.iter().position(|w| *w == "type")? + 1)?;
            (*kind != "h").then(|| (*kind != "b", name.to_string()))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|(_, name)| {
            let bytes =
                std::fs::read(aof_dir.join(&name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
            (name, bytes)
        })
        .collect()
}

/// How often `needle` occurs in `haystack`, ignoring ASCII case.
fn count(haystack: &[u8], needle: &str) -> usize {
    let haystack = haystack.to_ascii_lowercase();
    let needle = needle.to_ascii_lowercase().into_bytes();
    haystack
        .windows(needle.len())
        .filter(|w| *w == &needle[..])
        .count()
}

fn persistence_info(con: &mut Connection) -> String {
    redis::cmd("INFO")
        .arg("persistence")
        .query(con)
        .expect("INFO persistence")
}

/// Starts `BGREWRITEAOF` and waits until no rewrite is running or scheduled.
fn rewrite_aof(server: &Server, con: &mut Connection) {
    let _: String = redis::cmd("BGREWRITEAOF").query(con).expect("BGREWRITEAOF");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let info = persistence_info(con);
        if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
            assert!(
                info.contains("aof_last_bgrewrite_status:ok"),
                "rewrite failed:\n{info}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "AOF rewrite never finished; log:\n{}",
            server.log()
        );
        sleep(Duration::from_millis(10));
    }
}

/// Checks that `commands` (an AOF's) set each bucket of `KEYS` to the state `con` holds: the
/// last `RL.SETSTATE` of each key carries its `full_at_ns`, and its `full_at_frac` exactly when
/// that is not 0 (the 0.1.0 form otherwise). `client_forms` says whether the commands are
/// the ones clients sent, where `fixed-zero` came with an explicit fraction of 0. Where the
/// AOF has a `PEXPIREAT` for the key (a rewrite writes one), it is the key's expiry.
fn assert_aof_sets_states(con: &mut Connection, commands: &[Vec<Vec<u8>>], client_forms: bool) {
    for &(key, _) in KEYS {
        let name = String::from_utf8_lossy(key);
        let (full_at_ns, full_at_frac) = stored_state(con, key);
        let last = commands
            .iter()
            .rev()
            .find(|c| c[0].eq_ignore_ascii_case(b"RL.SETSTATE") && c[1] == key)
            .unwrap_or_else(|| panic!("no RL.SETSTATE for {name:?}"));
        let explicit_zero = client_forms && key == b"fixed-zero";
        let want_args = if full_at_frac != 0 || explicit_zero {
            4
        } else {
            3
        };
        assert_eq!(last.len(), want_args, "{name:?}: {last:?}");
        assert_eq!(uint_arg(&last[2]), full_at_ns, "{name:?}: full_at_ns");
        if want_args == 4 {
            assert_eq!(uint_arg(&last[3]), full_at_frac, "{name:?}: full_at_frac");
        }
        if let Some(expire) = commands
            .iter()
            .rev()
            .find(|c| c[0].eq_ignore_ascii_case(b"PEXPIREAT") && c[1] == key)
        {
            assert_eq!(
                uint_arg(&expire[2]) as i64,
                pexpiretime(con, key),
                "{name:?}: PEXPIREAT"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[test]
fn crc64_reproduces_redis_checksums() {
    // The catalogue check value of CRC-64/Jones (reflected, init 0, no xorout) as in crc64.c.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("hello")
        .query(&mut con)
        .expect("SET");
    let _: i64 = redis::cmd("RPUSH")
        .arg("l")
        .arg("a")
        .arg("b")
        .query(&mut con)
        .expect("RPUSH");
    for key in KEYS.iter().map(|k| k.0).chain([&b"s"[..], b"l"]) {
        let payload = dump(&mut con, key).expect("value exists");
        let (checked, crc) = payload.split_at(payload.len() - 8);
        assert_eq!(
            crc64(checked),
            u64::from_le_bytes(crc.try_into().unwrap()),
            "key {:?}",
            String::from_utf8_lossy(key)
        );
    }
    // And the parser and builder give back a real payload byte for byte.
    for &(key, _) in KEYS {
        let payload = dump(&mut con, key).expect("bucket");
        let parsed = ModuleDump::parse(&payload);
        assert_eq!(parsed.encoding_version(), ENCVER_NOW);
        assert_eq!(parsed.build(), payload);
        let (full_at_ns, full_at_frac) = parsed.state();
        assert_eq!(
            ModuleDump {
                fields: uint_fields(&[full_at_ns, full_at_frac]),
                ..parsed.clone()
            }
            .build(),
            payload
        );
    }
}

#[test]
fn debug_reload_keeps_exact_state() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    let before = snapshot(&mut con);
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(snapshot(&mut con), before);
    assert_no_crash(&server);
}

#[test]
fn save_and_restart_keeps_exact_state() {
    let mut server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    let before = snapshot(&mut con);
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    assert!(
        server.dir.path().join("dump.rdb").exists(),
        "SAVE wrote dump.rdb"
    );
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con), before);
    assert_no_crash(&server);
}

/// Populates under AOF, then restarts (a) from the AOF as written, (b) after a rewrite, and
/// (c) from the rewritten base plus new increments; the state is identical each time.
fn aof_keeps_exact_state(preamble: &str) {
    // `always`: each reply follows its AOF write and fsync, so a kill right after a reply
    // loses nothing (`everysec` may postpone a write while a background fsync runs).
    let args = [
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        preamble,
        "--appendfsync",
        "always",
    ];
    let mut server = Server::start_with(&args);
    let mut con = server.conn();
    let writes = populate(&mut con);
    let before = snapshot(&mut con);

    // The increment holds one RL.SETSTATE per change, and never the clock-dependent call.
    let check_increment = |server: &Server, want: usize| {
        let files = aof_files(server.dir.path());
        let (name, incr) = files.last().expect("an increment file");
        assert!(
            name.ends_with(".incr.aof"),
            "files {:?}",
            files.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        assert_eq!(
            count(incr, "RL.SETSTATE"),
            want,
            "{name}:\n{}",
            String::from_utf8_lossy(incr)
        );
        for (name, bytes) in &files {
            assert_eq!(count(bytes, "RL.ACQUIRE"), 0, "{name} holds RL.ACQUIRE");
        }
    };
    check_increment(&server, writes);
    let files = aof_files(server.dir.path());
    let increment = parse_aof(&files.last().expect("an increment").1);
    assert_aof_sets_states(&mut con, &increment, true);

    // (a) Replay the AOF as written. Loading it must not append to it.
    server.restart_with(&args);
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con), before, "after replaying the AOF");
    check_increment(&server, writes);

    // (b) Rewrite: the base holds one RL.SETSTATE (and one PEXPIREAT) per bucket.
    rewrite_aof(&server, &mut con);
    let files = aof_files(server.dir.path());
    let (base_name, base) = &files[0];
    if preamble == "no" {
        assert!(base_name.ends_with(".base.aof"), "base {base_name}");
        assert_eq!(
            count(base, "RL.SETSTATE"),
            KEYS.len(),
            "{}",
            String::from_utf8_lossy(base)
        );
        assert_eq!(
            count(base, "PEXPIREAT"),
            KEYS.len(),
            "{}",
            String::from_utf8_lossy(base)
        );
        assert_aof_sets_states(&mut con, &parse_aof(base), false);
    } else {
        assert!(
            // Valkey 9 writes its own RDB magic.
            base_name.ends_with(".base.rdb")
                && (base.starts_with(b"REDIS") || base.starts_with(b"VALKEY")),
            "base {base_name}"
        );
    }
    check_increment(&server, 0);
    assert_eq!(
        snapshot(&mut con),
        before,
        "after the rewrite, before restarting"
    );
    server.restart_with(&args);
    let mut con = server.conn();
    assert_eq!(
        snapshot(&mut con),
        before,
        "after restarting from the rewritten AOF"
    );

    // (c) New changes on top of the rewritten base.
    assert_eq!(
        acquire(&mut con, b"plain", "0.0003", "10", Some("2.5"))[0],
        1
    );
    assert_eq!(
        acquire(&mut con, b"plain", "0.0003", "10", Some("10"))[0],
        0
    );
    let after = snapshot(&mut con);
    assert_ne!(after, before);
    check_increment(&server, 1);
    server.restart_with(&args);
    let mut con = server.conn();
    assert_eq!(
        snapshot(&mut con),
        after,
        "after replaying base and increment"
    );
    assert_no_crash(&server);
}

#[test]
fn aof_with_rdb_preamble_keeps_exact_state() {
    aof_keeps_exact_state("yes");
}

#[test]
fn aof_without_rdb_preamble_keeps_exact_state() {
    aof_keeps_exact_state("no");
}

#[test]
fn dump_restore_and_copy_keep_exact_state() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    // An older state under the name each bucket is restored onto with REPLACE: one with a
    // fraction where the bucket has none and the other way round, so REPLACE frees either kind.
    for &(key, has_fraction) in KEYS {
        let payload = dump(&mut con, key).expect("bucket");
        let expire_at_ms = pexpiretime(&mut con, key);
        let fresh = [b"restored:", key].concat();
        let replaced = [b"replaced:", key].concat();
        let copied = [b"copied:", key].concat();
        let ok: String = redis::cmd("RESTORE")
            .arg(&fresh)
            .arg(expire_at_ms)
            .arg(&payload)
            .arg("ABSTTL")
            .query(&mut con)
            .expect("RESTORE");
        assert_eq!(ok, "OK");
        let older_frac = (!has_fraction).then_some(FIXED_FRAC);
        set_state(&mut con, &replaced, FIXTURE_FULL_AT_NS - 1, older_frac);
        let ok: String = redis::cmd("RESTORE")
            .arg(&replaced)
            .arg(expire_at_ms)
            .arg(&payload)
            .arg("ABSTTL")
            .arg("REPLACE")
            .query(&mut con)
            .expect("RESTORE REPLACE");
        assert_eq!(ok, "OK");
        let copied_count: i64 = redis::cmd("COPY")
            .arg(key)
            .arg(&copied)
            .query(&mut con)
            .expect("COPY");
        assert_eq!(copied_count, 1);
        for other in [&fresh, &replaced, &copied] {
            let name = String::from_utf8_lossy(other);
            assert_eq!(
                dump(&mut con, other).as_deref(),
                Some(&payload[..]),
                "{name}"
            );
            assert_eq!(pexpiretime(&mut con, other), expire_at_ms, "{name}");
        }
    }
    // The copies are independent: changing one leaves the original as it was. A fractional
    // state is updated in place in its allocation, so this shows COPY made another one.
    let takes: &[(&[u8], &str, &str)] = &[
        (b"plain", "0.0003", "10"),
        (b"whole1", "1", "1000"),
        (b"third", "3", "3000"),
        (b"seventh", "7", "7000"),
    ];
    for &(key, rate, capacity) in takes {
        let copied = [b"copied:", key].concat();
        let original = dump(&mut con, key);
        assert_eq!(acquire(&mut con, &copied, rate, capacity, None)[0], 1);
        assert_eq!(dump(&mut con, key), original);
        assert_ne!(dump(&mut con, &copied), original);
        // And the other way round.
        let copy_before = dump(&mut con, &copied);
        assert_eq!(acquire(&mut con, key, rate, capacity, None)[0], 1);
        assert_eq!(dump(&mut con, &copied), copy_before);
    }
    // Deleting an original leaves its copy whole (a shared allocation would be freed twice).
    for &(key, _) in KEYS {
        let copied = [b"copied:", key].concat();
        let copy_before = dump(&mut con, &copied).expect("copy");
        let _: i64 = redis::cmd("DEL").arg(key).query(&mut con).expect("DEL");
        assert_eq!(dump(&mut con, &copied), Some(copy_before));
    }
    let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
    assert_no_crash(&server);
}

#[test]
fn restore_refuses_a_bad_checksum_or_version() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    let payload = dump(&mut con, b"frac").expect("bucket");
    let rdb_version = ModuleDump::parse(&payload).rdb_version;
    let mut bad: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("three bytes".into(), payload[..3].to_vec()),
        ("half".into(), payload[..payload.len() / 2].to_vec()),
        (
            "last byte cut".into(),
            payload[..payload.len() - 1].to_vec(),
        ),
        ("a byte appended".into(), [&payload[..], b"\x00"].concat()),
        // A valid checksum, but an RDB version newer than any server.
        (
            "version 0xffff".into(),
            seal(payload[..payload.len() - 10].to_vec(), 0xffff),
        ),
        (
            "version + 1 in the high byte".into(),
            seal(payload[..payload.len() - 10].to_vec(), rdb_version + 0x100),
        ),
    ];
    // One flipped bit anywhere: type, module id, value, version or checksum.
    for i in 0..payload.len() {
        let mut flipped = payload.clone();
        flipped[i] ^= 0x10;
        bad.push((format!("bit 4 of byte {i} flipped"), flipped));
    }
    for (what, bytes) in &bad {
        let got = error_text(
            &mut con,
            redis::cmd("RESTORE").arg("k").arg(0).arg(&bytes[..]),
        );
        assert_eq!(got, BAD_PAYLOAD, "{what}");
        assert!(!exists(&mut con, b"k"), "{what}: RESTORE created the key");
        assert!(
            server.is_alive(),
            "{what}: server died; log:\n{}",
            server.log()
        );
    }
    assert_no_crash(&server);
}

#[test]
fn restore_refuses_bad_bodies_with_a_valid_checksum() {
    let server = Server::start();
    let mut con = server.conn();
    set_state(&mut con, b"src", FIXTURE_FULL_AT_NS, None);
    let good = ModuleDump::parse(&dump(&mut con, b"src").expect("bucket"));
    assert_eq!(good.encoding_version(), ENCVER_NOW);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
    let with = |encver: u64, fields: Vec<u8>| {
        ModuleDump {
            module_id: (good.module_id & !ENCVER_MASK) | encver,
            fields,
            ..good.clone()
        }
        .build()
    };
    let v2 = |fields: Vec<u8>| with(2, fields);
    let ns = rdb_len(FIXTURE_FULL_AT_NS);
    let uint = |value: u64| [&[OPCODE_UINT][..], &rdb_len(value)].concat();
    let out_of_range = Some("rl-bucket: stored state out of range");
    let unknown_version = Some("rl-bucket: unknown encoding version");
    // (what, payload, the module's log line if the module itself must refuse it)
    let rows: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        // --- encoding version 2: full_at_ns, full_at_frac
        ("v2 full_at_ns 0", v2(uint_fields(&[0, 0])), out_of_range),
        (
            "v2 full_at_ns 0, a fraction",
            v2(uint_fields(&[0, 1])),
            out_of_range,
        ),
        (
            "v2 full_at_ns i64::MAX + 1",
            v2(uint_fields(&[MAX_NS + 1, 0])),
            out_of_range,
        ),
        (
            "v2 full_at_ns u64::MAX",
            v2(uint_fields(&[u64::MAX, 0])),
            out_of_range,
        ),
        (
            "v2 full_at_frac 2^63 (a whole nanosecond)",
            v2(uint_fields(&[FIXTURE_FULL_AT_NS, MAX_FRAC + 1])),
            out_of_range,
        ),
        (
            "v2 full_at_frac u64::MAX",
            v2(uint_fields(&[FIXTURE_FULL_AT_NS, u64::MAX])),
            out_of_range,
        ),
        (
            "v2 both past their range",
            v2(uint_fields(&[u64::MAX, u64::MAX])),
            out_of_range,
        ),
        // Cut short after the module id: the loader meets the footer where its field should
        // be, a wrong opcode, which HANDLE_IO_ERRORS turns into a refused load.
        ("v2 no fields at all", v2(vec![]), None),
        // One field, then EOF: the second load meets the EOF opcode instead of UINT.
        (
            "v2 truncated after full_at_ns, then EOF",
            v2(uint_fields(&[FIXTURE_FULL_AT_NS])),
            None,
        ),
        // One field and nothing more: the second load reads the footer.
        (
            "v2 truncated after full_at_ns",
            v2(uint(FIXTURE_FULL_AT_NS)),
            None,
        ),
        (
            "v2 a signed full_at_frac",
            v2([uint(FIXTURE_FULL_AT_NS), vec![OPCODE_SINT, 1, OPCODE_EOF]].concat()),
            None,
        ),
        (
            "v2 a string full_at_frac",
            v2([
                uint(FIXTURE_FULL_AT_NS),
                vec![OPCODE_STRING, 1, b'a', OPCODE_EOF],
            ]
            .concat()),
            None,
        ),
        (
            "v2 a signed full_at_ns",
            v2([&[OPCODE_SINT][..], &ns, &uint(0), &[OPCODE_EOF]].concat()),
            None,
        ),
        (
            "v2 a third field before EOF",
            v2(uint_fields(&[FIXTURE_FULL_AT_NS, 1, 1])),
            None,
        ),
        (
            "v2 no EOF opcode",
            v2([uint(FIXTURE_FULL_AT_NS), uint(1)].concat()),
            None,
        ),
        // --- encoding version 1 (0.1.0): full_at_ns alone
        ("v1 full_at_ns 0", with(1, uint_fields(&[0])), out_of_range),
        (
            "v1 full_at_ns i64::MAX + 1",
            with(1, uint_fields(&[MAX_NS + 1])),
            out_of_range,
        ),
        (
            "v1 full_at_ns u64::MAX",
            with(1, uint_fields(&[u64::MAX])),
            out_of_range,
        ),
        ("v1 no fields at all", with(1, vec![]), None),
        (
            "v1 with a second field (v2's layout under v1)",
            with(1, uint_fields(&[FIXTURE_FULL_AT_NS, 0])),
            None,
        ),
        (
            "v1 a signed field instead of unsigned",
            with(1, [&[OPCODE_SINT][..], &ns, &[OPCODE_EOF]].concat()),
            None,
        ),
        (
            "v1 a string field instead of unsigned",
            with(1, vec![OPCODE_STRING, 3, b'a', b'b', b'c', OPCODE_EOF]),
            None,
        ),
        ("v1 no EOF opcode", with(1, uint(FIXTURE_FULL_AT_NS)), None),
        // --- other encoding versions and types, with valid-looking v2 fields
        (
            "encoding version 0",
            with(0, uint_fields(&[FIXTURE_FULL_AT_NS, 0])),
            unknown_version,
        ),
        (
            "encoding version 3",
            with(3, uint_fields(&[FIXTURE_FULL_AT_NS, 0])),
            unknown_version,
        ),
        (
            "encoding version 1023",
            with(1023, uint_fields(&[FIXTURE_FULL_AT_NS, 0])),
            unknown_version,
        ),
        (
            "another module's type id",
            ModuleDump {
                module_id: good.module_id ^ (1 << 20),
                ..good.clone()
            }
            .build(),
            None,
        ),
    ];
    for (what, payload, log_line) in &rows {
        let logged_before = log_line.map(|line| server.log().matches(line).count());
        let got = redis::cmd("RESTORE")
            .arg("k")
            .arg(0)
            .arg(&payload[..])
            .query::<redis::Value>(&mut con)
            .map_err(|e| format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")));
        assert_eq!(got, Err(BAD_DATA.to_string()), "{what}: {payload:02x?}");
        assert!(!exists(&mut con, b"k"), "{what}: RESTORE created the key");
        let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
        assert_eq!(dbsize, 0, "{what}: a key was created");
        assert!(
            server.is_alive(),
            "{what}: server died; log:\n{}",
            server.log()
        );
        if let (Some(line), Some(before)) = (log_line, logged_before) {
            assert_eq!(
                server.log().matches(line).count(),
                before + 1,
                "{what}: the module logs {line:?}"
            );
        }
    }
    // The same payloads with valid fields load, to the state they hold, so the rows above fail
    // for their reason: (what, encoding version, fields, the state loaded).
    type Valid = (&'static str, u64, &'static [u64], (u64, u64));
    let valid: &[Valid] = &[
        (
            "v2 whole",
            2,
            &[FIXTURE_FULL_AT_NS, 0],
            (FIXTURE_FULL_AT_NS, 0),
        ),
        (
            "v2 a fraction",
            2,
            &[FIXTURE_FULL_AT_NS, 1],
            (FIXTURE_FULL_AT_NS, 1),
        ),
        (
            "v2 the largest fraction",
            2,
            &[FIXTURE_FULL_AT_NS, MAX_FRAC],
            (FIXTURE_FULL_AT_NS, MAX_FRAC),
        ),
        (
            "v2 the latest state",
            2,
            &[MAX_NS, MAX_FRAC],
            (MAX_NS, MAX_FRAC),
        ),
        ("v2 the earliest state", 2, &[1, 0], (1, 0)),
        ("v1", 1, &[FIXTURE_FULL_AT_NS], (FIXTURE_FULL_AT_NS, 0)),
        ("v1 the latest state", 1, &[MAX_NS], (MAX_NS, 0)),
    ];
    for &(what, encver, fields, state) in valid {
        let ok: String = redis::cmd("RESTORE")
            .arg("k")
            .arg(0)
            .arg(with(encver, uint_fields(fields)))
            .arg("REPLACE")
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RESTORE {what}: {e}"));
        assert_eq!(ok, "OK");
        // RESTORE with TTL 0 keeps no expiry of its own; DUMP shows the state, in version 2.
        assert_eq!(stored_state(&mut con, b"k"), state, "{what}");
        let canonical = with(ENCVER_NOW, uint_fields(&[state.0, state.1]));
        assert_eq!(dump(&mut con, b"k"), Some(canonical), "{what}");
        // The bucket RL.SETSTATE writes for that state, where it lies in the future (a past
        // one expires at once).
        if state.0 > FIXTURE_FULL_AT_NS / 2 {
            set_state(&mut con, b"same", state.0, Some(state.1));
            assert_eq!(dump(&mut con, b"k"), dump(&mut con, b"same"), "{what}");
        }
    }
    assert_no_crash(&server);
}

#[test]
fn v1_fixture_restores_to_its_state() {
    // The fixture is what it claims: a checksummed rl-bucket value of encoding version 1.
    let fixture = ModuleDump::parse(FIXTURE_V1);
    assert_eq!(fixture.encoding_version(), 1);
    assert_eq!(fixture.full_at_ns(), FIXTURE_FULL_AT_NS);
    let expire_at_ms = FIXTURE_FULL_AT_NS.div_ceil(1_000_000);
    assert_eq!(expire_at_ms, 4_102_444_800_001);

    let server = Server::start();
    let mut con = server.conn();
    let ok: String = redis::cmd("RESTORE")
        .arg("old")
        .arg(expire_at_ms)
        .arg(FIXTURE_V1)
        .arg("ABSTTL")
        .query(&mut con)
        .expect("RESTORE the fixture");
    assert_eq!(ok, "OK");
    let key_type: String = redis::cmd("TYPE").arg("old").query(&mut con).expect("TYPE");
    assert_eq!(key_type, "rl-bucket");
    assert_eq!(pexpiretime(&mut con, b"old"), expire_at_ms as i64);
    // Re-saved in today's encoding, it equals a bucket set to the same state today. (This
    // holds after a format change too; comparing to the fixture's bytes would not.)
    let ok: String = redis::cmd("RL.SETSTATE")
        .arg("new")
        .arg(FIXTURE_FULL_AT_NS)
        .query(&mut con)
        .expect("RL.SETSTATE");
    assert_eq!(ok, "OK");
    assert_eq!(dump(&mut con, b"old"), dump(&mut con, b"new"));
    assert_eq!(stored_state(&mut con, b"old"), (FIXTURE_FULL_AT_NS, 0));
    assert_eq!(pexpiretime(&mut con, b"new"), expire_at_ms as i64);

    // It behaves as that state says. With cost 0 nothing changes, and the time to full is
    // full_at - now, for a `now` between two TIME readings around the call.
    let time_us = |con: &mut Connection| -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
        s * 1_000_000 + us
    };
    let before_us = time_us(&mut con);
    let [allowed, _, retry_after_ms, reset_after_ms] =
        acquire(&mut con, b"old", "1", "3153600000", Some("0"));
    let after_us = time_us(&mut con);
    assert_eq!((allowed, retry_after_ms), (1, 0));
    // The server's clock may be millisecond-grained, so `now` is at least `before` floored
    // to a millisecond.
    let earliest_ns = before_us / 1_000 * 1_000_000;
    let latest_ns = after_us * 1_000;
    let reset_ms = |now_ns: u64| (FIXTURE_FULL_AT_NS - now_ns).div_ceil(1_000_000) as i64;
    assert!(
        (reset_ms(latest_ns)..=reset_ms(earliest_ns)).contains(&reset_after_ms),
        "reset_after_ms {reset_after_ms} not in [{}, {}]",
        reset_ms(latest_ns),
        reset_ms(earliest_ns)
    );
    assert_eq!(
        dump(&mut con, b"old"),
        dump(&mut con, b"new"),
        "cost 0 changes nothing"
    );
    // Taking one token at 1 token/s moves full_at exactly 1 s later, whatever the time,
    // because full_at is already in the future.
    let [allowed, _, retry_after_ms, _] = acquire(&mut con, b"old", "1", "3153600000", Some("1"));
    assert_eq!((allowed, retry_after_ms), (1, 0));
    let (taken, taken_frac) = stored_state(&mut con, b"old");
    assert_eq!((taken, taken_frac), (FIXTURE_FULL_AT_NS + 1_000_000_000, 0));
    assert_eq!(
        pexpiretime(&mut con, b"old"),
        taken.div_ceil(1_000_000) as i64
    );
    assert_no_crash(&server);
}

/// `MEMORY USAGE key`.
fn memory_usage(con: &mut Connection, key: &[u8]) -> i64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(con)
        .expect("MEMORY USAGE")
}

#[test]
fn memory_usage_counts_a_fraction_as_16_bytes_through_every_copy() {
    let server = Server::start();
    let mut con = server.conn();
    // Keys of one length, so only the values differ.
    set_state(&mut con, b"whole", FIXTURE_FULL_AT_NS, None);
    set_state(&mut con, b"fract", FIXTURE_FULL_AT_NS, Some(FIXED_FRAC));
    assert_eq!(acquire(&mut con, b"third", "3", "3000", Some("1000"))[0], 1);
    assert_eq!(
        acquire(&mut con, b"tens_", "10", "10000", Some("5000"))[0],
        1
    );
    let whole = memory_usage(&mut con, b"whole");
    assert_eq!(memory_usage(&mut con, b"fract"), whole + 16, "a fraction");
    assert_eq!(
        memory_usage(&mut con, b"third"),
        whole + 16,
        "RL.ACQUIRE at 3/s"
    );
    assert_eq!(
        memory_usage(&mut con, b"tens_"),
        whole,
        "RL.ACQUIRE at 10/s"
    );
    // Copies and reloads hold the same kind of value.
    let payload = dump(&mut con, b"fract").expect("bucket");
    // With the source's expiry: Valkey 9 counts a key's expiry in its MEMORY USAGE.
    let ok: String = redis::cmd("RESTORE")
        .arg("rest_")
        .arg(pexpiretime(&mut con, b"fract"))
        .arg(&payload)
        .arg("ABSTTL")
        .query(&mut con)
        .expect("RESTORE");
    assert_eq!(ok, "OK");
    let copied: i64 = redis::cmd("COPY")
        .arg("fract")
        .arg("copy_")
        .query(&mut con)
        .expect("COPY");
    assert_eq!(copied, 1);
    assert_eq!(memory_usage(&mut con, b"rest_"), whole + 16, "RESTORE");
    assert_eq!(memory_usage(&mut con, b"copy_"), whole + 16, "COPY");
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(memory_usage(&mut con, b"whole"), whole, "whole, reloaded");
    assert_eq!(
        memory_usage(&mut con, b"fract"),
        whole + 16,
        "fraction, reloaded"
    );
    // Overwriting with a whole state gives the 16 bytes back.
    set_state(&mut con, b"fract", FIXTURE_FULL_AT_NS, Some(0));
    assert_eq!(memory_usage(&mut con, b"fract"), whole);
    assert_no_crash(&server);
}

/// Checks that the server holds exactly `buckets`, each a whole-nanosecond state with its
/// expiry, and byte for byte the bucket `RL.SETSTATE` writes today for the same instant.
fn assert_holds_v1_buckets(con: &mut Connection, buckets: &[(&[u8], u64)]) {
    let keys: Vec<Vec<u8>> = buckets.iter().map(|(k, _)| k.to_vec()).collect();
    assert_eq!(common::all_keys(con), keys);
    for &(key, full_at_ns) in buckets {
        let name = String::from_utf8_lossy(key);
        let key_type: String = redis::cmd("TYPE").arg(key).query(con).expect("TYPE");
        assert_eq!(key_type, "rl-bucket", "{name:?}");
        assert_eq!(stored_state(con, key), (full_at_ns, 0), "{name:?}");
        assert_eq!(
            pexpiretime(con, key),
            expire_at_ms((full_at_ns, 0)),
            "{name:?}"
        );
        let today = [b"today:", key].concat();
        set_state(con, &today, full_at_ns, None);
        assert_eq!(dump(con, key), dump(con, &today), "{name:?}");
        assert_eq!(pexpiretime(con, &today), pexpiretime(con, key), "{name:?}");
        let _: i64 = redis::cmd("DEL").arg(&today).query(con).expect("DEL");
    }
}

#[test]
fn v1_rdb_fixture_loads_to_the_same_buckets() {
    // The fixture is what it claims: an RDB of version 10 whose four module values all carry
    // the rl-bucket type id with encoding version 1 (after each key, as rdbSaveLen).
    assert!(FIXTURE_V1_RDB.starts_with(b"REDIS0010"));
    let mut server = Server::start();
    let mut con = server.conn();
    set_state(&mut con, b"probe", FIXTURE_FULL_AT_NS, None);
    let module_id = ModuleDump::parse(&dump(&mut con, b"probe").expect("bucket")).module_id;
    let values_of = |encver: u64| {
        let id = rdb_len((module_id & !ENCVER_MASK) | encver);
        FIXTURE_V1_RDB
            .windows(id.len())
            .filter(|w| *w == &id[..])
            .count()
    };
    assert_eq!(values_of(1), FIXTURE_V1_RDB_BUCKETS.len());
    assert_eq!(values_of(ENCVER_NOW), 0);

    server.kill();
    std::fs::write(server.dir.path().join("dump.rdb"), FIXTURE_V1_RDB).expect("write dump.rdb");
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_holds_v1_buckets(&mut con, FIXTURE_V1_RDB_BUCKETS);
    // Saved again, now in encoding version 2, it loads to the same buckets.
    let before = FIXTURE_V1_RDB_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    let saved = std::fs::read(server.dir.path().join("dump.rdb")).expect("read dump.rdb");
    assert_ne!(saved, FIXTURE_V1_RDB, "SAVE rewrote the file");
    server.restart_with(&[]);
    let mut con = server.conn();
    let after = FIXTURE_V1_RDB_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    assert_eq!(after, before);
    // And they work: a cost 0 call on the latest one, which owes centuries, is denied.
    let [allowed, ..] = acquire(&mut con, b"a", "1", "10", Some("0"));
    assert_eq!(
        allowed, 0,
        "a bucket full only in 2100 owes more than it holds"
    );
    assert_no_crash(&server);
}

#[test]
fn v1_aof_fixture_replays_to_the_same_buckets() {
    // The fixture holds 0.1.0's forms only: RL.SETSTATE key full_at_ns, and the PEXPIREAT
    // that follows each bucket in a rewrite.
    let mut files: Vec<PathBuf> = std::fs::read_dir(FIXTURE_V1_AOF_DIR)
        .expect("the AOF fixture directory")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    let mut set_states = 0;
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "aof"))
    {
        for command in parse_aof(&std::fs::read(file).expect("read")) {
            let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
            match name.as_str() {
                "SELECT" | "PEXPIREAT" => {}
                "RL.SETSTATE" => {
                    assert_eq!(command.len(), 3, "{file:?}: {command:?}");
                    set_states += 1;
                }
                other => panic!("{file:?} holds {other}"),
            }
        }
    }
    assert_eq!(set_states, FIXTURE_V1_AOF_BUCKETS.len() + 1, "two for c");

    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mut server = Server::start_with(&args);
    server.kill();
    let aof_dir = server.dir.path().join("appendonlydir");
    let _ = std::fs::remove_dir_all(&aof_dir);
    std::fs::create_dir(&aof_dir).expect("create appendonlydir");
    for file in &files {
        let name = file.file_name().expect("file name");
        std::fs::copy(file, aof_dir.join(name)).expect("copy a fixture file");
    }
    server.restart_with(&args);
    let mut con = server.conn();
    assert_holds_v1_buckets(&mut con, FIXTURE_V1_AOF_BUCKETS);
    // Rewritten by today's module, the AOF replays to the same buckets again.
    let before = FIXTURE_V1_AOF_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    rewrite_aof(&server, &mut con);
    server.restart_with(&args);
    let mut con = server.conn();
    let after = FIXTURE_V1_AOF_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    assert_eq!(after, before);
    assert_no_crash(&server);
}
