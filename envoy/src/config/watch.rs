//! Filesystem notifications for the config: which directories to watch (the config
//! directory and its subdirectories, and with `RUNTIME_WATCH_ROOT` the runtime root and the directory holding it, so
//! that a symlink swap of the root is seen) and a wake-up when any of them changes.
//!
//! The caller keeps its one-second poll as the fallback: a filesystem without inotify
//! events (some network and overlay mounts), a full inotify watch table, or a watch on a
//! directory that did not exist yet all leave the poll to notice. A notification only wakes
//! the caller early; it still compares the directory's fingerprint before reloading.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;

/// Live watches; dropping this ends them.
pub struct Watch {
    _watcher: RecommendedWatcher,
    /// The directories watched, for the log.
    pub watched: Vec<PathBuf>,
}

/// The directories whose changes may change the config: `dir`, and with `watch_root` also
/// `root` (recursively, as envoyproxy/ratelimit's runtime does) and `root`'s parent, where
/// a deployment swaps a symlink in.
pub fn targets(dir: &Path, root: &Path, watch_root: bool) -> Vec<(PathBuf, RecursiveMode)> {
    // Recursive: the runtime loader reads the files of subdirectories too.
    let mut all = vec![(dir.to_path_buf(), RecursiveMode::Recursive)];
    if watch_root {
        all.push((root.to_path_buf(), RecursiveMode::Recursive));
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            all.push((parent.to_path_buf(), RecursiveMode::NonRecursive));
        }
    }
    all
}

/// Watches `targets`, calling `changed.notify_one()` on each event. Directories that cannot
/// be watched are skipped (the poll covers them); `None` when none could be.
pub fn start(targets: &[(PathBuf, RecursiveMode)], changed: Arc<Notify>) -> Option<Watch> {
    let handler = move |event: notify::Result<notify::Event>| {
        // Reads (access events) change nothing; anything else may.
        if event.is_ok_and(|e| !e.kind.is_access()) {
            changed.notify_one();
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("config watch unavailable, polling each second only: {e}");
            return None;
        }
    };
    let mut watched = Vec::new();
    for (path, mode) in targets {
        match watcher.watch(path, *mode) {
            Ok(()) => watched.push(path.clone()),
            Err(e) => tracing::debug!("cannot watch {}: {e}", path.display()),
        }
    }
    if watched.is_empty() {
        return None;
    }
    Some(Watch {
        _watcher: watcher,
        watched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_root_and_its_parent_are_watched_only_with_watch_root() {
        let dir = Path::new("/srv/rt/current/config");
        let root = Path::new("/srv/rt/current");
        assert_eq!(targets(dir, root, false).len(), 1);
        let all: Vec<PathBuf> = targets(dir, root, true)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            all,
            [dir, root, Path::new("/srv/rt")].map(Path::to_path_buf)
        );
    }

    #[tokio::test]
    async fn a_file_written_in_the_directory_wakes_the_watcher() {
        let tmp = tempfile::tempdir().unwrap();
        let changed = Arc::new(Notify::new());
        let watch =
            start(&targets(tmp.path(), tmp.path(), false), changed.clone()).expect("inotify watch");
        assert_eq!(watch.watched, [tmp.path().to_path_buf()]);
        std::fs::write(tmp.path().join("a.yaml"), "domain: a\n").unwrap();
        tokio::time::timeout(Duration::from_secs(5), changed.notified())
            .await
            .expect("no notification within 5 s");
    }

    #[tokio::test]
    async fn a_file_written_in_a_subdirectory_wakes_the_watcher() {
        // The runtime loader reads subdirectories' files too, so their changes count.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let changed = Arc::new(Notify::new());
        let _watch =
            start(&targets(tmp.path(), tmp.path(), false), changed.clone()).expect("inotify watch");
        std::fs::write(tmp.path().join("sub/a.yaml"), "domain: a\n").unwrap();
        tokio::time::timeout(Duration::from_secs(5), changed.notified())
            .await
            .expect("no notification within 5 s");
    }
}
