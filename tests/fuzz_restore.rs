//! A fuzzer for the module's RDB loader through the real server: `RESTORE` of mutated
//! `rl-bucket` payloads, checksummed so that the server hands each body to `rdb_load`.
//!
//! `rdb_load` reads through Redis's own IO (`RedisModule_LoadUnsigned` and the opcode checks
//! of the v2 module format), which no in-process fuzzer can drive, so this harness drives the
//! real path. Ignored by `cargo test`; run it with `make fuzz` (600 s) or `make fuzz-smoke`,
//! or directly:
//!
//! ```sh
//! cargo build --lib && FUZZ_SECONDS=60 cargo test --test fuzz_restore -- --ignored --nocapture
//! ```
//!
//! `FUZZ_SECONDS` (default 5) bounds the run; `FUZZ_SEED` replays a run (the seed is printed).
//! Inputs: bodies built from random fields (opcodes, values, length encodings, trailing
//! bytes) and byte-level mutations (bit flips, truncations, insertions, extensions) of real
//! `DUMP` bodies and of bodies that loaded. Each is sealed with the server's RDB version and a
//! valid CRC-64, then sent as `RESTORE k 0 <payload> REPLACE`, then `PING`.
//!
//! Checks for every input:
//! - the reply is `OK` or exactly `ERR Bad data format`, and the server answers `PING`;
//! - `OK` exactly when the body is what the v2 module format and the decoder's contract accept
//!   (encoding version 2: two unsigned fields, `full_at_ns` in 1..=i64::MAX and `full_at_frac`
//!   in 0..=i64::MAX; or encoding version 1, as 0.1.0 wrote: `full_at_ns` alone; then EOF,
//!   in any length encoding `rdbLoadLen` reads), modelled below from Redis's loader;
//! - after `OK`: `DUMP` holds exactly the loaded state in canonical form, `TYPE` is
//!   `rl-bucket`, `DEBUG DIGEST-VALUE` works and `RL.ACQUIRE` on the key replies normally;
//! - at the end, the server log holds no crash report.
//!
//! A failing input is written to `fuzz/artifacts/restore/` (type byte and body, without the
//! version and checksum); checked into `fuzz/regressions/restore/`, it is replayed first on
//! every run.

#![cfg(test)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::rdb::{crc64, crc64_bitwise, rdb_len, CRASH_MARKERS};
use common::{dump, Server};
use redis::{Connection, Value};

const RDB_TYPE_MODULE_PRE_GA: u8 = 6;
const RDB_TYPE_MODULE_2: u8 = 7;
const OPCODE_EOF: u64 = 0;
const OPCODE_SINT: u64 = 1;
const OPCODE_UINT: u64 = 2;
const OPCODE_FLOAT: u64 = 3;
const OPCODE_DOUBLE: u64 = 4;
const OPCODE_STRING: u64 = 5;
const ENCVER_BITS: u32 = 10;
const MAX_FULL_AT_NS: u64 = i64::MAX as u64;
const MAX_FULL_AT_FRAC: u64 = i64::MAX as u64;
/// The encoding version written today: `full_at_ns`, `full_at_frac`.
const ENCVER_NOW: u64 = 2;

const BAD_DATA: &str = "ERR Bad data format";

// ---------------------------------------------------------------------------------------
// The DUMP format (CRC-64 and rdbSaveLen are in tests/common/rdb.rs)
// ---------------------------------------------------------------------------------------

/// What `rdbLoadLen(rdb, NULL)` reads: the value and the bytes it took, or `None` where it
/// fails (a short read, or a `10xxxxxx` prefix other than 0x80 and 0x81). A `11xxxxxx`
/// prefix (an encoded-string marker) reads as its low 6 bits when the caller passes no
/// `isencoded`, as the module loader does.
fn read_len(bytes: &[u8]) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    match first >> 6 {
        0 | 3 => Some((u64::from(first & 0x3f), 1)),
        1 => Some((
            (u64::from(first & 0x3f) << 8) | u64::from(*bytes.get(1)?),
            2,
        )),
        _ if first == 0x80 => Some((
            u64::from(u32::from_be_bytes(bytes.get(1..5)?.try_into().ok()?)),
            5,
        )),
        _ if first == 0x81 => Some((u64::from_be_bytes(bytes.get(1..9)?.try_into().ok()?), 9)),
        _ => None,
    }
}

