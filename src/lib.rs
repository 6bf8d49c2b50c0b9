//! redis-rl: native rate-limit commands for Redis and Valkey.
pub mod bucket;
