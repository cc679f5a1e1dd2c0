//! What every MultiPilot process shares: layered configuration, telemetry, the `/healthz`, `/readyz` and
//! `/metrics` endpoints, the role context and shutdown.

pub mod auth;
pub mod config;
pub mod context;
pub mod error;
pub mod http;
pub mod store;
pub mod telemetry;

pub use context::Context;

/// Resolves when the process is asked to stop (Ctrl-C or SIGTERM).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
