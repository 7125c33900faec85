//! The accept loop every gpuledger HTTP service runs behind, so that no client can stall one:
//! at most `--max-connections` connections are served at once (one more is answered 503 and
//! closed), a client must send a request's headers within `--header-timeout` (which also ends
//! idle keep-alive connections), a request must be read and answered within
//! `--request-timeout` (else 408), and a client that reads none of an answer for
//! `--write-stall-timeout` is disconnected. `axum::serve` does none of this: it sets no header
//! time-out, so a client sending one header byte a minute holds a connection for good.
//!
//! Given a [`TlsAcceptor`] (from [`crate::TlsArgs`]) the loop serves HTTPS: the TLS handshake
//! must finish within the header time-out, and the stall guard sits under TLS, on the socket
//! itself.
//!
//! A request cut off by the request time-out may still complete its work (ingest runs on a
//! blocking thread that is not cancelled); the client sees 408 and retries, and the aggregator's
//! per-node sequence numbers drop the repeat.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use gpuledger_model::units::DurationSpec;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

/// How long connections still open at shutdown may take to finish their request.
const DRAIN: Duration = Duration::from_secs(30);

/// What a connection over the limit is told before it is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 50\r\n\r\n\
{\"error\":\"too many connections; try again shortly\"}";

/// The limits, as options of every service command.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Most connections served at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// A client must send a request's headers within this time; an idle keep-alive
    /// connection is closed after it too.
    #[arg(long, default_value = "20s")]
    pub header_timeout: DurationSpec,
    /// A request must be read and answered within this time, else 408.
    #[arg(long, default_value = "60s")]
    pub request_timeout: DurationSpec,
    /// A client that reads nothing of an answer for this long is disconnected.
    #[arg(long, default_value = "30s")]
    pub write_stall_timeout: DurationSpec,
    /// Request bodies held at once, all connections together (e.g. `256MiB`); past it a
    /// request is answered 503 with Retry-After before its body is read.
    #[arg(long, default_value = "256MiB")]
    pub max_buffered_bytes: gpuledger_model::units::ByteSize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 1024,
            header_timeout: DurationSpec::from_secs(20),
            request_timeout: DurationSpec::from_secs(60),
            write_stall_timeout: DurationSpec::from_secs(30),
            max_buffered_bytes: gpuledger_model::units::ByteSize(256 << 20),
        }
    }
}

/// Serves `router` on `listener` within `limits` (over TLS when `tls` is given) until
/// `shutdown` resolves, then lets open requests finish (up to 30 s).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let router = router.layer(axum::middleware::from_fn_with_state(
        limits.request_timeout.0,
        request_deadline,
    ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusals = Refusals::default();
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, most likely: wait rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // A TLS client could not read a plain answer: it is just closed.
            refusals.refuse(&stream, limits.max_connections, tls.is_none());
            continue;
        };
        let router = router.clone();
        let stopped = stopped.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            serve_connection(stream, router, limits, tls, stopped).await;
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "connections still open after the drain period; closing them"
        );
        connections.abort_all();
    }
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let guarded = StallGuard::new(stream, limits.write_stall_timeout.0);
    let Some(acceptor) = tls else {
        return serve_http(guarded, router, limits, stopped).await;
    };
    match tokio::time::timeout(limits.header_timeout.0, acceptor.accept(guarded)).await {
        Ok(Ok(stream)) => serve_http(stream, router, limits, stopped).await,
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake not finished within the header time-out"),
    }
}

async fn serve_http<S>(
    stream: S,
    router: Router,
    limits: HttpLimits,
    mut stopped: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(stream);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout.0);
    let connection = builder.serve_connection(io, TowerToHyperService::new(router));
    tokio::pin!(connection);
    let stop_asked = async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop_asked => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Answers 408 when the request is not read and answered in time.
async fn request_deadline(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                path,
                limit_ms = limit.as_millis() as u64,
                "request timed out"
            );
            let message = format!(
                "the request was not received and answered within {}",
                DurationSpec(limit)
            );
            (
                StatusCode::REQUEST_TIMEOUT,
                Json(serde_json::json!({"error": message})),
            )
                .into_response()
        }
    }
}

/// Connections refused for the limit: each is told so without waiting (the answer fits the
/// socket buffer), and the log says how many at most every ten seconds.
#[derive(Default)]
struct Refusals {
    count: AtomicU64,
    last_logged: Mutex<Option<Instant>>,
}

impl Refusals {
    fn refuse(&self, stream: &TcpStream, limit: usize, answer: bool) {
        if answer {
            let _ = stream.try_write(REFUSAL);
        }
        let refused = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                limit,
                refused_total = refused,
                "connection refused: at the connection limit"
            );
        }
    }
}

/// A stream whose writes fail once they have made no progress for `limit`: a client that
/// stops reading an answer frees its connection instead of holding it.
struct StallGuard<S> {
    inner: S,
    limit: Duration,
    stalled_since: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    fn new(inner: S, limit: Duration) -> Self {
        StallGuard {
            inner,
            limit,
            stalled_since: None,
        }
    }

