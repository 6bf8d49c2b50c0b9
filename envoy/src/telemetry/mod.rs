//! Telemetry: what the service tells about itself. `metrics` the Prometheus names, `stats` the
//! statsd/dogstatsd sinks and the DEBUG_PORT pages, `logging` the log line formats;
//! `names` and `timings` the leaves both sides share.

pub mod logging;
pub mod metrics;
pub mod names;
pub mod stats;
pub mod timings;
