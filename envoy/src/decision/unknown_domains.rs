//! A warning, once per domain, when a call names a domain the config does not define: such a
//! call answers `OK` for every descriptor, as envoyproxy/ratelimit does, so a typo in Envoy's
//! `domain` or rules mounted in the wrong place would otherwise limit nothing in silence.
//!
//! The domain comes from the caller, so what is remembered is bounded: at most
//! [`MAX_REMEMBERED`] domains, each kept as its first [`MAX_NAME_BYTES`] bytes. Past the
//! bound one last warning says that further unknown domains are not logged. A new config
//! clears the memory, so a domain that a reload removes is warned about again.

use std::collections::HashSet;
use std::sync::Mutex;

/// How many unknown domains are remembered (and warned about) between two configs.
pub const MAX_REMEMBERED: usize = 1000;
/// How much of an unknown domain's name is remembered and logged.
pub const MAX_NAME_BYTES: usize = 256;

#[derive(Default)]
pub struct UnknownDomains {
    seen: Mutex<HashSet<Vec<u8>>>,
}

impl UnknownDomains {
    /// Notes a call for `domain`, which the config does not define; warns the first time.
    pub fn note(&self, domain: &str) {
        let bytes = domain.as_bytes();
        let kept = bytes.get(..MAX_NAME_BYTES).unwrap_or(bytes);
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if seen.contains(kept) {
            return;
        }
        match seen.len() {
            n if n < MAX_REMEMBERED => {
                seen.insert(kept.to_vec());
                let shown = String::from_utf8_lossy(kept);
                let more = if kept.len() < bytes.len() {
                    format!(" (first {MAX_NAME_BYTES} of {} bytes)", bytes.len())
                } else {
                    String::new()
                };
                tracing::warn!(
                    "domain {shown:?}{more} is not in the config: its calls answer OK and limit nothing (logged once per domain)"
                );
            }
            n if n == MAX_REMEMBERED => {
                // A marker no domain can equal (it is longer than what is kept), so the
                // bound is announced once.
                seen.insert(vec![0; MAX_NAME_BYTES.saturating_add(1)]);
                tracing::warn!(
                    "{MAX_REMEMBERED} unknown domains were logged since the config loaded; further ones are not"
                );
            }
            _ => {}
        }
    }

    /// Forgets every domain (a new config is in force).
    pub fn clear(&self) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.clear();
        }
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_bounded_in_count_and_length() {
        let u = UnknownDomains::default();
        for i in 0..MAX_REMEMBERED * 2 {
            u.note(&format!("d{i}"));
        }
        // The domains, and the marker that the bound was announced.
        assert_eq!(u.remembered(), MAX_REMEMBERED + 1);
        let u = UnknownDomains::default();
        let long = "x".repeat(MAX_NAME_BYTES * 4);
        u.note(&long);
        u.note(&long);
        assert_eq!(u.remembered(), 1);
        assert!(u
            .seen
            .lock()
            .map(|s| s.iter().all(|d| d.len() <= MAX_NAME_BYTES))
            .unwrap_or(false));
        u.clear();
        assert_eq!(u.remembered(), 0);
    }
}
