//! What the server's error replies mean to a limiter: Redis cannot decide now (down, busy,
//! read-only …), a path is not there (unknown command, no function, no cached script), this
//! user may not run a command (NOPERM), or Redis is misconfigured for this client (a wrong
//! password, a cluster client on a standalone server or the reverse). Each misconfiguration
//! comes with a text naming its cause and its fix.
//!
//! Nothing here does I/O; the ACL rules named in the texts are those of
//! `clients/vectors/permissions.json` (a test holds them equal).

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Where the ACL rules of each path are listed.
pub(crate) const PERMISSIONS_DOC: &str = "docs/clients.md#permissions";

/// The module path's rules for decisions.
pub(crate) const MODULE_RULES: &str = "+rl.acquire +rl.peek +rl.refund +rl.charge \
     +rl.acquire.multi +rl.hacquire +rl.hpeek +rl.hrefund +rl.hcharge";
/// The Functions path's own commands.
pub(crate) const FUNCTIONS_RULES: &str = "+fcall +fcall_ro";
/// The script path's own commands.
pub(crate) const SCRIPT_RULES: &str = "+evalsha +eval";
/// What the Functions library and the script run inside the server, on either path.
pub(crate) const DATA_RULES: &str = "+time +get +set +hmget +hset +pexpireat +del";

/// What a cluster client says when a seed node answered but gave it no slots.
pub(crate) const NO_SLOTS: &str = "a reachable node gave the cluster client no slots";

/// Connection errors, timeouts, and the replies of a server that cannot take writes now:
/// OOM, READONLY, LOADING, and a cluster that is down, has no master or asks to try again.
pub(crate) fn is_unavailable(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    if matches!(
        e.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::TryAgain
            )
    ) {
        return true;
    }
    matches!(
        e.code(),
        Some("OOM" | "READONLY" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN")
    )
}

/// `ERR unknown command 'RL.ACQUIRE'`: the module (or FCALL, before Redis 7.0) is not there.
pub(crate) fn is_unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.to_string().to_lowercase().contains("unknown command")
}

/// `WRONGTYPE`, the server's own or the one a function or a script stops with (Redis 7.0 keeps
/// the code, `WRONGTYPE … script: rl_acquire, on @user_function:94.`; other servers may wrap
/// it, `ERR Error running script …: WRONGTYPE …`): the word anywhere in the text, whole.
pub(crate) fn is_wrongtype(e: &RedisError) -> bool {
    const WORD: &str = "WRONGTYPE";
    if e.code() == Some(WORD) {
        return true;
    }
    let text = e.to_string();
    let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(WORD).any(|(at, _)| {
        let before = text.get(..at).and_then(|head| head.chars().next_back());
        let after = text
            .get(at..)
            .and_then(|tail| tail.strip_prefix(WORD))
            .and_then(|tail| tail.chars().next());
        !before.is_some_and(word_char) && !after.is_some_and(word_char)
    })
}

/// `NOSCRIPT`: the server has not cached the script (never sent, or SCRIPT FLUSH).
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) || e.code() == Some("NOSCRIPT")
}

/// `ERR Function not found`: no Functions library with that function.
pub(crate) fn is_function_not_found(e: &RedisError) -> bool {
    e.to_string().to_lowercase().contains("function not found")
}

/// Whether `e` refuses the command `sent` itself to this user (NOPERM naming it, or naming
/// none), as opposed to a command a script or function runs inside the server.
pub(crate) fn is_denied(e: &RedisError, sent: &str) -> bool {
    if e.code() != Some("NOPERM") && e.kind() != ErrorKind::Server(ServerErrorKind::NoPerm) {
        return false;
    }
    let text = e.to_string();
    !text.contains("script") && named(&text).is_none_or(|name| name.eq_ignore_ascii_case(sent))
}

/// The first `'quoted'` name of an error text: the command NOPERM refers to.
fn named(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once('\'')?;
    let (name, _) = rest.split_once('\'')?;
    Some(name)
}

