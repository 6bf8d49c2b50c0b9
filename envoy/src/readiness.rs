//! Whether the service is ready to decide: the one flag `/healthcheck` (and the gRPC health
//! service) read. It is false until the first connection to Redis is made, so a pod that is
//! still retrying Redis at start-up (`REDIS_STARTUP_*`) is never sent traffic.

use std::sync::atomic::{AtomicBool, Ordering};

static REDIS_CONNECTED: AtomicBool = AtomicBool::new(false);

/// Whether Redis has been reached (set once, at start-up).
pub fn redis_connected() -> bool {
    REDIS_CONNECTED.load(Ordering::Acquire)
}

/// Marks Redis reached: the health checks may answer serving from now on.
pub fn set_redis_connected() {
    REDIS_CONNECTED.store(true, Ordering::Release);
}
