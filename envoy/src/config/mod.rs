//! Configuration: where the limits and the process's settings come from. The environment
//! (`settings`, each value read through `env`, a leaf the rules' durations share), the YAML rules and their lookup (`rules`, read through `yaml11`), the
//! filesystem watch on them (`watch`) and the rules over xDS (`xds`). Imports nothing of the
//! decision, Redis, the transports or telemetry.

pub mod env;
pub mod rules;
pub mod settings;
pub mod watch;
pub mod xds;
pub mod yaml11;
