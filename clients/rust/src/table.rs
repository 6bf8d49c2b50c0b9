//! Bucket tables: many buckets in a few keys, spread over a cluster (docs/tables.md).
//!
//! [`Limiter::table`] gives a [`Table`] (and [`AsyncLimiter::table`] an [`AsyncTable`]) whose
//! buckets are named by fields. A field lives in the table `name:{i}` with
//! `i = shard_of(field, shards)`, so one limit's fields spread over `shards` keys, each in the
//! slot of its hash tag `{i}`. With the module the calls are RL.HACQUIRE, RL.HPEEK,
//! RL.HREFUND, RL.HDEL and RL.HLEN on those keys; without it, the shipped Lua script keeps one
//! key per field, `name:{i}:field`, under the same hash tag. [`Limiter::table_with`] takes
//! [`TableOptions`] instead of a count: the expected number of buckets alone picks
//! [`shards_for`] of them, so that no table holds more than [`MAX_BUCKETS_PER_TABLE`].
//!
//! Decisions go through the limiter that made the table, with its engine: the same failure
//! policy, deny cache and module detection; a field is known to them by its fallback key.
//! This file only names things and sends the two calls that are not decisions (delete, len).
//! The same names as the Python (`redis_rl.table`) and Node (`src/table.js`) libraries.

use redis::Value;

use crate::asynch::AsyncLimiter;
use crate::engine::{Engine, Path, Target};
use crate::op::{CallError, Op};
use crate::sync::{Connect, Limiter};
use crate::types::{Charged, Decision, Error, Limit, Refund};

/// The most shards a limit may be spread over: there are no more cluster slots than this.
pub const MAX_SHARDS: u32 = 16384;

/// The most fields `delete` sends in one command, so no one call keeps the server long.
const DELETE_BATCH: usize = 1000;

/// The most buckets [`TableOptions::expected_buckets`] puts in one table: the largest table
/// whose `MIGRATE` (what resharding a cluster does to a key) measured under 100 ms, from the
/// run of `make bench-tables` in `bench/tables.md` (125,976, rounded down to a thousand;
/// Redis 7.0.15 on a shared 2-core machine, docs/tables.md, "Choosing shards"). A bigger
/// table blocks the node that moves it for longer. The Python and Node libraries use
/// the same figure.
pub const MAX_BUCKETS_PER_TABLE: u64 = 125_000;

/// How many tables keep `expected_buckets` buckets at [`MAX_BUCKETS_PER_TABLE`] or fewer each:
/// `max(1, ceil(expected_buckets / MAX_BUCKETS_PER_TABLE))`.
///
/// # Errors
/// [`Error::Invalid`] naming `expected_buckets` when that takes more than [`MAX_SHARDS`].
pub fn shards_for(expected_buckets: u64) -> Result<u32, Error> {
    let shards = expected_buckets.div_ceil(MAX_BUCKETS_PER_TABLE).max(1);
    u32::try_from(shards)
        .ok()
        .filter(|s| *s <= MAX_SHARDS)
        .ok_or(Error::Invalid(
            "expected_buckets needs more than the 16384 shards there can be",
        ))
}

/// How [`Limiter::table_with`] (and [`AsyncLimiter::table_with`]) spreads a table: a shard
/// count, or the buckets it is expected to hold, or both.
///
/// ```
/// use redis_rl_client::{TableOptions, MAX_BUCKETS_PER_TABLE};
/// let options = TableOptions::new().expected_buckets(3 * MAX_BUCKETS_PER_TABLE + 1);
/// assert_eq!(options.shard_count("api").unwrap(), 4);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableOptions {
    shards: Option<u32>,
    expected_buckets: Option<u64>,
}

impl TableOptions {
    /// Neither given: one table.
    pub fn new() -> TableOptions {
        TableOptions::default()
    }

    /// Spread the fields over exactly `shards` tables (1..=16384).
    pub fn shards(mut self, shards: u32) -> TableOptions {
        self.shards = Some(shards);
        self
    }

    /// The most buckets the limit is expected to hold: without [`TableOptions::shards`], picks
    /// [`shards_for`] of them; with it, too few shards for these buckets logs a warning.
    pub fn expected_buckets(mut self, buckets: u64) -> TableOptions {
        self.expected_buckets = Some(buckets);
        self
    }

