//! Whether this process should be sent calls: the three things the Go service's health
//! checker tracks (`sigterm`, `redis`, `config`), as one shared value both health faces
//! (`/healthcheck` and `grpc.health.v1`, see `health`) read. Serving means all three hold:
//! no SIGTERM yet, Redis answered its last probe, and (with
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`) the last config loaded has a domain.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// The shared health state; each change of "serving" goes to [`Readiness::subscribe`].
pub struct Readiness {
    draining: AtomicBool,
    redis_ok: AtomicBool,
    config_ok: AtomicBool,
    need_config: bool,
    serving: watch::Sender<bool>,
}

impl Readiness {
    /// Not serving until Redis answers a first probe; with `need_config`, also until a
    /// config with a domain loads (the Go service starts both the same way).
    pub fn new(need_config: bool) -> Readiness {
        let (serving, _) = watch::channel(false);
        Readiness {
            draining: AtomicBool::new(false),
            redis_ok: AtomicBool::new(false),
            config_ok: AtomicBool::new(!need_config),
            need_config,
            serving,
        }
    }

    /// Whether calls should be sent here now.
    pub fn serving(&self) -> bool {
        !self.draining.load(Ordering::SeqCst)
            && self.redis_ok.load(Ordering::SeqCst)
            && self.config_ok.load(Ordering::SeqCst)
    }

    /// Each change of [`Readiness::serving`], the current value first.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.serving.subscribe()
    }

    /// SIGTERM: not serving from now on, for good.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.publish();
    }

    /// The last Redis probe's outcome.
    pub fn set_redis_ok(&self, ok: bool) {
        self.redis_ok.store(ok, Ordering::SeqCst);
        self.publish();
    }

    /// A config loaded: with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, serving needs
    /// `domains > 0`, as the Go service's `IsEmptyDomains` check.
    pub fn config_loaded(&self, domains: usize) {
        self.config_ok
            .store(!self.need_config || domains > 0, Ordering::SeqCst);
        self.publish();
    }

    fn publish(&self) {
        let now = self.serving();
        self.serving.send_if_modified(|was| {
            let changed = *was != now;
            *was = now;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_needs_redis_no_sigterm_and_a_config_when_asked() {
        let r = Readiness::new(true);
        assert!(!r.serving());
        r.set_redis_ok(true);
        assert!(!r.serving(), "no config with a domain yet");
        r.config_loaded(0);
        assert!(!r.serving(), "an empty config is not a config");
        r.config_loaded(2);
        assert!(r.serving());
        r.set_redis_ok(false);
        assert!(!r.serving());
        r.set_redis_ok(true);
        assert!(*r.subscribe().borrow());
        r.set_draining();
        assert!(!r.serving());
        r.set_redis_ok(true);
        assert!(!r.serving(), "draining is for good");

        let r = Readiness::new(false);
        r.set_redis_ok(true);
        assert!(r.serving());
    }
}
