//! The accept loop every gpuledger HTTP service runs behind, so that no client can stall one:
//! at most `--max-connections` connections are served at once, and at most
//! `--max-connections-per-address` from one client address (a new connection past either limit
//! takes the place of an idle one, see [`crate::connections`], or is answered 503 and closed
//! when every one is in a request), a client must send a request's headers within `--header-timeout` (which also ends
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
use std::net::SocketAddr;
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
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

use crate::connections::{Activity, ClientKey, Refusal, Registry};
use crate::unread::close_when_body_unread;

/// How long connections still open at shutdown may take to finish their request.
const DRAIN: Duration = Duration::from_secs(30);

/// What a connection refused for a limit is told before it is closed: a whole HTTP answer.
fn refusal_answer(reason: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": format!("{reason}; try again shortly") }).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The limits, as options of every service command.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Most connections served at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Most connections from one client address (an IPv6 client: its /64) at once; past it a
    /// new connection takes the place of that address's oldest idle one, or is answered 503
    /// when all are in a request.
    #[arg(long, default_value_t = 128)]
    pub max_connections_per_address: usize,
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
            max_connections_per_address: 128,
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
    let router = router
        .layer(axum::middleware::from_fn_with_state(
            limits.request_timeout.0,
            request_deadline,
        ))
        .layer(axum::middleware::from_fn(close_when_body_unread));
    let registry = Registry::new(limits.max_connections_per_address, limits.max_connections);
    let refusals = Refusals::default();
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, most likely: wait rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let admitted = match registry.admit(ClientKey::of(peer.ip())) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                // A TLS client could not read a plain answer: it is just closed.
                refusals.refuse(&stream, peer, refusal, &limits, tls.is_none());
                continue;
            }
        };
        if admitted.displaced {
            refusals.count_displaced();
        }
        let router = router.clone();
        let stopped = stopped.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let slot = admitted.slot;
            serve_connection(stream, router, limits, tls, stopped, &slot.activity).await;
            drop(slot);
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
    activity: &Arc<Activity>,
) {
    let _ = stream.set_nodelay(true);
    let guarded = StallGuard::new(stream, limits.write_stall_timeout.0);
    let Some(acceptor) = tls else {
        return serve_http(guarded, router, limits, stopped, activity).await;
    };
    let handshake = tokio::time::timeout(limits.header_timeout.0, acceptor.accept(guarded));
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        () = activity.evicted() => return tracing::debug!("idle in its TLS handshake: displaced"),
    };
    match handshake {
        Ok(Ok(stream)) => serve_http(stream, router, limits, stopped, activity).await,
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake not finished within the header time-out"),
    }
}

async fn serve_http<S>(
    stream: S,
    router: Router,
    limits: HttpLimits,
    mut stopped: watch::Receiver<bool>,
    activity: &Arc<Activity>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(stream);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout.0);
    let router = TowerToHyperService::new(router);
    let counted = Arc::clone(activity);
    // A request counts from its headers until its answer is ready; the rest of the time the
    // connection is idle, and may be displaced.
    let service = hyper::service::service_fn(move |request| {
        let in_request = counted.begin_request();
        let answer = hyper::service::Service::call(&router, request);
        async move {
            let answer = answer.await;
            drop(in_request);
            answer
        }
    });
    let connection = builder.serve_connection(io, service);
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
        () = activity.evicted() => {
            if !activity.in_request() {
                return tracing::debug!("idle connection displaced");
            }
            // It began a request just as it was chosen: that request is answered first.
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

/// Connections refused for a limit: each is told so without waiting (the answer fits the
/// socket buffer), and the log says how many (and how many idle ones were displaced) at most
/// every ten seconds.
struct Refusals {
    service_full: Vec<u8>,
    client_full: Vec<u8>,
    count: AtomicU64,
    displaced: AtomicU64,
    last_logged: Mutex<Option<Instant>>,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            service_full: refusal_answer("too many connections"),
            client_full: refusal_answer("too many connections from your address"),
            count: AtomicU64::default(),
            displaced: AtomicU64::default(),
            last_logged: Mutex::default(),
        }
    }
}

