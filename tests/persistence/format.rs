//! The `DUMP` format of a bucket, by hand: a payload taken apart into its module id, fields,
//! RDB version and checksum, and built again; the state and expiry it encodes; and the test
//! that these reproduce the server's own payloads and checksums byte for byte.

use redis::Connection;

use crate::buckets::{populate, KEYS};
use crate::common::rdb::{crc64, rdb_len};
use crate::common::{dump, Server};

/// The encoding version this build writes.
pub(crate) const ENCVER_NOW: u64 = 2;
/// The largest `full_at_ns` and `full_at_frac` (units of 2^-63 ns) a state may hold.
pub(crate) const MAX_NS: u64 = i64::MAX as u64;
pub(crate) const MAX_FRAC: u64 = i64::MAX as u64;

pub(crate) const RDB_TYPE_MODULE_2: u8 = 7;
pub(crate) const OPCODE_EOF: u8 = 0;
pub(crate) const OPCODE_SINT: u8 = 1;
pub(crate) const OPCODE_UINT: u8 = 2;
pub(crate) const OPCODE_STRING: u8 = 5;
pub(crate) const ENCVER_MASK: u64 = (1 << 10) - 1;

/// Reads one `rdbSaveLen` value: the value and how many bytes it took.
pub(crate) fn read_rdb_len(bytes: &[u8]) -> (u64, usize) {
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
pub(crate) struct ModuleDump {
    /// The module type id: 54 bits of name, 10 bits of encoding version.
    pub(crate) module_id: u64,
    /// What the module saved, then the EOF opcode.
    pub(crate) fields: Vec<u8>,
    /// The RDB version of the server that dumped it.
    pub(crate) rdb_version: u16,
}

impl ModuleDump {
    /// Splits a payload, checking its type byte and checksum.
    pub(crate) fn parse(payload: &[u8]) -> ModuleDump {
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
    pub(crate) fn build(&self) -> Vec<u8> {
        let mut body = vec![RDB_TYPE_MODULE_2];
        body.extend(rdb_len(self.module_id));
        body.extend_from_slice(&self.fields);
        seal(body, self.rdb_version)
    }

    /// The bucket's `(full_at_ns, full_at_frac)`: in encoding version 2 exactly two unsigned
    /// fields, in version 1 exactly one (the fraction is 0), then EOF.
    pub(crate) fn state(&self) -> (u64, u64) {
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

    pub(crate) fn full_at_ns(&self) -> u64 {
        self.state().0
    }

    pub(crate) fn encoding_version(&self) -> u64 {
        self.module_id & ENCVER_MASK
    }
}

/// Appends the RDB version and the checksum to a type byte and body.
pub(crate) fn seal(mut payload: Vec<u8>, rdb_version: u16) -> Vec<u8> {
    payload.extend_from_slice(&rdb_version.to_le_bytes());
    let crc = crc64(&payload);
    payload.extend_from_slice(&crc.to_le_bytes());
    payload
}

/// Unsigned fields holding `values`, then EOF: `[full_at_ns]` is a version 1 body,
/// `[full_at_ns, full_at_frac]` a version 2 one.
pub(crate) fn uint_fields(values: &[u64]) -> Vec<u8> {
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
pub(crate) fn expire_at_ms((full_at_ns, full_at_frac): (u64, u64)) -> i64 {
    let ns_ceil = full_at_ns + u64::from(full_at_frac > 0);
    i64::try_from(ns_ceil.div_ceil(1_000_000)).expect("fits")
}

/// `RL.SETSTATE key full_at_ns [full_at_frac]`.
pub(crate) fn set_state(
    con: &mut Connection,
    key: &[u8],
    full_at_ns: u64,
    full_at_frac: Option<u64>,
) {
    let mut cmd = redis::cmd("RL.SETSTATE");
    cmd.arg(key).arg(full_at_ns);
    if let Some(frac) = full_at_frac {
        cmd.arg(frac);
    }
    let ok: String = cmd.query(con).expect("RL.SETSTATE");
    assert_eq!(ok, "OK");
}

/// The stored `(full_at_ns, full_at_frac)` of a bucket, from its `DUMP`.
pub(crate) fn stored_state(con: &mut Connection, key: &[u8]) -> (u64, u64) {
    let payload = dump(con, key).unwrap_or_else(|| panic!("no bucket {key:?}"));
    let parsed = ModuleDump::parse(&payload);
    assert_eq!(parsed.encoding_version(), ENCVER_NOW);
    parsed.state()
}

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
