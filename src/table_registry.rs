//! Where the tables are: the (database, key name) of every table, for the background sweep
//! to visit, so it never scans keys it does not own and its work does not grow with them.
//!
//! The registry may hold names that are no longer tables (deleted, expired, flushed, renamed
//! away, overwritten by another type): the sweep drops such a name when it visits it, so
//! nothing here needs to follow deletions. It must never miss a table, so every way a table
//! comes to be under a name adds that name:
//! - the module's own writes (`RL.HACQUIRE`, `RL.HSETSTATE` from a master, the AOF or a
//!   slot migration) create a table through [`note`];
//! - the table type's callbacks name the key a table value arrives under ([`note_place`]):
//!   `rdb_load` for loading an RDB (a restart, a replica's full sync, `DEBUG RELOAD`) and for
//!   `RESTORE` (and so `MIGRATE`), `copy2` for `COPY`;
//! - `RENAME` and `MOVE` report their destination as keyspace events (`rename_to`,
//!   `move_to`), except on the Valkey versions where subscribing to those events moves the
//!   client of every `MOVE` and cross-database `COPY` to the destination database
//!   (`server::generic_events_move_clients`): there a renamed or moved table is found again
//!   at a write that adds a bucket filling sooner than any it holds;
//! - `SWAPDB` swaps the databases of the names, and `FLUSHDB` / `FLUSHALL` drop them.
//!
//! [`Registry`] is the pure set (no Redis types); the glue below feeds it from the server.
//! Depends on nothing of the module (it is handed the table type at [`subscribe`]), so the
//! table type and the sweep both use it without an arrow between them.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent, RedisModuleString};

/// One table's place: its database and key name.
pub type Place = (i32, Box<[u8]>);

/// The names the sweep visits, in a visiting order that survives removals: a name added
/// during a pass is visited in it or the next, and a removal never makes the pass skip one.
#[derive(Debug, Default)]
pub struct Registry {
    places: Vec<Place>,
    /// Per place, the instant (ns) before which the sweep need not look at it: when its
    /// table's earliest bucket fills, or a recheck, whichever is first. 0: look now.
    skip_until_ns: Vec<u64>,
    index: HashMap<Place, usize>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names held.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Whether no name is held.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Adds `name` in `db`, to be looked at on the sweep's next pass (a name already held
    /// is looked at again too: it may hold another table now). Returns whether it was new.
    pub fn insert(&mut self, db: i32, name: &[u8]) -> bool {
        let place: Place = (db, name.into());
        if let Some(&i) = self.index.get(&place) {
            if let Some(skip) = self.skip_until_ns.get_mut(i) {
                *skip = 0;
            }
            return false;
        }
        self.index.insert(place.clone(), self.places.len());
        self.places.push(place);
        self.skip_until_ns.push(0);
        true
    }

    /// The instant before which the place at `i` need not be looked at (0: now).
    pub fn skip_until_ns(&self, i: usize) -> u64 {
        self.skip_until_ns.get(i).copied().unwrap_or(0)
    }

    /// Lets the sweep pass over the place at `i` until `until_ns`.
    pub fn skip_until(&mut self, i: usize, until_ns: u64) {
        if let Some(skip) = self.skip_until_ns.get_mut(i) {
            *skip = until_ns;
        }
    }

    /// The place at position `i` of the visiting order.
    pub fn get(&self, i: usize) -> Option<(i32, &[u8])> {
        self.places.get(i).map(|(db, name)| (*db, &name[..]))
    }

    /// Removes the place at `i`. The last place moves into `i`, so a walk that removed at
    /// its position visits `i` again rather than moving on.
    pub fn remove_at(&mut self, i: usize) {
        if i >= self.places.len() {
            return;
        }
        let removed = self.places.swap_remove(i);
        self.skip_until_ns.swap_remove(i);
        self.index.remove(&removed);
        if let Some(moved) = self.places.get(i) {
            if let Some(at) = self.index.get_mut(moved) {
                *at = i;
            }
        }
    }

    /// `SWAPDB a b`: every name of `a` is now in `b`, and the other way round.
    pub fn swap_dbs(&mut self, a: i32, b: i32) {
        for place in &mut self.places {
            if place.0 == a {
                place.0 = b;
            } else if place.0 == b {
                place.0 = a;
            }
        }
        self.reindex();
    }

    /// `FLUSHDB` of `db`, or `FLUSHALL` when `db` is `None`: drops their names.
    pub fn flush(&mut self, db: Option<i32>) {
        match db {
            None => {
                self.places.clear();
                self.skip_until_ns.clear();
                self.index.clear();
            }
            Some(db) => {
                let kept: Vec<(Place, u64)> = std::mem::take(&mut self.places)
                    .into_iter()
                    .zip(std::mem::take(&mut self.skip_until_ns))
                    .filter(|(place, _)| place.0 != db)
                    .collect();
                (self.places, self.skip_until_ns) = kept.into_iter().unzip();
                self.reindex();
            }
        }
    }

