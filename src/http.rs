//! The HTTP endpoints of the sidecar: `/metrics`, `/livez` (alias `/healthz`), `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    stall_bound: Duration,
}

/// Binds `addr` and serves until `stop` is cancelled; returns the bound address (port 0 picks
/// a free one) once listening.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    stall_bound: Duration,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/livez", get(livez))
        .route("/healthz", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            metrics,
            health,
            stall_bound,
        });
    tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
        if let Err(e) = server.await {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok(bound)
}

async fn metrics_text(State(s): State<AppState>) -> (StatusCode, String) {
    s.metrics.ready.set(i64::from(s.health.is_ready()));
    (StatusCode::OK, s.metrics.render())
}

async fn livez(State(s): State<AppState>) -> (StatusCode, String) {
    match s.health.stalled(s.stall_bound) {
        None => (StatusCode::OK, "ok\n".into()),
        Some(what) => (StatusCode::SERVICE_UNAVAILABLE, format!("{what}\n")),
    }
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
