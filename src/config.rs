//! Module load arguments (`loadmodule /path/libredis_rl.so name value ...`), validated at
//! load: anything unknown or malformed fails the load with a log line naming it, rather than
//! leaving the operator believing a setting is active.

use std::sync::atomic::{AtomicBool, Ordering};

static CL_THROTTLE_ALIAS: AtomicBool = AtomicBool::new(false);
static GCRA_ALIAS: AtomicBool = AtomicBool::new(false);

/// Every load argument, as the log names them when one is unknown.
const KNOWN: &str = "cl-throttle-alias yes|no, gcra-alias yes|no";

/// Whether `CL.THROTTLE` is registered as an alias of `RL.THROTTLE`.
pub fn cl_throttle_alias() -> bool {
    CL_THROTTLE_ALIAS.load(Ordering::Relaxed)
}

/// Whether `GCRA` is registered as an alias of `RL.GCRA`.
pub fn gcra_alias() -> bool {
    GCRA_ALIAS.load(Ordering::Relaxed)
}

/// Applies `name value` pairs.
///
/// # Errors
/// A message for the log: an unknown name, a missing value, or a value out of range.
pub fn apply(args: &[String]) -> Result<(), String> {
    for pair in args.chunks(2) {
        let [name, rest @ ..] = pair else {
            continue;
        };
        // Name first, so a stray word is reported as unknown rather than as lacking a value.
        let setting = match name.to_ascii_lowercase().as_str() {
            "cl-throttle-alias" => &CL_THROTTLE_ALIAS,
            "gcra-alias" => &GCRA_ALIAS,
            _ => return Err(format!("unknown module argument '{name}' (known: {KNOWN})")),
        };
        let value = rest
            .first()
            .ok_or_else(|| format!("module argument '{name}' needs a value (yes or no)"))?;
        setting.store(yes_no(name, value)?, Ordering::Relaxed);
    }
    Ok(())
}

fn yes_no(name: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!(
            "module argument '{name}' must be yes or no, not '{value}'"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn load_arguments_are_validated() {
        assert!(apply(&strings(&[])).is_ok());
        assert!(apply(&strings(&["cl-throttle-alias", "no"])).is_ok());
        assert!(!cl_throttle_alias());
        assert!(apply(&strings(&["CL-THROTTLE-ALIAS", "YES"])).is_ok());
        assert!(cl_throttle_alias());
        CL_THROTTLE_ALIAS.store(false, Ordering::Relaxed);
        assert!(apply(&strings(&["gcra-alias", "yes", "cl-throttle-alias", "no"])).is_ok());
        assert!(gcra_alias() && !cl_throttle_alias());
        GCRA_ALIAS.store(false, Ordering::Relaxed);
        for bad in [
            &["cl-throttle-alias"][..],
            &["cl-throttle-alias", "maybe"],
            &["gcra-alias"],
            &["gcra-alias", "1"],
            &["colour", "blue"],
        ] {
            let err = apply(&strings(bad)).unwrap_err();
            assert!(err.contains(bad[0]), "{err}");
        }
        let err = apply(&strings(&["cl-throttle-alias", "no", "extra"])).unwrap_err();
        assert!(err.starts_with("unknown module argument 'extra'"), "{err}");
    }
}
