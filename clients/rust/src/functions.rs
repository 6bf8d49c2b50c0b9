//! Loading the Functions library `redis_rl` (an admin's step): [`load_functions`] and
//! [`load_functions_async`] send `FUNCTION LOAD REPLACE` with the shipped library. On a
//! cluster connection the redis crate sends it to every master (it routes FUNCTION LOAD to
//! all primaries and fails if one fails), so one call covers a cluster too.
//!
//! The limiters never call these: they only use a library that is there.

use redis::Value;

use crate::diagnose::PERMISSIONS_DOC;
use crate::script::{FUNCTIONS, FUNCTIONS_VERSION};
use crate::types::Error;

/// The library's name, as `#!lua name=redis_rl` declares it and FUNCTION LOAD replies.
const LIBRARY: &str = "redis_rl";

fn load_command() -> redis::Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(FUNCTIONS);
    cmd
}

/// FUNCTION LOAD's reply (the library's name; a cluster connection may give one per master)
/// as the version loaded, or the error.
fn loaded(reply: redis::RedisResult<Value>) -> Result<i64, Error> {
    let value = reply.map_err(|e| {
        if e.code() == Some("NOPERM") {
            Error::Misconfigured(format!(
                "NOPERM: this user may not load the Functions library ({e}); add the ACL rules \
                 \"+function|load +function|list\" or see {PERMISSIONS_DOC}"
            ))
        } else {
            Error::Redis(e)
        }
    })?;
    let names: Vec<String> = match &value {
        Value::Array(items) => items
            .iter()
            .map(redis::from_redis_value_ref)
            .collect::<Result<_, _>>()
            .map_err(|e| Error::Reply(format!("FUNCTION LOAD: {e}")))?,
        single => vec![redis::from_redis_value_ref(single)
            .map_err(|e| Error::Reply(format!("FUNCTION LOAD: {e}")))?],
    };
    if names.is_empty() || names.iter().any(|name| name != LIBRARY) {
        return Err(Error::Reply(format!("FUNCTION LOAD: {value:?}")));
    }
    Ok(FUNCTIONS_VERSION)
}

/// Loads (or replaces) the Functions library `redis_rl` on the server `connection` reaches,
/// or on every master of a cluster through a `redis::cluster::ClusterConnection`, and returns
/// the version loaded ([`crate::FUNCTIONS_VERSION`]). Limiters then use it (FCALL) instead of
/// the script. Run it as an admin; it needs `+function|load` (and `+function|list` to look).
///
/// ```no_run
/// let client = redis::Client::open("redis://admin:secret@127.0.0.1/")?;
/// let version = redis_rl_client::load_functions(&mut client.get_connection()?)?;
/// assert_eq!(version, redis_rl_client::FUNCTIONS_VERSION);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`Error::Misconfigured`] when the user may not load it (the rules to add);
/// [`Error::Redis`] for another error (a server before 7.0 has no FUNCTION).
pub fn load_functions(connection: &mut impl redis::ConnectionLike) -> Result<i64, Error> {
    loaded(load_command().query(connection))
}

/// The async [`load_functions`], on a `MultiplexedConnection`, a `ConnectionManager` or a
/// `redis::cluster_async::ClusterConnection` (every master).
///
/// # Errors
/// As for [`load_functions`].
pub async fn load_functions_async(
    connection: &mut impl redis::aio::ConnectionLike,
) -> Result<i64, Error> {
    loaded(load_command().query_async(connection).await)
}