/// The payload `RESTORE` takes: type byte and body, RDB version, CRC-64 of all that.
fn seal(type_and_body: &[u8], rdb_version: u16) -> Vec<u8> {
    let mut payload = type_and_body.to_vec();
    payload.extend_from_slice(&rdb_version.to_le_bytes());
    let crc = crc64(&payload);
    payload.extend_from_slice(&crc.to_le_bytes());
    payload
}

/// Whether the server must accept `payload` (sealed: type byte, body, RDB version and CRC),
/// and if so the state it must hold. The loader reads the payload as one buffer, so a body cut
/// short goes on into the version and checksum bytes.
///
/// Redis 7 (`rdbLoadObject`): for type 7 (module format 2) or 6 (the pre-GA format 1), it
/// reads the module id with `rdbLoadLen` and finds the type by its upper 54 bits, then calls
/// `rdb_load` with the low 10 bits as the encoding version. In format 1 `RedisModule_
/// LoadUnsigned` reads the value with `rdbLoadLen`; in format 2 it first reads an opcode that
/// must be UINT, and after `rdb_load` Redis reads an EOF opcode that must be 0. A failed read
/// sets the IO error flag the module checks; a NULL value refuses the load; bytes after the
/// value are not read. The module accepts encoding version 2 with two values, `full_at_ns` in
/// `1..=i64::MAX` and `full_at_frac` in `0..=i64::MAX`, and encoding version 1 with the first
/// alone (its fraction is 0). Returns `(full_at_ns, full_at_frac)`.
fn expected_state(payload: &[u8], module_sign: u64) -> Option<(u64, u64)> {
    let (&type_byte, body) = payload.split_first()?;
    let format_2 = match type_byte {
        RDB_TYPE_MODULE_2 => true,
        RDB_TYPE_MODULE_PRE_GA => false,
        _ => return None,
    };
    let (id, used) = read_len(body)?;
    let mut body = body.get(used..)?;
    if id >> ENCVER_BITS != module_sign {
        return None;
    }
    let fields = match id & ((1 << ENCVER_BITS) - 1) {
        1 => 1,
        ENCVER_NOW => 2,
        _ => return None,
    };
    let mut values = [0u64; 2];
    for value in values.iter_mut().take(fields) {
        if format_2 {
            let (opcode, used) = read_len(body)?;
            body = body.get(used..)?;
            if opcode != OPCODE_UINT {
                return None;
            }
        }
        let (read, used) = read_len(body)?;
        body = body.get(used..)?;
        *value = read;
    }
    let [full_at_ns, full_at_frac] = values;
    if !(1..=MAX_FULL_AT_NS).contains(&full_at_ns) || full_at_frac > MAX_FULL_AT_FRAC {
        return None;
    }
    if format_2 && read_len(body)?.0 != OPCODE_EOF {
        return None;
    }
    Some((full_at_ns, full_at_frac))
}

// ---------------------------------------------------------------------------------------
// Random inputs
// ---------------------------------------------------------------------------------------

/// SplitMix64: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True `percent` times out of 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Values worth trying as lengths, opcodes and states: encoding boundaries, the state range's
/// ends, a time near now.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    5,
    63,
    64,
    16_383,
    16_384,
    u32::MAX as u64,
    u32::MAX as u64 + 1,
    1_700_000_000_000_000_000,
    4_102_444_800_000_000_123,
    MAX_FULL_AT_NS - 1,
    MAX_FULL_AT_NS,
    MAX_FULL_AT_NS + 1,
    u64::MAX,
    // Fractions of a nanosecond (units of 2^-63 ns): a third, two thirds, a half.
    3_074_457_345_618_258_603,
    6_148_914_691_236_517_206,
    1 << 62,
];

