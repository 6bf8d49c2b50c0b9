//! Where the rules live: the runtime settings (`RUNTIME_*`, `MERGE_DOMAIN_CONFIG`), read by
//! the settings and used by the rules (`crate::config::rules` finds and reads the files). A
//! leaf: imports nothing of the crate.

use std::path::PathBuf;

/// Where the runtime files are and how they are read: envoyproxy/ratelimit's goruntime
/// layout and its `MERGE_DOMAIN_CONFIG`.
#[derive(Clone, Debug)]
pub struct Source {
    /// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY`.
    pub base: PathBuf,
    /// `$RUNTIME_APPDIRECTORY` (`config`).
    pub app_dir: String,
    /// `RUNTIME_WATCH_ROOT`: every file under `base` whose path, `/` read as `.`, starts with
    /// `<app_dir>.`; otherwise every file under `base/<app_dir>`.
    pub watch_root: bool,
    /// `RUNTIME_IGNOREDOTFILES`: skip files and directories whose name starts with `.`.
    pub ignore_dotfiles: bool,
    /// `MERGE_DOMAIN_CONFIG`: files of one domain are merged instead of refused.
    pub merge_domains: bool,
}