impl Refusals {
    fn refuse(
        &self,
        stream: &TcpStream,
        peer: SocketAddr,
        refusal: Refusal,
        limits: &HttpLimits,
        answer: bool,
    ) {
        let (message, which, limit) = match refusal {
            Refusal::ClientFull => (
                &self.client_full,
                "per address",
                limits.max_connections_per_address,
            ),
            Refusal::ServiceFull => (&self.service_full, "in total", limits.max_connections),
        };
        if answer {
            let _ = stream.try_write(message);
        }
        let refused = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                %peer,
                limit,
                which,
                refused_total = refused,
                displaced_total = self.displaced.load(Ordering::Relaxed),
                "connection refused: every connection it could displace is in a request"
            );
        }
    }

    fn count_displaced(&self) {
        self.displaced.fetch_add(1, Ordering::Relaxed);
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
    use gpuledger_testkit::connect_from;
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
    fn start(limits: HttpLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        start_with(limits, None)
    }

    fn start_with(
        limits: HttpLimits,
        tls: Option<TlsAcceptor>,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
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
                    .route("/echo", post(|body: axum::body::Bytes| async move { body }))
                    .route(
                        "/refuse",
                        post(|| async { (StatusCode::FORBIDDEN, "refused from the headers\n") }),
                    );
                serve(listener, router, limits, tls, async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
            });
        });
        (addr_rx.recv().unwrap(), stop_tx)
    }

    fn small(addr: SocketAddr) -> String {
        small_from([127, 0, 0, 1], addr)
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

    /// What the server says to a new connection that sends nothing: its whole answer.
    fn answer_unasked(source: [u8; 4], addr: SocketAddr) -> String {
        read_answer(&mut connect_from(source, addr))
    }

    /// A 503's JSON error, checked to be a whole answer (its content-length is its body's).
    fn refusal_error(answer: &str) -> String {
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(head.contains("retry-after: 1"), "{answer}");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        error["error"].as_str().unwrap().to_owned()
    }

    /// A request whose body is still coming: its connection is in a request.
    fn busy_from(source: [u8; 4], addr: SocketAddr) -> std::net::TcpStream {
        let mut s = connect_from(source, addr);
        s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\nab")
            .unwrap();
        s
    }

    #[test]
    fn at_the_limit_an_idle_connection_gives_way_and_a_busy_one_does_not() {
        let (addr, _stop) = start(limits(2, 60));
        let mut first = connect_from([127, 0, 0, 1], addr);
        std::thread::sleep(Duration::from_millis(100));
        let second = connect_from([127, 0, 0, 2], addr);
        std::thread::sleep(Duration::from_millis(200));
        // Both idle: a third is served, and the oldest idle connection is closed for it.
        assert!(small_from([127, 0, 0, 3], addr).starts_with("HTTP/1.1 200"));
        assert_eq!(read_until_closed(&mut first), 0);
        // One in a request, one idle: the idle one gives way.
        let one = busy_from([127, 0, 0, 1], addr);
        std::thread::sleep(Duration::from_millis(200));
        let two = busy_from([127, 0, 0, 4], addr);
        std::thread::sleep(Duration::from_millis(200));
        let mut second = second;
        assert_eq!(read_until_closed(&mut second), 0);
        // Both in a request: a third is told 503, with a whole JSON answer.
        let busy = [one, two];
        let error = refusal_error(&answer_unasked([127, 0, 0, 3], addr));
        assert_eq!(error, "too many connections; try again shortly");
        drop(busy);
        std::thread::sleep(Duration::from_millis(200));
        assert!(small(addr).starts_with("HTTP/1.1 200"));
    }

    fn small_from(source: [u8; 4], addr: SocketAddr) -> String {
        let mut s = connect_from(source, addr);
        s.write_all(b"GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        read_answer(&mut s)
    }

    /// Everything the server sends until it closes, as text (ten seconds at most).
    fn read_answer(s: &mut std::net::TcpStream) -> String {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Holds `count` half-sent requests open from the `sources` in turn, opening a new one
    /// whenever the server closes one, until `stop`; returns how many the server closed.
    fn flood(
        addr: SocketAddr,
        sources: Vec<[u8; 4]>,
        count: usize,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let open = |k: usize| {
                let mut s = connect_from(sources[k % sources.len()], addr);
                let _ = s.write_all(b"GET /small HTTP/1.1\r\nhost: x\r\nx-slow: ");
                s.set_nonblocking(true).unwrap();
                s
            };
            let mut held: Vec<std::net::TcpStream> = (0..count).map(open).collect();
            let mut closed = 0;
            while !stop.load(Ordering::Relaxed) {
                for (k, s) in held.iter_mut().enumerate() {
                    let mut buf = [0; 256];
                    let gone = match s.read(&mut buf) {
                        Ok(_) => true,
                        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
                    };
                    if gone {
                        closed += 1;
                        *s = open(k);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            closed
        })
    }

    #[test]
    fn half_sent_requests_from_few_addresses_keep_no_other_client_out() {
        let (addr, _stop) = start(HttpLimits {
            max_connections: 8,
            max_connections_per_address: 4,
            ..limits(8, 60)
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Three times the total, from one address and then from three.
        for sources in [
            vec![[127, 0, 0, 1]],
            vec![[127, 0, 0, 1], [127, 0, 0, 2], [127, 0, 0, 3]],
        ] {
            stop.store(false, Ordering::Relaxed);
            let attacker = flood(addr, sources, 24, Arc::clone(&stop));
            std::thread::sleep(Duration::from_millis(300));
            for _ in 0..20 {
                let answer = small_from([127, 0, 0, 9], addr);
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            }
            stop.store(true, Ordering::Relaxed);
            let closed = attacker.join().unwrap();
            // The flood did reach the limits: the server kept closing its idle connections.
            assert!(closed >= 16, "only {closed} half-sent requests were closed");
        }
    }

    #[test]
    fn a_client_sharing_an_address_with_half_sent_requests_takes_the_place_of_one() {
        let (addr, _stop) = start(HttpLimits {
            max_connections: 8,
            max_connections_per_address: 4,
            ..limits(8, 60)
        });
        let mut held: Vec<std::net::TcpStream> = (0..12)
            .map(|_| {
                let mut s = connect_from([127, 0, 0, 1], addr);
                s.write_all(b"GET /small HTTP/1.1\r\nhost: x\r\nx-slow: ")
                    .unwrap();
                std::thread::sleep(Duration::from_millis(20));
                s
            })
            .collect();
        // Only the newest four still hold a place.
        for s in &mut held[..8] {
            assert_eq!(read_until_closed(s), 0);
        }
        for _ in 0..3 {
            assert!(small_from([127, 0, 0, 1], addr).starts_with("HTTP/1.1 200"));
        }
    }

    #[test]
    fn a_client_whose_connections_are_all_in_requests_is_refused_and_others_are_not() {
        let (addr, _stop) = start(HttpLimits {
            max_connections: 8,
            max_connections_per_address: 2,
            ..limits(8, 60)
        });
        let busy = [
            busy_from([127, 0, 0, 5], addr),
            busy_from([127, 0, 0, 5], addr),
        ];
        std::thread::sleep(Duration::from_millis(300));
        let error = refusal_error(&answer_unasked([127, 0, 0, 5], addr));
        assert_eq!(
            error,
            "too many connections from your address; try again shortly"
        );
        assert!(small_from([127, 0, 0, 6], addr).starts_with("HTTP/1.1 200"));
        drop(busy);
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
    fn an_answer_given_before_the_body_is_read_says_the_connection_closes_and_closes_it() {
        let (addr, _stop) = start(limits(4, 10));
        let mut refused = std::net::TcpStream::connect(addr).unwrap();
        refused
            .write_all(b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 20\r\n\r\n")
            .unwrap();
        // The whole answer, then the end of the connection (else a time-out fails the read).
        let answer = read_answer(&mut refused);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(head.contains("connection: close"), "{answer}");
        assert_eq!(body, "refused from the headers\n");

        // A body read to its end keeps the connection for the next request.
        let mut kept = std::net::TcpStream::connect(addr).unwrap();
        kept.write_all(
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc\
              GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        let answers = read_answer(&mut kept);
        let (first, second) = answers.split_once("abc").unwrap();
        assert!(first.starts_with("HTTP/1.1 200"), "{answers}");
        assert!(!first.contains("connection: close"), "{answers}");
        assert!(second.starts_with("HTTP/1.1 200"), "{answers}");
        assert!(second.ends_with("ok\n"), "{answers}");

        // So does a refusal of a request with no body.
        let mut empty = std::net::TcpStream::connect(addr).unwrap();
        empty
            .write_all(
                b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n\
                  GET /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            )
            .unwrap();
        let answers = read_answer(&mut empty);
        let (first, second) = answers.split_once("refused from the headers\n").unwrap();
        assert!(first.starts_with("HTTP/1.1 403"), "{answers}");
        assert!(!first.contains("connection: close"), "{answers}");
        assert!(second.starts_with("HTTP/1.1 200"), "{answers}");
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