    /// Passes a write's outcome on, or turns a write pending past the limit into an error.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if outcome.is_ready() {
            self.stalled_since = None;
            return outcome;
        }
        let limit = self.limit;
        let deadline = self
            .stalled_since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {}", DurationSpec(limit)),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use std::io::{Read, Write};

    const BIG: usize = 64 << 20;

    fn limits(max_connections: usize, secs: u64) -> HttpLimits {
        HttpLimits {
            max_connections,
            header_timeout: DurationSpec::from_secs(secs),
            request_timeout: DurationSpec::from_secs(secs),
            write_stall_timeout: DurationSpec::from_secs(secs),
            ..HttpLimits::default()
        }
    }

    /// A server on a loopback port with a small page, a page bigger than any socket buffer and
    /// an echo that reads the whole body; returns its address and the signal that stops it.
    fn start(limits: HttpLimits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        start_with(limits, None)
    }

    fn start_with(
        limits: HttpLimits,
        tls: Option<TlsAcceptor>,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let router = Router::new()
                    .route("/small", get(|| async { "ok\n" }))
                    .route("/big", get(|| async { vec![b'x'; BIG] }))
                    .route("/echo", post(|body: axum::body::Bytes| async move { body }));
                serve(listener, router, limits, tls, async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
            });
        });
        (addr_rx.recv().unwrap(), stop_tx)
    }

    fn small(addr: std::net::SocketAddr) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Reads until the server closes (or resets) the connection; the bytes read. Fails if
    /// the server keeps it open for ten seconds without sending anything.
    fn read_until_closed(s: &mut std::net::TcpStream) -> usize {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut total = 0;
        let mut buf = vec![0; 1 << 16];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!("the server kept the connection open: {e}")
                }
                Err(_) => return total,
            }
        }
    }

    #[test]
    fn a_connection_over_the_limit_is_told_503_and_the_limit_frees_when_one_closes() {
        let (addr, _stop) = start(limits(2, 60));
        let first = std::net::TcpStream::connect(addr).unwrap();
        let second = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut third = std::net::TcpStream::connect(addr).unwrap();
        third
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut refused = String::new();
        third.read_to_string(&mut refused).unwrap();
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.ends_with("try again shortly\"}"), "{refused}");
        drop(first);
        drop(second);
        std::thread::sleep(Duration::from_millis(200));
        assert!(small(addr).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn a_client_dribbling_its_headers_is_cut_off_and_frees_its_connection() {
        let (addr, _stop) = start(limits(1, 1));
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /small HTTP/1.1\r\nhost: x\r\n")
            .unwrap();
        let started = Instant::now();
        // The server closes it without an answer once the header time-out passes.
        assert_eq!(read_until_closed(&mut slow), 0);
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert!(small(addr).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn a_body_sent_too_slowly_gets_408_with_a_reason() {
        let (addr, _stop) = start(limits(4, 1));
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
            .unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut answer = vec![0; 4096];
        let n = slow.read(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(
            answer.contains("not received and answered within 1s"),
            "{answer}"
        );
    }

    #[test]
    fn a_client_that_stops_reading_an_answer_is_disconnected() {
        let (addr, _stop) = start(limits(1, 1));
        let mut stuck = std::net::TcpStream::connect(addr).unwrap();
        stuck
            .write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        // Reads nothing until well past the stall limit, so the server's writes stop moving.
        std::thread::sleep(Duration::from_secs(3));
        let got = read_until_closed(&mut stuck);
        assert!(got > 0 && got < BIG, "read {got} of {BIG} bytes");
        assert!(small(addr).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn shutdown_lets_an_open_request_finish() {
        let (addr, stop) = start(limits(4, 5));
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 6\r\n\r\nab")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(b"cdef").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("abcdef"), "{answer}");
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still listening"
        );
    }

    /// A certificate for `localhost` and 127.0.0.1 in `dir`: (cert, key) paths.
    fn certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let pair = rcgen::generate_simple_self_signed(names).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, pair.cert.pem()).unwrap();
        std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    #[test]
    fn over_tls_a_client_trusting_the_ca_is_served_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = certificate(dir.path());
        let tls = crate::TlsArgs {
            tls_cert: Some(cert.clone()),
            tls_key: Some(key),
        };
        let (addr, _stop) = start_with(limits(4, 1), tls.acceptor().unwrap());
        let client = |ca: Option<&std::path::Path>| -> ureq::Agent {
            ureq::Agent::config_builder()
                .tls_config(gpuledger_auth::tls::client_tls(ca).unwrap())
                .build()
                .into()
        };
        for host in ["localhost", "127.0.0.1"] {
            let url = format!("https://{host}:{}/small", addr.port());
            let answer = client(Some(&cert))
                .get(&url)
                .call()
                .unwrap()
                .body_mut()
                .read_to_string()
                .unwrap();
            assert_eq!(answer, "ok\n");
        }
        // The Mozilla roots do not vouch for a private certificate.
        let untrusted = client(None)
            .get(format!("https://localhost:{}/small", addr.port()))
            .call()
            .unwrap_err();
        assert!(
            untrusted.to_string().to_lowercase().contains("certificate"),
            "{untrusted}"
        );
        // Plain HTTP on the TLS port gets no answer, and frees its connection.
        let mut plain = std::net::TcpStream::connect(addr).unwrap();
        plain
            .write_all(b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut got = Vec::new();
        plain
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = plain.read_to_end(&mut got);
        assert!(!String::from_utf8_lossy(&got).contains("ok"), "{got:?}");
        // A client that opens a connection and never says hello is cut off at the header
        // time-out.
        let mut silent = std::net::TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        assert_eq!(read_until_closed(&mut silent), 0);
        assert!(started.elapsed() >= Duration::from_millis(900));
    }
}