/// The cause, if `e` means Redis is misconfigured for this client rather than down or busy:
/// authentication refused, a cluster client on a standalone server, a single-node client on
/// a cluster (`MOVED`, `ASK`, and `CROSSSLOT` unless `cluster_client`: a cluster client's
/// CROSSSLOT is the caller's keys spanning slots), or NOPERM for a command run inside the
/// script or function (the user lacks `time`, `hset` …).
pub(crate) fn misconfiguration(e: &RedisError, cluster_client: bool) -> Option<String> {
    let text = e.to_string();
    let lower = text.to_lowercase();
    let code = e.code();
    if e.kind() == ErrorKind::AuthenticationFailed
        || matches!(code, Some("WRONGPASS" | "NOAUTH"))
        || lower.contains("invalid username-password pair")
        || lower.contains("invalid password")
        || lower.contains("authentication required")
    {
        return Some(format!(
            "authentication failed ({text}): check the username and password the client \
             connects with"
        ));
    }
    if lower.contains("cluster support disabled") || text.contains(NO_SLOTS) {
        return Some(format!(
            "a cluster client on a standalone server ({text}): connect with a redis::Client, \
             not a ClusterClient"
        ));
    }
    let moved = matches!(code, Some("MOVED" | "ASK"))
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
        );
    let crossslot =
        e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) || code == Some("CROSSSLOT");
    if moved || (crossslot && !cluster_client) {
        return Some(format!(
            "a single-node client on a Redis Cluster ({text}): connect with a \
             redis::cluster::ClusterClient"
        ));
    }
    let inside =
        lower.contains("can't run this command") || lower.contains("no permissions to run");
    if code == Some("NOPERM") || inside {
        let rule = match named(&text) {
            Some(name) => format!("may not run '{name}' ({text}); add the ACL rule \"+{name}\""),
            None => format!(
                "may not run a command the script needs ({text}); add the ACL rules \"{DATA_RULES}\""
            ),
        };
        return Some(format!("NOPERM: this user {rule} or see {PERMISSIONS_DOC}"));
    }
    None
}

/// The text of "no path works": the commands this user may not run, in the order tried.
pub(crate) fn no_permission(denied: &[&str]) -> String {
    let (first, rest) = match denied.split_first() {
        Some((first, rest)) => (*first, rest),
        None => ("eval", &[][..]),
    };
    let nor = if rest.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = rest.iter().map(|n| format!("'{n}'")).collect();
        format!(" (nor {})", names.join(", "))
    };
    let rules = if first.starts_with("rl.") {
        format!("\"{MODULE_RULES}\"")
    } else {
        format!(
            "\"{SCRIPT_RULES} {DATA_RULES}\" (or \"{FUNCTIONS_RULES} {DATA_RULES}\" with the \
             Functions library loaded)"
        )
    };
    format!("NOPERM: this user may not run '{first}'{nor}; add the ACL rules {rules} or see {PERMISSIONS_DOC}")
}

/// The text of "the script is not cached and EVAL is refused".
pub(crate) fn not_loaded() -> String {
    format!(
        "NOPERM: the server has not cached the script and this user may not run 'eval'; add \
         the ACL rule \"+eval\", or have an admin load the Functions library \
         (redis_rl_client::load_functions) or the script (SCRIPT LOAD), or see {PERMISSIONS_DOC}"
    )
}