const INTERESTING_BYTES: &[u8] = &[
    0x00, 0x01, 0x02, 0x03, 0x05, 0x3f, 0x40, 0x7f, 0x80, 0x81, 0x82, 0xbf, 0xc0, 0xc2, 0xff,
];

fn random_value(rng: &mut Rng) -> u64 {
    match rng.below(4) {
        0 => rng.next(),
        1 => rng.next() >> rng.below(64),
        _ => {
            let v = rng.pick(INTERESTING);
            v.wrapping_add(rng.pick(&[0, 0, 0, 1, u64::MAX]))
        }
    }
}

/// `value` in a length encoding `rdbLoadLen` reads (mostly the canonical one), or sometimes
/// a form it refuses or a cut-short one.
fn encode_len(rng: &mut Rng, value: u64) -> Vec<u8> {
    let mut forms = vec![rdb_len(value), rdb_len(value)];
    let mut wide = vec![0x81];
    wide.extend_from_slice(&value.to_be_bytes());
    forms.push(wide);
    if let Ok(v) = u32::try_from(value) {
        let mut mid = vec![0x80];
        mid.extend_from_slice(&v.to_be_bytes());
        forms.push(mid);
    }
    if value < 1 << 14 {
        forms.push(vec![0x40 | (value >> 8) as u8, value as u8]);
    }
    if value < 1 << 6 {
        forms.push(vec![0xc0 | value as u8]);
    }
    let mut out = forms[rng.below(forms.len())].clone();
    match rng.below(50) {
        0 => out[0] = 0x82 + rng.below(0x3e) as u8, // an unknown length prefix
        1 => out.truncate(rng.below(out.len())),    // cut short
        _ => {}
    }
    out
}

/// A body made field by field: module id, 0 to 3 fields, usually an EOF, sometimes trailing
/// bytes.
fn structured(rng: &mut Rng, module_sign: u64) -> Vec<u8> {
    let encver = match rng.below(20) {
        0..=10 => ENCVER_NOW,
        11..=16 => 1,
        _ => {
            let random = rng.next() & 1023;
            rng.pick(&[0, 3, 4, 1023, random])
        }
    };
    let id = match rng.below(10) {
        0 => rng.next(),
        1 => (module_sign << ENCVER_BITS | encver) ^ (1 << rng.below(64)),
        _ => module_sign << ENCVER_BITS | encver,
    };
    let mut body = vec![RDB_TYPE_MODULE_2];
    body.extend(encode_len(rng, id));
    // Mostly the field count of the version, sometimes one more or fewer.
    let fields = if rng.chance(75) {
        if encver == 1 {
            1
        } else {
            2
        }
    } else {
        rng.pick(&[0, 1, 2, 3])
    };
    for _ in 0..fields {
        let opcode = if rng.chance(70) {
            OPCODE_UINT
        } else {
            let random = rng.next();
            rng.pick(&[
                OPCODE_EOF,
                OPCODE_SINT,
                OPCODE_FLOAT,
                OPCODE_DOUBLE,
                OPCODE_STRING,
                6,
                63,
                random,
            ])
        };
        body.extend(encode_len(rng, opcode));
        match opcode {
            OPCODE_UINT | OPCODE_SINT => {
                let value = random_value(rng);
                body.extend(encode_len(rng, value));
            }
            OPCODE_FLOAT => body.extend(rng.bytes(4)),
            OPCODE_DOUBLE => body.extend(rng.bytes(8)),
            OPCODE_STRING => {
                let len = rng.below(12);
                body.extend(encode_len(rng, len as u64));
                body.extend(rng.bytes(len));
            }
            _ => {
                let n = rng.below(10);
                body.extend(rng.bytes(n));
            }
        }
    }
    if rng.chance(85) {
        body.extend(encode_len(rng, OPCODE_EOF));
    } else if rng.chance(50) {
        let value = random_value(rng);
        body.extend(encode_len(rng, value));
    }
    if rng.chance(20) {
        let n = 1 + rng.below(16);
        body.extend(rng.bytes(n));
    }
    body
}

