//! Telemetry: what the service tells about itself. `metrics` the Prometheus names, `stats` the
//! statsd/dogstatsd sinks and the DEBUG_PORT pages, `logging` the log line formats.

pub mod logging;
pub mod metrics;
pub mod stats;