    /// The shard count these options give table `name`: the shards if given, else
    /// [`shards_for`] the expected buckets if given, else 1. Given both, too few shards for
    /// the expected buckets are kept (a single server never moves its keys) and a warning
    /// names the count that fits.
    ///
    /// # Errors
    /// As for [`shards_for`].
    pub fn shard_count(&self, name: &str) -> Result<u32, Error> {
        let Some(expected) = self.expected_buckets else {
            return Ok(self.shards.unwrap_or(1));
        };
        let needed = shards_for(expected)?;
        let Some(shards) = self.shards else {
            return Ok(needed);
        };
        if (1..needed).contains(&shards) {
            log::warn!(
                "redis-rl: table {name:?}: {shards} shards for {expected} expected buckets put up \
                 to {} in one table, more than the {MAX_BUCKETS_PER_TABLE} whose MIGRATE stays \
                 under 100 ms; {needed} shards would keep each under it",
                expected.div_ceil(u64::from(shards))
            );
        }
        Ok(shards)
    }
}

/// The shard of `field` among `shards`: the first 8 bytes of SHA-1 over its UTF-8 bytes, read
/// big-endian, modulo `shards` (the Python and Node libraries compute the same; the cases are
/// in `clients/vectors/table.json`). `shards` of 0 is taken as 1.
///
/// ```
/// assert_eq!(redis_rl_client::shard_of("user:42", 1), 0);
/// assert!(redis_rl_client::shard_of("user:42", 16) < 16);
/// ```
pub fn shard_of(field: &str, shards: u32) -> u32 {
    let digest = sha1_smol::Sha1::from(field.as_bytes()).digest().bytes();
    let mut first = [0u8; 8];
    for (to, from) in first.iter_mut().zip(digest.iter()) {
        *to = *from;
    }
    let shard = u64::from_be_bytes(first) % u64::from(shards.max(1));
    u32::try_from(shard).unwrap_or(0)
}

/// The names of one field's bucket: its table key and its fallback key.
struct Named {
    table: String,
    fallback_key: String,
}

impl Named {
    fn target<'a>(&'a self, field: &'a str) -> Target<'a> {
        Target::Field {
            table: &self.table,
            field,
            fallback_key: &self.fallback_key,
        }
    }
}

/// A table's name and shard count, checked; the naming both tables share.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shards {
    name: String,
    shards: u32,
}

impl Shards {
    fn new(name: &str, shards: u32) -> Result<Shards, Error> {
        if name.is_empty() {
            return Err(Error::Invalid("name must be a non-empty string"));
        }
        if name.contains(['{', '}']) {
            // A brace in the name would become the hash tag and put every shard in one slot.
            return Err(Error::Invalid(
                "name must not contain { or } (the shard index is the hash tag)",
            ));
        }
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(Error::Invalid("shards must be an integer from 1 to 16384"));
        }
        Ok(Shards {
            name: name.to_owned(),
            shards,
        })
    }

    fn key(&self, shard: u32) -> String {
        format!("{}:{{{shard}}}", self.name)
    }

    fn fallback_key(&self, field: &str) -> String {
        format!("{}:{field}", self.key(shard_of(field, self.shards)))
    }

    /// The table key and the fallback key of `field`, for [`Named::target`].
    fn named(&self, field: &str) -> Named {
        let table = self.key(shard_of(field, self.shards));
        let fallback_key = format!("{table}:{field}");
        Named {
            table,
            fallback_key,
        }
    }

    /// The distinct fields by table key, in the order first given, at most
    /// [`DELETE_BATCH`] to a group.
    fn groups<'f>(&self, fields: &[&'f str]) -> Vec<(String, Vec<&'f str>)> {
        let mut seen = std::collections::HashSet::new();
        let mut by_table: std::collections::BTreeMap<String, Vec<&'f str>> = Default::default();
        for field in fields {
            if seen.insert(*field) {
                let table = self.key(shard_of(field, self.shards));
                by_table.entry(table).or_default().push(field);
            }
        }
        let mut groups = Vec::new();
        for (table, group) in by_table {
            for batch in group.chunks(DELETE_BATCH) {
                groups.push((table.clone(), batch.to_vec()));
            }
        }
        groups
    }

    fn reset_all(&self, engine: &Engine, fields: &[&str]) {
        for field in fields {
            engine.reset(&self.fallback_key(field));
        }
    }

    /// The command deleting one group: RL.HDEL on the module, DEL of the fallback keys on Lua.
    fn delete_command(&self, path: Path, table: &str, fields: &[&str]) -> redis::Cmd {
        let mut cmd;
        if path == Path::Module {
            cmd = redis::cmd("RL.HDEL");
            cmd.arg(table);
            for field in fields {
                cmd.arg(*field);
            }
        } else {
            cmd = redis::cmd("DEL");
            for field in fields {
                cmd.arg(format!("{table}:{field}"));
            }
        }
        cmd
    }

    /// SCAN MATCH for every fallback key of the table, `name:{*}:*`, the name's glob
    /// characters escaped; [`Shards::is_ours`] then keeps the shards below `shards`.
    fn pattern(&self) -> String {
        let mut out = String::new();
        for c in self.name.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push_str(":{*}:*");
        out
    }

    /// Whether `key` is the fallback key of a shard below `shards`: the pattern also matches
    /// `name:{x}:…` for any x, such as the shards of a larger count.
    fn is_ours(&self, key: &[u8]) -> bool {
        let Some(rest) = key
            .strip_prefix(self.name.as_bytes())
            .and_then(|rest| rest.strip_prefix(b":{"))
        else {
            return false;
        };
        let Some(end) = rest.windows(2).position(|w| w == b"}:") else {
            return false;
        };
        let index = rest.get(..end).unwrap_or_default();
        let canonical = index == b"0" || index.first().is_some_and(|d| (b'1'..=b'9').contains(d));
        canonical
            && index.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(index)
                .ok()
                .and_then(|text| text.parse::<u32>().ok())
                .is_some_and(|shard| shard < self.shards)
    }
}

