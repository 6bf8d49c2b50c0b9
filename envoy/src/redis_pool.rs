//! The connection the single-server limiter sends on: `REDIS_POOL_SIZE` multiplexed
//! `ConnectionManager`s (each pipelines every call in flight and reconnects by itself),
//! one picked per call in turn. Also the cluster hash slot of a key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A round-robin handle on a set of multiplexed connections. The limiter clones its
/// connection once per call, and each clone takes the next one.
pub struct Pool {
    current: ConnectionManager,
    all: Arc<Vec<ConnectionManager>>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    /// A pool of `connections` (at least one).
    pub fn new(connections: Vec<ConnectionManager>) -> Option<Pool> {
        let current = connections.first()?.clone();
        Some(Pool {
            current,
            all: Arc::new(connections),
            next: Arc::new(AtomicUsize::new(1)),
        })
    }
}

impl Clone for Pool {
    fn clone(&self) -> Self {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let current = self
            .all
            .get(n % self.all.len().max(1))
            .unwrap_or(&self.current)
            .clone();
        Pool {
            current,
            all: self.all.clone(),
            next: self.next.clone(),
        }
    }
}

impl ConnectionLike for Pool {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.current.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.current.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.current.get_db()
    }
}

/// The cluster hash slot of `key` (CRC16/XMODEM mod 16384 of the key, or of its first
/// non-empty `{hash tag}`).
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = key.get(open + 1..)?;
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| rest.get(..close)).flatten()
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_match_redis() {
        // CLUSTER KEYSLOT foo is 12182 (the cluster spec's example).
        assert_eq!(slot(b"foo"), 12182);
        // CRC16/XMODEM's check value, below 16384 already.
        assert_eq!(slot(b"123456789"), 0x31C3);
        // A hash tag hashes its content only.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty first tag means the whole key is hashed, not "bar".
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
    }
}