/// 1 to 6 byte-level mutations of `input`'s body; 1 time in 100 the type byte becomes 6.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(6) {
        // The type byte is left alone: other types are Redis's own parsers, not the module's.
        let start = 1;
        let len = out.len();
        match rng.below(9) {
            0 if len > start => {
                let i = start + rng.below(len - start);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > start => {
                let i = start + rng.below(len - start);
                out[i] = rng.next() as u8;
            }
            2 if len > start => {
                let i = start + rng.below(len - start);
                out[i] = rng.pick(INTERESTING_BYTES);
            }
            3 => {
                let i = start.min(len) + rng.below(len.saturating_sub(start) + 1);
                let n = 1 + rng.below(8);
                let bytes = rng.bytes(n);
                out.splice(i..i, bytes);
            }
            4 if len > start => {
                let i = start + rng.below(len - start);
                let n = 1 + rng.below((len - i).min(9));
                out.drain(i..i + n);
            }
            5 => out.truncate(start.max(rng.below(len + 1))),
            6 => {
                let n = 1 + rng.below(12);
                let bytes = rng.bytes(n);
                out.extend(bytes);
            }
            7 if len > start => {
                // An interesting 64-bit value, big-endian as in the 0x81 length form.
                let i = start + rng.below(len - start);
                let value = rng.pick(INTERESTING).to_be_bytes();
                let end = (i + 8).min(len);
                out.splice(i..end, value[..end - i].iter().copied());
            }
            _ if len > start + 1 => {
                // Duplicate a chunk somewhere else.
                let a = start + rng.below(len - start);
                let n = 1 + rng.below((len - a).min(10));
                let chunk = out[a..a + n].to_vec();
                let at = start + rng.below(out.len() - start + 1);
                out.splice(at..at, chunk);
            }
            _ => {}
        }
    }
    if rng.chance(1) {
        if let Some(t) = out.first_mut() {
            *t = RDB_TYPE_MODULE_PRE_GA;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------

/// The type byte and body of a `DUMP` payload, and its RDB version.
fn split_dump(payload: &[u8]) -> (Vec<u8>, u16) {
    assert!(payload.len() > 10, "payload too short: {payload:02x?}");
    let (body, footer) = payload.split_at(payload.len() - 10);
    assert_eq!(
        crc64(&payload[..payload.len() - 8]),
        u64::from_le_bytes(footer[2..].try_into().expect("8 bytes")),
        "checksum of {payload:02x?}"
    );
    (body.to_vec(), u16::from_le_bytes([footer[0], footer[1]]))
}

fn set_state(con: &mut Connection, key: &str, full_at_ns: u64, full_at_frac: u64) {
    let ok: String = redis::cmd("RL.SETSTATE")
        .arg(key)
        .arg(full_at_ns)
        .arg(full_at_frac)
        .query(con)
        .expect("RL.SETSTATE");
    assert_eq!(ok, "OK");
}

fn artifacts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/artifacts/restore")
}

fn regressions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/restore")
}

/// Saves a failing input and fails the test with everything needed to reproduce it.
fn fail(server: &Server, input: &[u8], seed: u64, what: &str) -> ! {
    let dir = artifacts_dir();
    let path = dir.join(format!("crash-{:016x}", crc64(input)));
    let saved = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, input))
        .map_or_else(
            |e| format!("not saved: {e}"),
            |()| path.display().to_string(),
        );
    let log = server.log();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    panic!(
        "{what}\ninput (type byte and body) {input:02x?}\nsaved to {saved}\nseed {seed}\n\
         server log, last lines:\n{}",
        tail.join("\n")
    );
}

/// The text of a server error reply.
fn error_reply(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(e) => Some(match e.details() {
            Some(detail) => format!("{} {detail}", e.code()),
            None => e.code().to_string(),
        }),
        _ => None,
    }
}

struct Fuzzer {
    server: Server,
    con: Connection,
    rdb_version: u16,
    module_sign: u64,
    seed: u64,
    executions: u64,
    loaded: u64,
}

