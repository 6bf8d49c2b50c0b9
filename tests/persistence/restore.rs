//! `DUMP`/`RESTORE` and `COPY` keep exact, independent states; `RESTORE` refuses every corrupt
//! payload (a bad checksum or RDB version, and bad bodies under a valid checksum) without
//! creating a key or crashing, and the module logs why when it is the one refusing.

use crate::buckets::{assert_no_crash, populate, FIXED_FRAC, KEYS};
use crate::common::rdb::rdb_len;
use crate::common::{acquire, dump, exists, pexpiretime, Server};
use crate::fixtures::FIXTURE_FULL_AT_NS;
use crate::format::{
    seal, set_state, stored_state, uint_fields, ModuleDump, ENCVER_MASK, ENCVER_NOW, MAX_FRAC,
    MAX_NS, OPCODE_EOF, OPCODE_SINT, OPCODE_STRING, OPCODE_UINT,
};

const BAD_PAYLOAD: &str = "ERR DUMP payload version or checksum are wrong";
const BAD_DATA: &str = "ERR Bad data format";

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
        // Named on failure with the bytes sent, so a payload the server took is known.
        let got = match redis::cmd("RESTORE")
            .arg("k")
            .arg(0)
            .arg(&bytes[..])
            .query::<redis::Value>(&mut con)
        {
            Ok(reply) => panic!(
                "{what}: RESTORE answered {reply:?} to {bytes:02x?} (the good payload: \
                 {payload:02x?}); log:\n{}",
                server.log()
            ),
            Err(e) => rl_testkit::error_reply_text(&e),
        };
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