fn scan_command(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

const LEN_ON_LUA_CLUSTER: &str = "len off the module path needs a standalone server and a \
     single-node client (SCAN cannot reach each shard's node through a cluster client)";

fn integer(value: &Value, what: &str) -> Result<u64, CallError> {
    match value {
        Value::Int(n) => u64::try_from(*n).map_err(|_| CallError::Reply(format!("{what}: {n}"))),
        other => Err(CallError::Reply(format!("{what}: {other:?}"))),
    }
}

/// SCAN's reply: the next cursor, and how many of its keys are `shards`' fallback keys.
fn scan_reply(value: Value, shards: &Shards) -> Result<(u64, usize), CallError> {
    let (cursor, keys): (u64, Vec<Vec<u8>>) =
        redis::from_redis_value(value).map_err(|e| CallError::Reply(format!("SCAN: {e}")))?;
    Ok((cursor, keys.iter().filter(|k| shards.is_ours(k)).count()))
}

/// A limit's buckets named by field, over `shards` tables; made by [`Limiter::table`].
///
/// `acquire`, `peek` and `refund` take and reply as the limiter's methods, with a field for
/// the key. `delete` resets buckets and returns how many were live (not full); `len` counts
/// the live buckets over all the shards. Those two are not decisions: when Redis cannot
/// answer they return the error, whatever the failure policy.
///
/// ```no_run
/// use redis_rl_client::{Limit, Limiter, OnError, Options};
///
/// let limiter = Limiter::new(redis::Client::open("redis://127.0.0.1/")?, Options::new(OnError::Open));
/// let per_ip = limiter.table("ip", 16)?;
/// let d = per_ip.acquire("203.0.113.7", &Limit::new(10.0, 20.0)?, 1.0)?;
/// # let _ = d;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Table<'l, K: Connect = redis::Client> {
    limiter: &'l Limiter<K>,
    shards: Shards,
}

impl<K: Connect> Limiter<K> {
    /// A bucket table of this limiter: `shards` tables `name:{0}` … `name:{shards-1}`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an empty name, a name with `{` or `}`, or `shards` outside
    /// 1..=16384.
    pub fn table(&self, name: &str, shards: u32) -> Result<Table<'_, K>, Error> {
        Ok(Table {
            limiter: self,
            shards: Shards::new(name, shards)?,
        })
    }

    /// A bucket table of this limiter spread as `options` say ([`TableOptions::shard_count`]).
    ///
    /// # Errors
    /// As for [`Limiter::table`] and [`shards_for`].
    pub fn table_with(&self, name: &str, options: TableOptions) -> Result<Table<'_, K>, Error> {
        let shards = options.shard_count(name)?;
        self.table(name, shards)
    }
}