impl Fuzzer {
    /// Restores one input and checks everything; returns whether it loaded.
    fn run(&mut self, input: &[u8]) -> bool {
        self.executions += 1;
        let payload = seal(input, self.rdb_version);
        let replies: Vec<Value> = match redis::pipe()
            .ignore_errors()
            .cmd("RESTORE")
            .arg("k")
            .arg(0)
            .arg(&payload)
            .arg("REPLACE")
            .cmd("PING")
            .query(&mut self.con)
        {
            Ok(replies) => replies,
            Err(e) => fail(
                &self.server,
                input,
                self.seed,
                &format!("the server stopped answering: {e}"),
            ),
        };
        if replies.get(1) != Some(&Value::SimpleString("PONG".into())) {
            fail(
                &self.server,
                input,
                self.seed,
                &format!("no PONG after RESTORE: {replies:?}"),
            );
        }
        let expected = expected_state(&payload, self.module_sign);
        let loaded = match &replies[0] {
            Value::Okay => true,
            other => match error_reply(other) {
                Some(text) if text == BAD_DATA => false,
                _ => fail(
                    &self.server,
                    input,
                    self.seed,
                    &format!("RESTORE replied {other:?}, neither OK nor {BAD_DATA:?}"),
                ),
            },
        };
        match (loaded, expected) {
            (true, Some(state)) => self.check_loaded(input, state),
            (false, None) => {}
            (true, None) => fail(
                &self.server,
                input,
                self.seed,
                "RESTORE accepted a body the module must refuse",
            ),
            (false, Some(v)) => fail(
                &self.server,
                input,
                self.seed,
                &format!("RESTORE refused a valid body (full_at_ns, full_at_frac {v:?})"),
            ),
        }
        if loaded {
            self.loaded += 1;
        }
        loaded
    }

    /// A loaded bucket holds `(full_at_ns, full_at_frac)`, canonically in today's encoding
    /// version, and works.
    fn check_loaded(&mut self, input: &[u8], (full_at_ns, full_at_frac): (u64, u64)) {
        let mut canonical = vec![RDB_TYPE_MODULE_2];
        canonical.extend(rdb_len(self.module_sign << ENCVER_BITS | ENCVER_NOW));
        for value in [full_at_ns, full_at_frac] {
            canonical.push(OPCODE_UINT as u8);
            canonical.extend(rdb_len(value));
        }
        canonical.push(OPCODE_EOF as u8);
        let want = seal(&canonical, self.rdb_version);
        let replies: Vec<Value> = match redis::pipe()
            .ignore_errors()
            .cmd("DUMP")
            .arg("k")
            .cmd("TYPE")
            .arg("k")
            .cmd("DEBUG")
            .arg("DIGEST-VALUE")
            .arg("k")
            .cmd("RL.ACQUIRE")
            .arg("k")
            .arg(1)
            .arg(10)
            .arg(1)
            .query(&mut self.con)
        {
            Ok(replies) => replies,
            Err(e) => fail(
                &self.server,
                input,
                self.seed,
                &format!("the server stopped answering after a load: {e}"),
            ),
        };
        let ok = matches!(&replies[0], Value::BulkString(b) if *b == want)
            && replies[1] == Value::SimpleString("rl-bucket".into())
            && matches!(&replies[2], Value::Array(d) if d.len() == 1 && match &d[0] {
                Value::SimpleString(s) => s.len() == 40,
                Value::BulkString(s) => s.len() == 40,
                _ => false,
            })
            && matches!(&replies[3], Value::Array(r) if r.len() == 4
                && r.iter().all(|v| matches!(v, Value::Int(_))));
        if !ok {
            fail(
                &self.server,
                input,
                self.seed,
                &format!(
                    "loaded ({full_at_ns}, {full_at_frac}), then DUMP, TYPE, DEBUG \
                     DIGEST-VALUE, RL.ACQUIRE replied {replies:?}"
                ),
            );
        }
    }
}