    fn reindex(&mut self) {
        self.index = self
            .places
            .iter()
            .enumerate()
            .map(|(i, place)| (place.clone(), i))
            .collect();
    }
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// The table type, handed over at [`subscribe`].
static TABLE_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// The registry, locked. Only the main thread uses it, so the lock is never contended; a
/// panic that poisoned it left the set usable (each operation leaves it whole).
pub fn lock() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Names held, for `INFO rl`.
pub fn len() -> usize {
    lock().as_ref().map_or(0, Registry::len)
}

/// Records that `name`, in the database `ctx` has selected, holds a table.
///
/// # Safety
/// `ctx` must be a live context and `name` a live string.
pub unsafe fn note(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) {
    // SAFETY: forwarded (caller).
    unsafe {
        if let Some(selected_db) = raw::RedisModule_GetSelectedDb {
            note_place(selected_db(ctx), name);
        }
    }
}

/// The database `ctx` has selected and the bytes of `name`, borrowed for as long as the
/// caller holds the string.
///
/// # Safety
/// `ctx` must be a live context and `name` a live string that outlives `'a`.
pub unsafe fn place_of<'a>(
    ctx: *mut RedisModuleCtx,
    name: *const RedisModuleString,
) -> Option<(i32, &'a [u8])> {
    // SAFETY: forwarded (caller).
    unsafe {
        let (selected_db, ptr_len) = (
            raw::RedisModule_GetSelectedDb?,
            raw::RedisModule_StringPtrLen?,
        );
        let mut len = 0usize;
        let bytes = ptr_len(name, &mut len);
        if bytes.is_null() {
            return None;
        }
        Some((
            selected_db(ctx),
            std::slice::from_raw_parts(bytes.cast::<u8>(), len),
        ))
    }
}

/// Records that `name` in database `db` holds a table.
pub fn note_at(db: i32, name: &[u8]) {
    lock().get_or_insert_with(Registry::new).insert(db, name);
}

/// Records that `name` in database `db` holds a table.
///
/// # Safety
/// `name` must be null or a live string.
pub unsafe fn note_place(db: c_int, name: *const RedisModuleString) {
    // SAFETY: forwarded (caller); the bytes are copied before the string can go.
    unsafe {
        let Some(ptr_len) = raw::RedisModule_StringPtrLen else {
            return;
        };
        if name.is_null() {
            return;
        }
        let mut len = 0usize;
        let bytes = ptr_len(name, &mut len);
        if bytes.is_null() {
            return;
        }
        let name = std::slice::from_raw_parts(bytes.cast::<u8>(), len);
        lock().get_or_insert_with(Registry::new).insert(db, name);
    }
}

/// Subscribes to what can put a table of `table_type` under a new name (see the file's
/// docs); `renames` says whether to listen to the keyspace events of `RENAME` and `MOVE`.
/// Returns false if the server refused any of it: tables may then be missed.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn subscribe(
    ctx: *mut RedisModuleCtx,
    table_type: *mut raw::RedisModuleType,
    renames: bool,
) -> bool {
    TABLE_TYPE.store(table_type, Ordering::Relaxed);
    // SAFETY: load-time context (caller); the callbacks have the required signatures.
    unsafe {
        let (Some(keyspace), Some(server)) = (
            raw::RedisModule_SubscribeToKeyspaceEvents,
            raw::RedisModule_SubscribeToServerEvent,
        ) else {
            return false;
        };
        let generic = raw::REDISMODULE_NOTIFY_GENERIC as c_int;
        let mut ok =
            !renames || keyspace(ctx, generic, Some(on_keyspace)) == raw::REDISMODULE_OK as c_int;
        for id in [
            raw::REDISMODULE_EVENT_SWAPDB,
            raw::REDISMODULE_EVENT_FLUSHDB,
        ] {
            let event = RedisModuleEvent { id, dataver: 1 };
            ok &= server(ctx, event, Some(on_server)) == raw::REDISMODULE_OK as c_int;
        }
        ok
    }
}

/// Whether the key `name` in `ctx`'s selected database holds a table of `table_type`.
///
/// # Safety
/// `ctx` and `name` must be live.
unsafe fn is_table(
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    table_type: *mut raw::RedisModuleType,
) -> bool {
    // SAFETY: forwarded (caller); the handle is closed before return. A read-only open
    // neither creates nor (while loading) expires the key.
    unsafe {
        let (Some(open), Some(close), Some(key_type), Some(module_type)) = (
            raw::RedisModule_OpenKey,
            raw::RedisModule_CloseKey,
            raw::RedisModule_KeyType,
            raw::RedisModule_ModuleTypeGetType,
        ) else {
            return false;
        };
        let key = open(ctx, name, raw::REDISMODULE_READ as c_int).cast::<raw::RedisModuleKey>();
        if key.is_null() {
            return false;
        }
        let found = key_type(key) == raw::REDISMODULE_KEYTYPE_MODULE as c_int
            && module_type(key) == table_type;
        close(key);
        found
    }
}

