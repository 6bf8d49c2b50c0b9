//! The RDB/`DUMP` format pieces the persistence tests and the RESTORE fuzzer both build
//! payloads with: Redis's CRC-64 and `rdbSaveLen`, and what a crashed server writes to its log.

/// What the server log must never contain.
pub const CRASH_MARKERS: &[&str] = &[
    "crashed by signal",
    "Guru Meditation",
    "ASSERTION FAILED",
    "STACK TRACE",
    "caught a panic",
];

/// CRC-64/Jones as in Redis's `crc64.c`: polynomial 0xad93d23594c935a9, reflected in and
/// out, initial value 0, no final xor. Table-driven: the fuzzer checksums every input.
pub fn crc64(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0xad93_d235_94c9_35a9_u64.reverse_bits();
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u64; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut crc = i as u64;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLY_REFLECTED
                } else {
                    crc >> 1
                };
            }
            *slot = crc;
        }
        table
    });
    data.iter().fold(0u64, |crc, &byte| {
        table[((crc ^ u64::from(byte)) & 0xff) as usize] ^ (crc >> 8)
    })
}

/// The bitwise textbook form, to check the table against.
pub fn crc64_bitwise(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0xad93_d235_94c9_35a9_u64.reverse_bits();
    let mut crc = 0u64;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// `rdbSaveLen`: the canonical 6-bit, 14-bit, 32-bit or 64-bit big-endian form.
pub fn rdb_len(value: u64) -> Vec<u8> {
    if value < 1 << 6 {
        vec![value as u8]
    } else if value < 1 << 14 {
        vec![0x40 | (value >> 8) as u8, value as u8]
    } else if value <= u64::from(u32::MAX) {
        let mut out = vec![0x80];
        out.extend_from_slice(&(value as u32).to_be_bytes());
        out
    } else {
        let mut out = vec![0x81];
        out.extend_from_slice(&value.to_be_bytes());
        out
    }
}
