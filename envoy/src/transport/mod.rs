//! The transports: how a request reaches the decision and how health is told. `grpc` the
//! rate-limit service, `http` /json and /metrics, `health` grpc.health.v1, /healthcheck and the
//! gRPC listener, `readiness` the health state both health faces read, `debug` the DEBUG_PORT pages.

pub mod debug;
pub mod grpc;
pub mod health;
pub mod http;
pub mod readiness;
