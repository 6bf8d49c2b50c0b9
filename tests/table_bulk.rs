//! Tables move in bulk: the RDB encoding of a table (version 2, and 3 after it) is its count and a few large
//! string fields of fixed-width records, so `DUMP`, `RESTORE`, `MIGRATE`, `SAVE` and loading
//! cost a copy of the records, not three RDB fields per bucket.
//!
//! Checked here against a real server: a table of 200,000 buckets comes back equal through
//! `DUMP`/`RESTORE`, `MIGRATE` and `DEBUG RELOAD`, and the same buckets reached by another
//! history dump to the same bytes; what the bucket-by-bucket writer (version 1) wrote still
//! loads, as a `DUMP` payload and as an RDB file (`tests/fixtures/table-v1.*`), and so does
//! what version 2 wrote before reservation records (`table-v2.*`); and payloads
//! cut short or altered (checksummed again, so the server hands them to the module) are
//! refused with no crash. `src/table/tests.rs` checks the decoder's every refusal in process.

#![cfg(test)]

mod common;

use common::rdb::{crc64, CRASH_MARKERS};
use common::{dump, Server};
use redis::Connection;

const BUCKETS: usize = 200_000;
/// Buckets per `RL.HSETSTATE` call.
const PER_CALL: usize = 1_000;
const FIXTURE_V1_DUMP: &[u8] = include_bytes!("fixtures/table-v1.dump");
const FIXTURE_V1_RDB: &[u8] = include_bytes!("fixtures/table-v1.rdb");
const FIXTURE_V2_DUMP: &[u8] = include_bytes!("fixtures/table-v2.dump");
const FIXTURE_V2_RDB: &[u8] = include_bytes!("fixtures/table-v2.rdb");
/// The encoding this build writes: version 2 followed by the reservation records' count.
const ENCVER_NOW: u64 = 3;
const RECORD_BYTES: usize = 32;

/// A bucket as `RL.HSETSTATE` takes it: tag, `full_at_ns`, `full_at_frac`.
type Bucket = ([u8; 16], u64, u64);

/// `n` buckets of random tags from a fixed seed, full in 2100 and later, a third with a
/// fraction.
fn buckets(n: usize, seed: u64) -> Vec<Bucket> {
    let mut x = seed;
    let mut next = move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|i| {
            let tag = (u128::from(next()) << 64) | u128::from(next());
            let frac = if i % 3 == 0 { next() >> 2 } else { 0 };
            (
                tag.to_le_bytes(),
                4_102_444_800_000_000_000 + i as u64,
                frac,
            )
        })
        .collect()
}

/// Stores `buckets` in `key`, pipelined, `PER_CALL` a call.
fn fill(con: &mut Connection, key: &str, buckets: &[Bucket]) {
    let mut pipe = redis::pipe();
    for chunk in buckets.chunks(PER_CALL) {
        let cmd = pipe.cmd("RL.HSETSTATE").arg(key);
        for (tag, ns, frac) in chunk {
            cmd.arg(&tag[..]).arg(*ns).arg(*frac);
        }
        cmd.ignore();
    }
    let _: () = pipe.query(con).expect("RL.HSETSTATE");
}

fn hlen(con: &mut Connection, key: &str) -> u64 {
    redis::cmd("RL.HLEN").arg(key).query(con).expect("RL.HLEN")
}

fn restore(con: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query(con)
}

fn digest(con: &mut Connection, key: &str) -> String {
    let values: Vec<String> = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(con)
        .expect("DEBUG DIGEST-VALUE");
    values.concat()
}

/// The encoding version of a module value's `DUMP` payload: type byte 7, then the 64-bit
/// module id (0x81 and 8 bytes big-endian) whose low 10 bits are the version.
fn encoding_version(payload: &[u8]) -> u64 {
    assert_eq!(payload[..2], [7, 0x81], "a module value with a 64-bit id");
    u64::from_be_bytes(payload[2..10].try_into().unwrap()) & 0x3ff
}