/// The text of "no module" under `WithoutModule::Refuse`.
pub(crate) fn module_missing() -> String {
    "the server has no RL.ACQUIRE (the redis-rl module is not loaded) and this limiter was \
     built with WithoutModule::Refuse; load the module or use WithoutModule::Lua"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(resp: &str) -> RedisError {
        match redis::parse_redis_value(resp.as_bytes())
            .unwrap()
            .extract_error()
        {
            Err(e) => e,
            Ok(v) => panic!("not an error: {v:?}"),
        }
    }

    /// The rules named in the texts are the shared ones (clients/vectors/permissions.json).
    #[test]
    fn the_rules_are_the_shared_ones() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/permissions.json");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let rules = |path: &str| -> Vec<String> {
            doc["paths"][path]["decide"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap().to_string())
                .collect()
        };
        let words = |text: &str| -> Vec<String> { text.split(' ').map(String::from).collect() };
        assert_eq!(rules("module"), words(MODULE_RULES));
        assert_eq!(
            rules("functions"),
            words(&format!("{FUNCTIONS_RULES} {DATA_RULES}"))
        );
        assert_eq!(
            rules("script"),
            words(&format!("{SCRIPT_RULES} {DATA_RULES}"))
        );
    }

    #[test]
    fn noperm_on_the_command_sent_is_told_from_noperm_inside_a_script() {
        let outer = error("-NOPERM this user has no permissions to run the 'evalsha' command\r\n");
        assert!(is_denied(&outer, "EVALSHA"));
        assert!(!is_denied(&outer, "EVAL"));
        // Valkey and Redis 7.2+ name the command run inside; Redis 7.0 names none.
        let inside = error(
            "-NOPERM User app has no permissions to run the 'time' command script: rl_acquire\r\n",
        );
        assert!(!is_denied(&inside, "FCALL"));
        let cause = misconfiguration(&inside, false).unwrap();
        assert!(
            cause.contains("'time'") && cause.contains("\"+time\""),
            "{cause}"
        );
        let old = error(
            "-ERR The user executing the script can't run this command or subcommand script: \
             rl_acquire, on @user_function:125.\r\n",
        );
        assert!(!is_denied(&old, "FCALL"));
        assert!(misconfiguration(&old, false).is_some_and(|c| c.contains(DATA_RULES)));
    }

    #[test]
    fn wrongtype_is_found_as_a_whole_word_anywhere_in_the_text() {
        for (resp, wrongtype) in [
            (
                "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
                true,
            ),
            (
                "-WRONGTYPE Operation against a key holding the wrong kind of value script: \
                 rl_acquire, on @user_function:94.\r\n",
                true,
            ),
            (
                "-ERR Error running script (call to f_0123): @user_script:94: WRONGTYPE \
                 Operation against a key holding the wrong kind of value\r\n",
                true,
            ),
            ("-ERR user_script:1: WRONGTYPE: no such key\r\n", true),
            ("-ERR NOTWRONGTYPE here\r\n", false),
            ("-ERR WRONGTYPES\r\n", false),
            ("-ERR wrongtype in lower case\r\n", false),
            ("-NOSCRIPT No matching script.\r\n", false),
        ] {
            assert_eq!(is_wrongtype(&error(resp)), wrongtype, "{resp}");
        }
    }

    #[test]
    fn misconfigurations_name_their_cause() {
        for (resp, cluster_client, cause) in [
            (
                "-WRONGPASS invalid username-password pair or user is disabled.\r\n",
                false,
                Some("authentication"),
            ),
            (
                "-NOAUTH Authentication required.\r\n",
                true,
                Some("authentication"),
            ),
            (
                "-ERR This instance has cluster support disabled\r\n",
                true,
                Some("a cluster client on a standalone server"),
            ),
            (
                "-MOVED 3999 127.0.0.1:6381\r\n",
                false,
                Some("single-node client"),
            ),
            (
                "-CROSSSLOT Keys in request don't hash to the same slot\r\n",
                false,
                Some("single-node client"),
            ),
            // A cluster client's CROSSSLOT is the caller's keys spanning slots.
            (
                "-CROSSSLOT Keys in request don't hash to the same slot\r\n",
                true,
                None,
            ),
            (
                "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
                false,
                None,
            ),
            (
                "-READONLY You can't write against a read only replica.\r\n",
                false,
                None,
            ),
        ] {
            let got = misconfiguration(&error(resp), cluster_client);
            match cause {
                Some(cause) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(cause)),
                    "{resp}: {got:?}"
                ),
                None => assert!(got.is_none(), "{resp}: {got:?}"),
            }
        }
    }

    #[test]
    fn no_permission_names_each_command_and_the_rules() {
        assert_eq!(
            no_permission(&["fcall_ro", "evalsha", "eval"]),
            "NOPERM: this user may not run 'fcall_ro' (nor 'evalsha', 'eval'); add the ACL rules \
             \"+evalsha +eval +time +get +set +hmget +hset +pexpireat +del\" (or \"+fcall +fcall_ro \
             +time +get +set +hmget +hset +pexpireat +del\" with the Functions library loaded) or see \
             docs/clients.md#permissions"
        );
        assert!(no_permission(&["rl.acquire", "evalsha", "eval"]).contains(MODULE_RULES));
    }
}