unsafe extern "C" fn on_keyspace(
    ctx: *mut RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut RedisModuleString,
) -> c_int {
    let _ = std::panic::catch_unwind(|| {
        if event.is_null() {
            return;
        }
        // SAFETY: the server passes a NUL-terminated event name, live for this call.
        let event = unsafe { CStr::from_ptr(event) }.to_bytes();
        if !matches!(event, b"rename_to" | b"move_to") {
            return;
        }
        // SAFETY: the callback's live context (its database is the key's) and key name.
        // Opening a key retains its name, which the server may forbid for an event's name:
        // open a copy, freed here.
        unsafe {
            let (Some(copy), Some(free)) = (
                raw::RedisModule_CreateStringFromString,
                raw::RedisModule_FreeString,
            ) else {
                return;
            };
            let name = copy(ctx, key);
            if name.is_null() {
                return;
            }
            if is_table(ctx, name, TABLE_TYPE.load(Ordering::Relaxed)) {
                note(ctx, name);
            }
            free(ctx, name);
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// `RedisModuleSwapDbInfo` (version 1).
#[repr(C)]
struct SwapDbInfo {
    version: u64,
    first: i32,
    second: i32,
}

/// `RedisModuleFlushInfo` (version 1).
#[repr(C)]
struct FlushInfo {
    version: u64,
    sync: i32,
    dbnum: i32,
}

unsafe extern "C" fn on_server(
    _ctx: *mut RedisModuleCtx,
    event: RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        if data.is_null() {
            return;
        }
        let mut guard = lock();
        let Some(registry) = guard.as_mut() else {
            return;
        };
        if event.id == raw::REDISMODULE_EVENT_SWAPDB {
            // SAFETY: the server passes a RedisModuleSwapDbInfo with this event.
            let info = unsafe { &*data.cast::<SwapDbInfo>() };
            registry.swap_dbs(info.first, info.second);
        } else if event.id == raw::REDISMODULE_EVENT_FLUSHDB
            && subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END
        {
            // SAFETY: the server passes a RedisModuleFlushInfo with this event.
            let info = unsafe { &*data.cast::<FlushInfo>() };
            registry.flush((info.dbnum >= 0).then_some(info.dbnum));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(r: &Registry) -> Vec<(i32, Vec<u8>)> {
        (0..r.len())
            .map(|i| {
                let (db, name) = r.get(i).unwrap();
                (db, name.to_vec())
            })
            .collect()
    }

    #[test]
    fn a_name_is_held_once_per_database() {
        let mut r = Registry::new();
        assert!(r.insert(0, b"t"));
        assert!(!r.insert(0, b"t"));
        assert!(r.insert(1, b"t"));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_removal_moves_the_last_name_into_its_place() {
        let mut r = Registry::new();
        for name in [&b"a"[..], b"b", b"c"] {
            r.insert(0, name);
        }
        r.remove_at(0);
        assert_eq!(names(&r), vec![(0, b"c".to_vec()), (0, b"b".to_vec())]);
        // The index follows the move: "c" can be removed by position and re-added.
        assert!(!r.insert(0, b"c"));
        r.remove_at(0);
        assert!(r.insert(0, b"c"));
        r.remove_at(9); // past the end: nothing
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_skip_follows_its_place_and_a_new_table_under_the_name_clears_it() {
        let mut r = Registry::new();
        r.insert(0, b"a");
        r.insert(0, b"b");
        r.skip_until(1, 99);
        r.remove_at(0); // "b" moves into 0, its skip with it
        assert_eq!((r.get(0), r.skip_until_ns(0)), (Some((0, &b"b"[..])), 99));
        assert!(!r.insert(0, b"b"));
        assert_eq!(
            r.skip_until_ns(0),
            0,
            "a table created again is looked at now"
        );
        r.insert(1, b"c");
        r.skip_until(1, 7);
        r.flush(Some(0));
        assert_eq!((r.get(0), r.skip_until_ns(0)), (Some((1, &b"c"[..])), 7));
    }

    #[test]
    fn swapdb_and_flush_follow_the_server() {
        let mut r = Registry::new();
        r.insert(0, b"a");
        r.insert(1, b"b");
        r.insert(2, b"c");
        r.swap_dbs(0, 1);
        assert_eq!(
            names(&r),
            vec![(1, b"a".to_vec()), (0, b"b".to_vec()), (2, b"c".to_vec())]
        );
        assert!(!r.insert(1, b"a"), "the index follows the swap");
        r.flush(Some(0));
        assert_eq!(names(&r), vec![(1, b"a".to_vec()), (2, b"c".to_vec())]);
        assert!(!r.insert(2, b"c"), "the index follows the flush");
        r.flush(None);
        assert!(r.is_empty());
    }
}