/// Replays the checked-in failures, then the model's own cases.
fn fixed_inputs(fuzzer: &Fuzzer) -> Vec<(String, Vec<u8>, bool)> {
    let sign = fuzzer.module_sign;
    let body_of = |encver: u64, fields: &[&[u8]]| -> Vec<u8> {
        let mut out = vec![RDB_TYPE_MODULE_2];
        out.extend(rdb_len(sign << ENCVER_BITS | encver));
        for f in fields {
            out.extend_from_slice(f);
        }
        out
    };
    let v1 = |fields: &[&[u8]]| body_of(1, fields);
    let v2 = |fields: &[&[u8]]| body_of(ENCVER_NOW, fields);
    let pre_ga = |body: Vec<u8>| [&[RDB_TYPE_MODULE_PRE_GA][..], &body[1..]].concat();
    let big = rdb_len(1 << 40);
    let max = rdb_len(MAX_FULL_AT_NS);
    let past = rdb_len(MAX_FULL_AT_NS + 1);
    // The body cut short after its last opcode reads the rest from the footer, the RDB
    // version's two little-endian bytes (10, 0 on Redis 7.0: a value of 10, then EOF). Past
    // version 63 the first byte is a longer length form: the model alone decides.
    let from_footer = |body: Vec<u8>| {
        let valid = fuzzer.rdb_version < 64
            || expected_state(&seal(&body, fuzzer.rdb_version), sign).is_some();
        (body, valid)
    };
    let (v1_footer, v1_footer_valid) = from_footer(v1(&[&[2]]));
    let (v2_footer, v2_footer_valid) = from_footer(v2(&[&[2, 5, 2]]));
    let (pre_ga_footer, pre_ga_footer_valid) = from_footer(pre_ga(v2(&[&[5]])));
    let mut inputs: Vec<(String, Vec<u8>, bool)> = vec![
        // --- encoding version 1, as 0.1.0 wrote it
        ("v1 valid".into(), v1(&[&[2], &big, &[0]]), true),
        ("v1 state 1".into(), v1(&[&[2, 1, 0]]), true),
        ("v1 state 0".into(), v1(&[&[2, 0, 0]]), false),
        ("v1 value as 0xc5".into(), v1(&[&[2, 0xc5, 0]]), true),
        (
            "v1 opcode as 0x40 0x02".into(),
            v1(&[&[0x40, 2, 5, 0]]),
            true,
        ),
        (
            "v1 EOF as 0x81 + 8 zero bytes".into(),
            v1(&[&[2, 5, 0x81, 0, 0, 0, 0, 0, 0, 0, 0]]),
            true,
        ),
        (
            "v1 bytes after the EOF".into(),
            v1(&[&[2, 5, 0, 0xde, 0xad]]),
            true,
        ),
        ("v1 i64::MAX".into(), v1(&[&[2], &max, &[0]]), true),
        ("v1 i64::MAX + 1".into(), v1(&[&[2], &past, &[0]]), false),
        (
            "v1 unknown length prefix 0x82".into(),
            v1(&[&[2, 0x82, 0]]),
            false,
        ),
        (
            "v1 a second field (v2's layout)".into(),
            v1(&[&[2, 5, 2, 5, 0]]),
            false,
        ),
        ("v1 no EOF".into(), v1(&[&[2, 5]]), false),
        (
            "v1 value and EOF from the footer".into(),
            v1_footer,
            v1_footer_valid,
        ),
        ("v1 signed field".into(), v1(&[&[1, 5, 0]]), false),
        (
            "v1 pre-GA format: the value alone".into(),
            pre_ga(v1(&[&[5]])),
            true,
        ),
        (
            "v1 pre-GA format with an opcode".into(),
            pre_ga(v1(&[&[2, 0]])),
            true,
        ),
        (
            "v1 pre-GA format, state 0".into(),
            pre_ga(v1(&[&[0]])),
            false,
        ),
        // --- encoding version 2: full_at_ns, full_at_frac
        (
            "v2 valid, whole".into(),
            v2(&[&[2], &big, &[2, 0, 0]]),
            true,
        ),
        (
            "v2 valid, a fraction".into(),
            v2(&[&[2], &big, &[2, 7, 0]]),
            true,
        ),
        (
            "v2 the largest fraction".into(),
            v2(&[&[2], &big, &[2], &max, &[0]]),
            true,
        ),
        (
            "v2 the latest state".into(),
            v2(&[&[2], &max, &[2], &max, &[0]]),
            true,
        ),
        (
            "v2 state 0, fraction 1".into(),
            v2(&[&[2, 0, 2, 1, 0]]),
            false,
        ),
        (
            "v2 full_at_ns i64::MAX + 1".into(),
            v2(&[&[2], &past, &[2, 0, 0]]),
            false,
        ),
        (
            "v2 fraction 2^63".into(),
            v2(&[&[2, 5, 2], &past, &[0]]),
            false,
        ),
        (
            "v2 fraction u64::MAX".into(),
            v2(&[&[2, 5, 2], &rdb_len(u64::MAX), &[0]]),
            false,
        ),
        (
            "v2 only full_at_ns, then EOF".into(),
            v2(&[&[2, 5, 0]]),
            false,
        ),
        ("v2 only full_at_ns".into(), v2(&[&[2, 5]]), false),
        (
            "v2 fraction and EOF from the footer".into(),
            v2_footer,
            v2_footer_valid,
        ),
        (
            "v2 a third field".into(),
            v2(&[&[2, 5, 2, 5, 2, 5, 0]]),
            false,
        ),
        ("v2 no EOF".into(), v2(&[&[2, 5, 2, 5]]), false),
        ("v2 signed fraction".into(), v2(&[&[2, 5, 1, 5, 0]]), false),
        (
            "v2 fraction as 0xc7".into(),
            v2(&[&[2, 5, 2, 0xc7, 0]]),
            true,
        ),
        (
            "v2 bytes after the EOF".into(),
            v2(&[&[2, 5, 2, 5, 0, 0xbe, 0xef]]),
            true,
        ),
        (
            "v2 pre-GA format: two values".into(),
            pre_ga(v2(&[&[5, 7]])),
            true,
        ),
        (
            "v2 pre-GA format: the fraction from the footer".into(),
            pre_ga_footer,
            pre_ga_footer_valid,
        ),
        (
            "v2 pre-GA format, fraction 2^63".into(),
            pre_ga(v2(&[&[5], &past])),
            false,
        ),
        // --- other encoding versions
        (
            "encoding version 0".into(),
            body_of(0, &[&[2, 5, 2, 0, 0]]),
            false,
        ),
        (
            "encoding version 3".into(),
            body_of(3, &[&[2, 5, 2, 0, 0]]),
            false,
        ),
        (
            "encoding version 1023".into(),
            body_of(1023, &[&[2, 5, 0]]),
            false,
        ),
    ];
    if let Ok(entries) = std::fs::read_dir(regressions_dir()) {
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        for path in paths {
            if path.extension().is_some_and(|e| e == "md") {
                continue;
            }
            let bytes = std::fs::read(&path).expect("read a regression input");
            let valid = expected_state(&seal(&bytes, fuzzer.rdb_version), sign).is_some();
            inputs.push((path.display().to_string(), bytes, valid));
        }
    }
    inputs
}

