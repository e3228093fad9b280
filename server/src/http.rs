//! The HTTP layer under the routes: hyper's HTTP/1 connections with a header-read
//! timeout, at most `max_connections` at once, and a graceful stop on SIGTERM or Ctrl-C.
//!
//! hyper's header-read timer runs whenever a connection waits for a request head, so the
//! one setting bounds both a slow head and an idle kept-alive connection; tower-http's
//! body timeout bounds a request body that stalls between chunks. Connections past the
//! limit wait in the kernel's accept backlog until one closes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// Connection limits and timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long a connection may take to send a request head, or stay idle between
    /// requests; also the longest pause inside a request body.
    pub header_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long in-flight requests may run on after a stop signal.
    pub shutdown_timeout: Duration,
}

/// Serves `app` on `listener` until `stop` resolves (or `abort` does: then at once),
/// then stops accepting and lets open requests finish for up to `shutdown_timeout`.
/// Returns the number of connections still open when it gave up on them.
pub(crate) async fn serve(listener: TcpListener, app: Router, limits: Limits, stop: impl Future<Output = ()>) -> usize {
    let app = app.layer(RequestBodyTimeoutLayer::new(limits.header_timeout));
    let service = TowerToHyperService::new(app);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&open).acquire_owned() => permit,
            () = &mut stop => break,
        };
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: the connection stays in the
                // backlog; wait a little rather than spin (as axum::serve does).
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!("stopping: no new connections; open requests finish");
    match tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown()).await {
        Ok(()) => 0,
        Err(_) => limits.max_connections.max(1) - open.available_permits(),
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT). The handlers are installed at once, not on
/// the first poll, so a signal sent right after start-up is not missed.
pub(crate) fn stop_signal() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    #[cfg(unix)]
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    })
}
