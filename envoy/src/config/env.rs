//! How every part reads the environment: Go durations and envconfig's flags, the two forms
//! the Go service's variables share. A leaf: imports nothing of the crate.

/// A Go `time.ParseDuration` text (`250ms`, `10s`, `1m30s`, `1.5s`; `0`) in whole ms, rounded
/// up so a sub-ms deadline is not 0; `None` for anything else, a sign included.
pub(crate) fn go_duration_ms(text: &str) -> Option<u64> {
    let mut rest = text.trim();
    rest = rest.strip_prefix('+').unwrap_or(rest);
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    // Units longest first, so `ms` is not read as `m` and a stray `s`.
    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("μs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
    ];
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let (unit, unit_ns) = UNITS
            .iter()
            .find(|(unit, _)| after.starts_with(unit))
            .copied()?;
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut part_ns = whole.checked_mul(unit_ns)?;
        if !fraction.is_empty() {
            // Go keeps the fraction's leading digits; 18 hold any unit's ns.
            let kept = fraction.get(..fraction.len().min(18))?;
            let scale = 10u128.checked_pow(u32::try_from(kept.len()).ok()?)?;
            let fraction: u128 = kept.parse().ok()?;
            part_ns = part_ns.checked_add(fraction.checked_mul(unit_ns)? / scale)?;
        }
        total_ns = total_ns.checked_add(part_ns)?;
        rest = after.get(unit.len()..)?;
    }
    u64::try_from(total_ns.div_ceil(1_000_000)).ok()
}

/// A true/false variable as the Go service's envconfig reads it (Go's `ParseBool`, plus `yes`
/// and `no`); unset is `default`, and anything else an error naming the variable. Every
/// part's settings read their flags through this one.
///
/// # Errors
/// The variable and what it must be.
pub(crate) fn env_flag(
    var: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: bool,
) -> Result<bool, String> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "t" | "yes" => Ok(true),
            "false" | "0" | "f" | "no" | "" => Ok(false),
            _ => Err(format!("{name} must be true or false, not {v:?}")),
        },
    }
}