#[test]
#[ignore = "a fuzzer: run by make fuzz and make fuzz-smoke (FUZZ_SECONDS, default 5)"]
fn fuzz_restore() {
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    let seconds: u64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .map(|s| s.parse().expect("FUZZ_SECONDS: a whole number of seconds"))
        .unwrap_or(5);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .map(|s| s.parse().expect("FUZZ_SEED: an unsigned integer"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });

    let server = Server::start();
    let mut con = server.conn();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .expect("INFO");
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("unknown")
        .trim()
        .to_string();

    // Seeds: real DUMP bodies, whose state lengths take each rdbSaveLen form but the shortest,
    // whole and with a fraction of a nanosecond.
    let mut seeds = Vec::new();
    let mut rdb_version = 0;
    let states = [
        (4_102_444_800_000_000_123, 0),
        (4_102_444_800_000_000_123, 3_074_457_345_618_258_603),
        (MAX_FULL_AT_NS, 0),
        (MAX_FULL_AT_NS, MAX_FULL_AT_FRAC),
        (MAX_FULL_AT_NS - 1, 1),
        (4_102_444_800_000_000_000, 40),
        (4_102_444_800_000_000_000, 20_000),
    ];
    for (i, &(full_at_ns, full_at_frac)) in states.iter().enumerate() {
        let key = format!("seed{i}");
        set_state(&mut con, &key, full_at_ns, full_at_frac);
        let payload = dump(&mut con, key.as_bytes()).expect("a seed bucket");
        assert_eq!(
            crc64(&payload[..payload.len() - 8]),
            crc64_bitwise(&payload[..payload.len() - 8])
        );
        let (body, version) = split_dump(&payload);
        rdb_version = version;
        seeds.push(body);
    }
    let acquired: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("seed-acquired")
        .arg(0.001)
        .arg(10)
        .arg(3)
        .query(&mut con)
        .expect("RL.ACQUIRE");
    assert_eq!(acquired[0], 1);
    seeds.push(split_dump(&dump(&mut con, b"seed-acquired").expect("a bucket")).0);
    // At 3 tokens/s, 1000 tokens are 1e12/3 ns: a state with a fraction.
    let acquired: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg("seed-third")
        .arg(3)
        .arg(3000)
        .arg(1000)
        .query(&mut con)
        .expect("RL.ACQUIRE");
    assert_eq!(acquired[0], 1);
    seeds.push(split_dump(&dump(&mut con, b"seed-third").expect("a bucket")).0);
    let (module_id, _) = read_len(&seeds[0][1..]).expect("a module id");
    let module_sign = module_id >> ENCVER_BITS;
    let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");

    let mut fuzzer = Fuzzer {
        server,
        con,
        rdb_version,
        module_sign,
        seed,
        executions: 0,
        loaded: 0,
    };
    let started = Instant::now();
    for (what, input, valid) in fixed_inputs(&fuzzer) {
        assert_eq!(
            expected_state(&seal(&input, rdb_version), module_sign).is_some(),
            valid,
            "model: {what}"
        );
        assert_eq!(fuzzer.run(&input), valid, "{what}");
    }
    for seed_body in &seeds {
        assert!(fuzzer.run(seed_body), "a real DUMP body loads");
    }

    // Bodies that loaded, to mutate around: capped, replaced at random once full.
    let mut pool: Vec<Vec<u8>> = seeds.clone();
    let mut rng = Rng(seed);
    let deadline = started + Duration::from_secs(seconds);
    let mut last_report = started;
    while Instant::now() < deadline {
        for _ in 0..64 {
            let input = match rng.below(10) {
                0..=3 => structured(&mut rng, module_sign),
                4..=6 => {
                    let from = if rng.chance(50) { &seeds } else { &pool };
                    let i = rng.below(from.len());
                    mutate(&mut rng, &from[i])
                }
                _ => {
                    let base = structured(&mut rng, module_sign);
                    mutate(&mut rng, &base)
                }
            };
            if fuzzer.run(&input) {
                if pool.len() < 256 {
                    pool.push(input);
                } else {
                    let i = rng.below(pool.len());
                    pool[i] = input;
                }
            }
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            last_report = Instant::now();
            eprintln!(
                "#{} loaded {} in {:.0} s",
                fuzzer.executions,
                fuzzer.loaded,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let elapsed = started.elapsed().as_secs_f64();

    assert!(fuzzer.server.is_alive(), "server stopped answering PING");
    let log = fuzzer.server.log();
    for marker in CRASH_MARKERS {
        assert!(!log.contains(marker), "the server log contains {marker:?}");
    }
    println!(
        "fuzz_restore: {} executions in {elapsed:.0} s ({:.0}/s), {} loaded, {} refused, \
         no failure; seed {seed}, redis {version}, rdb version {rdb_version}",
        fuzzer.executions,
        fuzzer.executions as f64 / elapsed,
        fuzzer.loaded,
        fuzzer.executions - fuzzer.loaded,
    );
}
