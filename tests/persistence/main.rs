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
//!
//! # Layout
//!
//! - `format.rs`: the `DUMP` format, taken apart and built by hand, and the check that it
//!   reproduces the server's payloads.
//! - `buckets.rs`: the buckets every path is tested with, and the snapshot that must survive.
//! - `rdb.rs`: `DEBUG RELOAD`, `SAVE` and restart.
//! - `aof.rs`: AOF replay with and without the RDB preamble, and AOF rewrite; what the files
//!   hold.
//! - `restore.rs`: `DUMP`/`RESTORE` and `COPY`, and the corrupt payloads `RESTORE` refuses.
//! - `memory.rs`: `MEMORY USAGE` of whole and fractional states through every copy.
//! - `fixtures.rs`: what 0.1.0 wrote (the checked-in `DUMP`, RDB and AOF fixtures in
//!   `tests/fixtures/`) still loads as the same buckets.

#![cfg(test)]

mod aof;
mod buckets;
#[path = "../common/mod.rs"]
mod common;
mod fixtures;
mod format;
mod memory;
mod rdb;
mod restore;