impl<K: Connect> Table<'_, K> {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.shards.name
    }

    /// How many tables the fields are spread over.
    pub fn shards(&self) -> u32 {
        self.shards.shards
    }

    /// The table key of shard `shard`: `name:{shard}`.
    pub fn key(&self, shard: u32) -> String {
        self.shards.key(shard)
    }

    /// The fallback key of `field`, `name:{i}:field`: its key on the Lua path, and the name
    /// the deny cache and the `Local` policy know it by.
    pub fn fallback_key(&self, field: &str) -> String {
        self.shards.fallback_key(field)
    }

    /// Takes `cost` tokens from the bucket `field` of `limit`.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub fn acquire(&self, field: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        let named = self.shards.named(field);
        self.limiter
            .decide(Op::Acquire, named.target(field), limit, cost)
    }

    /// What [`Table::acquire`] would decide for `cost`, taking nothing.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub fn peek(&self, field: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        let named = self.shards.named(field);
        self.limiter
            .decide(Op::Peek, named.target(field), limit, cost)
    }

    /// Gives `cost` tokens back to the bucket `field` and clears its deny-cache entry.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub fn refund(&self, field: &str, limit: &Limit, cost: f64) -> Result<Refund, Error> {
        let named = self.shards.named(field);
        self.limiter
            .give_back(Op::Refund, named.target(field), limit, cost)
    }

    /// Charges `cost` tokens to the bucket `field` for work already done (RL.HCHARGE), as
    /// [`Limiter::charge`]: it always applies and may leave the bucket in debt.
    ///
    /// # Errors
    /// As for [`Limiter::charge`].
    pub fn charge(&self, field: &str, limit: &Limit, cost: f64) -> Result<Charged, Error> {
        let named = self.shards.named(field);
        self.limiter.charge_target(named.target(field), limit, cost)
    }

    /// Resets the buckets of `fields` (full again); returns how many were live.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis cannot answer (this is not a decision, so no policy
    /// applies), and as for [`Limiter::acquire`].
    pub fn delete(&self, fields: &[&str]) -> Result<u64, Error> {
        self.shards.reset_all(self.limiter.engine(), fields);
        let groups = self.shards.groups(fields);
        self.limiter
            .with_path(|connection, path| {
                let mut deleted = 0u64;
                for (table, group) in &groups {
                    let reply: Value = self
                        .shards
                        .delete_command(path, table, group)
                        .query(connection)?;
                    deleted = deleted.saturating_add(integer(&reply, "RL.HDEL reply")?);
                }
                Ok(deleted)
            })
            .map_err(CallError::into_error)
    }

    /// Live buckets over all the shards: RL.HLEN of each; on the Lua path, SCAN of the
    /// fallback keys (a standalone server only).
    ///
    /// # Errors
    /// As for [`Table::delete`]; [`Error::Invalid`] on the Lua path in a cluster.
    #[allow(clippy::len_without_is_empty)] // each would cost a round trip per shard
    pub fn len(&self) -> Result<u64, Error> {
        let result = self.limiter.with_path(|connection, path| {
            let mut count = 0u64;
            if path == Path::Module {
                for shard in 0..self.shards.shards {
                    let reply: Value = redis::cmd("RL.HLEN")
                        .arg(self.shards.key(shard))
                        .query(connection)?;
                    count = count.saturating_add(integer(&reply, "RL.HLEN reply")?);
                }
                return Ok(Ok(count));
            }
            if self.limiter.engine().is_cluster() {
                return Ok(Err(Error::Invalid(LEN_ON_LUA_CLUSTER)));
            }
            let pattern = self.shards.pattern();
            let mut cursor = 0u64;
            loop {
                let reply = scan_command(cursor, &pattern).query(connection)?;
                let (next, keys) = scan_reply(reply, &self.shards)?;
                count = count.saturating_add(keys as u64);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            Ok(Ok(count))
        });
        result.map_err(CallError::into_error)?
    }
}

