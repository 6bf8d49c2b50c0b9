//! The cleaning of stat names the peer does (its `SanitizeStatName`), shared by the
//! Prometheus labels and the statsd names. A leaf: imports nothing of the crate.

use std::borrow::Cow;

/// The peer's `SanitizeStatName`: `:` and `|` become `_`, and the dots inside anything
/// shaped like an IPv4 address (`\d{1,3}(\.\d{1,3}){3}`, leftmost first, as Go's regexp
/// finds them) become `_` too, so `10.1.2.3` stays one level of the stats key. A control
/// character (NUL, a newline, DEL …), which would end a statsd line or reach a Prometheus
/// label raw, is written as `\xNN` (its code in hex) first.
pub fn sanitize_stat_name(name: &str) -> Cow<'_, str> {
    if name.chars().any(char::is_control) {
        let mut escaped = String::with_capacity(name.len().saturating_add(8));
        for c in name.chars() {
            if c.is_control() {
                escaped.push_str(&format!("\\x{:02x}", u32::from(c)));
            } else {
                escaped.push(c);
            }
        }
        return Cow::Owned(sanitize_stat_name(&escaped).into_owned());
    }
    let raw = name.as_bytes();
    let clean = !raw.iter().any(|b| matches!(b, b':' | b'|'))
        && (0..raw.len()).all(|start| ipv4_at(raw, start).is_none());
    if clean {
        return Cow::Borrowed(name);
    }
    let bytes = name.replace([':', '|'], "_").into_bytes();
    let mut out = bytes.clone();
    let mut start = 0usize;
    while start < bytes.len() {
        match ipv4_at(&bytes, start) {
            Some(end) => {
                for i in start..end {
                    if let Some(b) = out.get_mut(i) {
                        if *b == b'.' {
                            *b = b'_';
                        }
                    }
                }
                start = end.max(start.saturating_add(1));
            }
            None => start = start.saturating_add(1),
        }
    }
    // Only ASCII dots were replaced by ASCII underscores: still UTF-8.
    Cow::Owned(
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

/// The end of the leftmost-first match of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` at `start`:
/// each group takes as many digits as it can, and gives some back when the next dot is
/// not where it needs to be (the backtracking of Go's leftmost-first semantics).
fn ipv4_at(bytes: &[u8], start: usize) -> Option<usize> {
    fn group(bytes: &[u8], at: usize, left: u32) -> Option<usize> {
        let digits = bytes
            .get(at..)?
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        for n in (1..=digits).rev() {
            let end = at.checked_add(n)?;
            if left == 0 {
                return Some(end);
            }
            if bytes.get(end) == Some(&b'.') {
                if let Some(found) = group(bytes, end.checked_add(1)?, left - 1) {
                    return Some(found);
                }
            }
        }
        None
    }
    group(bytes, start, 3)
}
