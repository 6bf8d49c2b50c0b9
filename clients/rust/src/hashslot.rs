//! The cluster hash slot of a key: CRC16/XMODEM of the key (or of its hash tag) mod 16384,
//! as the Redis Cluster specification computes it. Pure, and a leaf: the engine's probe keys
//! and `slots`' grouping both ask it.

/// The cluster hash slot of `key`: CRC16/XMODEM mod 16384 of the key, or of its first
/// non-empty `{hash tag}` (the Redis Cluster specification).
///
/// ```
/// use redis_rl_client::key_slot;
///
/// assert_eq!(key_slot(b"foo"), 12182);
/// assert_eq!(key_slot(b"{user:42}:s"), key_slot(b"user:42"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = key.get(open.saturating_add(1)..)?;
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
    use super::*;

    #[test]
    fn key_slots_follow_the_cluster_specification() {
        // The specification's example, and a hash tag's slot is its content's.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"{a}x"), key_slot(b"a"));
        // An empty first tag means the whole key is hashed, not "bar".
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo"), 12182);
    }
}