/// The async [`Table`], made by [`AsyncLimiter::table`]: the same methods, awaited. `delete`
/// and `len` run under the limiter's deadline as a whole.
pub struct AsyncTable<'l, C> {
    limiter: &'l AsyncLimiter<C>,
    shards: Shards,
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync> AsyncLimiter<C> {
    /// A bucket table of this limiter, as [`Limiter::table`].
    ///
    /// # Errors
    /// As for [`Limiter::table`].
    pub fn table(&self, name: &str, shards: u32) -> Result<AsyncTable<'_, C>, Error> {
        Ok(AsyncTable {
            limiter: self,
            shards: Shards::new(name, shards)?,
        })
    }
    /// A bucket table of this limiter spread as `options` say, as [`Limiter::table_with`].
    ///
    /// # Errors
    /// As for [`Limiter::table_with`].
    pub fn table_with(
        &self,
        name: &str,
        options: TableOptions,
    ) -> Result<AsyncTable<'_, C>, Error> {
        let shards = options.shard_count(name)?;
        self.table(name, shards)
    }
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync> AsyncTable<'_, C> {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.shards.name
    }

    /// How many tables the fields are spread over.
    pub fn shards(&self) -> u32 {
        self.shards.shards
    }

    /// The table key of shard `shard`: `name:{shard}`.
    pub fn key(&self, shard: u32) -> String {
        self.shards.key(shard)
    }

    /// The fallback key of `field`, as [`Table::fallback_key`].
    pub fn fallback_key(&self, field: &str) -> String {
        self.shards.fallback_key(field)
    }

    /// Takes `cost` tokens from the bucket `field` of `limit`.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub async fn acquire(&self, field: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        let named = self.shards.named(field);
        self.limiter
            .decide(Op::Acquire, named.target(field), limit, cost)
            .await
    }

    /// What [`AsyncTable::acquire`] would decide for `cost`, taking nothing.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub async fn peek(&self, field: &str, limit: &Limit, cost: f64) -> Result<Decision, Error> {
        let named = self.shards.named(field);
        self.limiter
            .decide(Op::Peek, named.target(field), limit, cost)
            .await
    }

    /// Gives `cost` tokens back to the bucket `field` and clears its deny-cache entry.
    ///
    /// # Errors
    /// As for [`Limiter::acquire`].
    pub async fn refund(&self, field: &str, limit: &Limit, cost: f64) -> Result<Refund, Error> {
        let named = self.shards.named(field);
        self.limiter
            .give_back(Op::Refund, named.target(field), limit, cost)
            .await
    }

    /// Charges `cost` tokens to the bucket `field`, as [`Table::charge`].
    ///
    /// # Errors
    /// As for [`Limiter::charge`].
    pub async fn charge(&self, field: &str, limit: &Limit, cost: f64) -> Result<Charged, Error> {
        let named = self.shards.named(field);
        self.limiter
            .charge_target(named.target(field), limit, cost)
            .await
    }

    /// Resets the buckets of `fields` (full again); returns how many were live.
    ///
    /// # Errors
    /// As for [`Table::delete`].
    pub async fn delete(&self, fields: &[&str]) -> Result<u64, Error> {
        self.shards.reset_all(self.limiter.engine(), fields);
        let groups = self.shards.groups(fields);
        let work = async {
            let (mut connection, path) = self.limiter.connection_with_path().await?;
            let mut deleted = 0u64;
            for (table, group) in &groups {
                let reply: Value = self
                    .shards
                    .delete_command(path, table, group)
                    .query_async(&mut connection)
                    .await?;
                deleted = deleted.saturating_add(integer(&reply, "RL.HDEL reply")?);
            }
            Ok(deleted)
        };
        self.deadline(work).await
    }

    /// Live buckets over all the shards, as [`Table::len`].
    ///
    /// # Errors
    /// As for [`Table::len`].
    #[allow(clippy::len_without_is_empty)] // each would cost a round trip per shard
    pub async fn len(&self) -> Result<u64, Error> {
        let work = async {
            let (mut connection, path) = self.limiter.connection_with_path().await?;
            let mut count = 0u64;
            if path == Path::Module {
                for shard in 0..self.shards.shards {
                    let reply: Value = redis::cmd("RL.HLEN")
                        .arg(self.shards.key(shard))
                        .query_async(&mut connection)
                        .await?;
                    count = count.saturating_add(integer(&reply, "RL.HLEN reply")?);
                }
                return Ok(count);
            }
            if self.limiter.engine().is_cluster() {
                return Err(CallError::Reply(LEN_ON_LUA_CLUSTER.into()));
            }
            let pattern = self.shards.pattern();
            let mut cursor = 0u64;
            loop {
                let reply: Value = scan_command(cursor, &pattern)
                    .query_async(&mut connection)
                    .await?;
                let (next, keys) = scan_reply(reply, &self.shards)?;
                count = count.saturating_add(keys as u64);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            Ok(count)
        };
        self.deadline(work).await
    }

    async fn deadline<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, CallError>>,
    ) -> Result<T, Error> {
        let deadline = self.limiter.engine().options.timeout;
        match tokio::time::timeout(deadline, work).await {
            Ok(result) => result.map_err(CallError::into_error),
            Err(_) => Err(CallError::Timeout(deadline).into_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_buckets_round_up_to_whole_tables() {
        let per = MAX_BUCKETS_PER_TABLE;
        for (expected, shards) in [
            (0, 1),
            (1, 1),
            (per - 1, 1),
            (per, 1),
            (per + 1, 2),
            (3 * per, 3),
            (3 * per + 1, 4),
            (10_000 * per, 10_000),
            (16384 * per, 16384),
        ] {
            assert_eq!(shards_for(expected).unwrap(), shards, "{expected}");
            let options = TableOptions::new().expected_buckets(expected);
            assert_eq!(options.shard_count("t").unwrap(), shards, "{expected}");
            assert!(expected.div_ceil(u64::from(shards)) <= per, "{expected}");
        }
        for bad in [16384 * per + 1, u64::MAX] {
            let err = shards_for(bad).unwrap_err().to_string();
            assert!(err.contains("expected_buckets"), "{err}");
        }
        assert_eq!(TableOptions::new().shard_count("t").unwrap(), 1);
        assert_eq!(TableOptions::new().shards(7).shard_count("t").unwrap(), 7);
        let both = TableOptions::new().shards(2).expected_buckets(3 * per + 1);
        assert_eq!(both.shard_count("t").unwrap(), 2);
    }

    #[test]
    fn a_field_names_its_table_and_fallback_key_apart() {
        let shards = Shards::new("api", 16).unwrap();
        for field in ["", "a", "x}:y", "{z}", "日本語"] {
            let named = shards.named(field);
            assert_eq!(named.table, shards.key(shard_of(field, 16)));
            assert_eq!(named.fallback_key, shards.fallback_key(field));
            assert_eq!(
                named.target(field),
                Target::Field {
                    table: &named.table,
                    field,
                    fallback_key: &named.fallback_key
                }
            );
        }
    }

    #[test]
    fn groups_are_distinct_fields_by_table() {
        let shards = Shards::new("t", 2).unwrap();
        let groups = shards.groups(&["a", "b", "a", "c", "b"]);
        let mut all: Vec<&str> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
        all.sort_unstable();
        assert_eq!(all, ["a", "b", "c"]);
        for (table, group) in &groups {
            assert!(group.iter().all(|f| shards.key(shard_of(f, 2)) == *table));
        }
    }

    #[test]
    fn groups_hold_at_most_a_batch() {
        let shards = Shards::new("t", 1).unwrap();
        let names: Vec<String> = (0..2500).map(|n| n.to_string()).collect();
        let fields: Vec<&str> = names.iter().map(String::as_str).collect();
        let sizes: Vec<usize> = shards
            .groups(&fields)
            .iter()
            .map(|(_, g)| g.len())
            .collect();
        assert_eq!(sizes, [1000, 1000, 500]);
    }

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(
            Shards::new("a*b?[c]\\", 1).unwrap().pattern(),
            "a\\*b\\?\\[c\\]\\\\:{*}:*"
        );
    }

    #[test]
    fn only_the_tables_own_shards_count() {
        let shards = Shards::new("t", 4).unwrap();
        for (key, ours) in [
            (&b"t:{0}:f"[..], true),
            (b"t:{3}:a}:b", true),
            (b"t:{3}:", true),
            (b"t:{4}:f", false),  // a shard of a larger count
            (b"t:{03}:f", false), // not how an index is written
            (b"t:{x}:f", false),
            (b"t:{}:f", false),
            (b"t:{1}", false),
            (b"tt:{1}:f", false),
            (b"t:{1}\xff:f", false),
        ] {
            assert_eq!(
                shards.is_ours(key),
                ours,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }
}
