//! The buckets every persistence path is tested with (whole-nanosecond states inline in the
//! value pointer, states with a fraction in their own allocation, a binary key), the snapshot
//! of them that must survive, and the check that the server did not crash.

use redis::Connection;

use crate::common::rdb::CRASH_MARKERS;
use crate::common::{acquire, dump, pexpiretime, Server};
use crate::fixtures::FIXTURE_FULL_AT_NS;
use crate::format::{expire_at_ms, set_state, stored_state, ModuleDump, ENCVER_NOW};

pub(crate) const NON_UTF8_KEY: &[u8] = b"\xff\xfe\x00bin\x80";

/// Every key `populate` writes, and whether its state has a fraction of a nanosecond.
pub(crate) const KEYS: &[(&[u8], bool)] = &[
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
pub(crate) const FIXED_FRAC: u64 = 3 << 61;

/// Writes the buckets of `KEYS` through `RL.ACQUIRE` and `RL.SETSTATE`, including two calls
/// that change nothing, and checks each state is whole or fractional as `KEYS` says. Returns
/// how many calls changed a bucket: each one propagates exactly one `RL.SETSTATE`.
pub(crate) fn populate(con: &mut Connection) -> usize {
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
pub(crate) struct Snapshot {
    pub(crate) buckets: Vec<(String, Vec<u8>, i64)>,
    pub(crate) dbsize: i64,
    pub(crate) digest: String,
}

pub(crate) fn snapshot(con: &mut Connection) -> Snapshot {
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

pub(crate) fn assert_no_crash(server: &Server) {
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
