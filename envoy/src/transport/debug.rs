//! The DEBUG_PORT face: its pages (`/`, `/rlconfig`, `/stats`) on the service, written by
//! the telemetry's dumps.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::Router;

use crate::decision::service::Service;
use crate::telemetry::stats::{dump_config, dump_stats, DEBUG_ENDPOINTS};

/// The debug listener's pages: `/` lists them, `/rlconfig`, `/stats`.
pub fn debug_router(service: Arc<Service>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async {
                DEBUG_ENDPOINTS
                    .iter()
                    .map(|(path, help)| format!("{path}: {help}\n"))
                    .collect::<String>()
            }),
        )
        .route(
            "/rlconfig",
            get(|State(s): State<Arc<Service>>| async move { dump_config(&s.config()) }),
        )
        .route(
            "/stats",
            get(|State(s): State<Arc<Service>>| async move { dump_stats(&s.metrics) }),
        )
        .with_state(service)
}