/// `body` (a payload without its trailer) sealed with `version` and a valid CRC-64.
fn seal(body: &[u8], version: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(version);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn assert_no_crash(server: &Server) {
    let log = server.log();
    for marker in CRASH_MARKERS {
        assert!(!log.contains(marker), "the server crashed: {marker}\n{log}");
    }
}

#[test]
fn a_large_table_moves_whole_and_does_not_depend_on_history() {
    let server = Server::start();
    let mut con = server.conn();
    let all = buckets(BUCKETS, 1);
    fill(&mut con, "t", &all);
    assert_eq!(hlen(&mut con, "t"), BUCKETS as u64);
    let payload = dump(&mut con, b"t").expect("DUMP");
    assert_eq!(encoding_version(&payload), ENCVER_NOW);

    // DUMP/RESTORE: equal buckets, equal bytes, equal digest.
    restore(&mut con, "copy", &payload).expect("RESTORE");
    assert_eq!(hlen(&mut con, "copy"), BUCKETS as u64);
    assert_eq!(dump(&mut con, b"copy").expect("DUMP copy"), payload);
    assert_eq!(digest(&mut con, "copy"), digest(&mut con, "t"));

    // The same buckets by another history: 50,000 others first, then these in reverse,
    // then the others removed (other growths, other slots).
    let gone = buckets(50_000, 2);
    fill(&mut con, "other", &gone);
    let mut reversed = all.clone();
    reversed.reverse();
    fill(&mut con, "other", &reversed);
    let removals: Vec<Bucket> = gone.iter().map(|&(tag, _, _)| (tag, 0, 0)).collect();
    fill(&mut con, "other", &removals);
    assert_eq!(hlen(&mut con, "other"), BUCKETS as u64);
    assert_eq!(dump(&mut con, b"other").expect("DUMP other"), payload);
    assert_eq!(digest(&mut con, "other"), digest(&mut con, "t"));

    // DEBUG RELOAD (save and load the RDB): the same bytes.
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(dump(&mut con, b"t").expect("DUMP after reload"), payload);

    // MIGRATE to another server: the same bytes there.
    let target = Server::start();
    let mut there = target.conn();
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("t")
        .arg(0)
        .arg(60_000)
        .query(&mut con)
        .expect("MIGRATE");
    assert_eq!(dump(&mut there, b"t").expect("DUMP migrated"), payload);
    assert_eq!(dump(&mut con, b"t"), None, "MIGRATE moves the key");
    assert_no_crash(&server);
    assert_no_crash(&target);
}

/// The 1,000 buckets of `tests/fixtures/table-v1.*` and `table-v2.*` (see tests/fixtures/README.md).
fn fixture_buckets() -> Vec<Bucket> {
    (0..1000u64)
        .map(|i| {
            let tag: [u8; 16] = format!("t{i:015}").into_bytes().try_into().unwrap();
            let frac = if i % 3 == 0 { i * 1000 } else { 0 };
            (tag, 4_102_444_800_000_000_000 + i * 1_000_000_007, frac)
        })
        .collect()
}

#[test]
fn what_the_bucket_by_bucket_writer_wrote_still_loads() {
    still_loads(1, FIXTURE_V1_DUMP, FIXTURE_V1_RDB);
}

#[test]
fn what_was_written_before_reservation_records_still_loads() {
    still_loads(2, FIXTURE_V2_DUMP, FIXTURE_V2_RDB);
}

/// The fixtures of encoding `version` (a `DUMP` payload and an RDB file of the same 1,000
/// buckets) load to the buckets of a table set today, and are written again in today's
/// encoding, byte for byte as that table.
fn still_loads(version: u64, payload: &[u8], rdb: &[u8]) {
    assert_eq!(encoding_version(payload), version);
    assert!(rdb.starts_with(b"REDIS0010"));
    let mut server = Server::start();
    let mut con = server.conn();
    fill(&mut con, "today", &fixture_buckets());
    let today = dump(&mut con, b"today").expect("DUMP today");
    assert_eq!(encoding_version(&today), ENCVER_NOW);

    // The DUMP payload: the same buckets as today's table, written again today.
    restore(&mut con, "tbl", payload).expect("RESTORE the fixture");
    assert_eq!(hlen(&mut con, "tbl"), 1000);
    assert_eq!(dump(&mut con, b"tbl").expect("DUMP tbl"), today);
    assert_eq!(digest(&mut con, "tbl"), digest(&mut con, "today"));

    // The RDB file.
    server.kill();
    std::fs::write(server.dir.path().join("dump.rdb"), rdb).expect("write dump.rdb");
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_eq!(hlen(&mut con, "tbl"), 1000);
    let loaded = dump(&mut con, b"tbl").expect("DUMP tbl from the RDB");
    assert_eq!(loaded, today);
    assert_no_crash(&server);
}

#[test]
fn corrupt_and_truncated_payloads_are_refused() {
    let server = Server::start();
    let mut con = server.conn();
    // Raw strings, so records can be found and altered in the payload.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rdbcompression")
        .arg("no")
        .query(&mut con)
        .expect("CONFIG SET");
    // 40,000 buckets: a full block of 32,768 records and a partial one.
    let all = buckets(40_000, 3);
    fill(&mut con, "t", &all);
    let payload = dump(&mut con, b"t").expect("DUMP");
    let (body, trailer) = payload.split_at(payload.len() - 10);
    let version = &trailer[..2];
    // Sealed again unchanged, it loads: the harness is sound.
    restore(&mut con, "k", &seal(body, version)).expect("RESTORE of the resealed payload");
    assert_eq!(hlen(&mut con, "k"), 40_000);

    // The first record: the bucket with the least low half of its tag.
    let first = all
        .iter()
        .min_by_key(|(tag, _, _)| {
            (
                u64::from_le_bytes(tag[..8].try_into().unwrap()),
                tag[8..].to_vec(),
            )
        })
        .unwrap();
    let mut record = first.0.to_vec();
    record.extend_from_slice(&first.1.to_le_bytes());
    record.extend_from_slice(&first.2.to_le_bytes());
    let at = body
        .windows(RECORD_BYTES)
        .position(|w| w == &record[..])
        .expect("the first record in the payload");
    let second = at + RECORD_BYTES;

    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    // Cut short anywhere: in the count, in a block's length, inside a record, between blocks.
    for cut in [
        1,
        5,
        11,
        at - 1,
        at + 7,
        at + 40_000,
        body.len() / 2,
        body.len() - 300,
        body.len() - 1,
    ] {
        cases.push((format!("cut at {cut}"), body[..cut].to_vec()));
    }
    let altered = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = body.to_vec();
        f(&mut b);
        b
    };
    cases.push((
        "two records swapped".into(),
        altered(&|b| {
            let one = b[at..second].to_vec();
            let two = b[second..second + RECORD_BYTES].to_vec();
            b[at..second].copy_from_slice(&two);
            b[second..second + RECORD_BYTES].copy_from_slice(&one);
        }),
    ));
    cases.push((
        "a record repeated".into(),
        altered(&|b| {
            let one = b[at..second].to_vec();
            b[second..second + RECORD_BYTES].copy_from_slice(&one);
        }),
    ));
    cases.push((
        "a fraction out of range".into(),
        altered(&|b| b[at + 24..at + 32].copy_from_slice(&u64::MAX.to_le_bytes())),
    ));
    cases.push((
        "an instant of 0".into(),
        altered(&|b| b[at + 16..at + 24].copy_from_slice(&0u64.to_le_bytes())),
    ));
    for (name, body) in &cases {
        let got = restore(&mut con, "bad", &seal(body, version));
        assert!(got.is_err(), "{name}: accepted");
        let _: () = redis::cmd("PING").query(&mut con).expect("PING");
    }
    let exists: u64 = redis::cmd("EXISTS").arg("bad").query(&mut con).unwrap();
    assert_eq!(exists, 0, "nothing is written on a refusal");
    assert_no_crash(&server);
}
