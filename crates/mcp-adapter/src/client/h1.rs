//! HTTP/1.1 connections to a plain-`http` upstream that the calling task drives itself.
//!
//! reqwest (hyper-util's pooled client) runs each connection in a task of its own, so a
//! request and its response cross tasks twice; on a two-core machine that is a wake-up of
//! the other worker thread each way, about 100 µs a call (measured against server-everything,
//! interleaved with reqwest on the same session). Here a connection is checked out of a pool
//! by the call, polled by the call's own task while it sends the request and reads the
//! response, and checked back in once the response body has ended. A connection whose
//! response was not read to its end is dropped (closed), never reused.
//!
//! Only for `http://` URLs with no proxy in the way (the direct path falls back to reqwest for
//! `https://` and for a configured proxy); no redirects are followed (a 3xx goes to rmcp,
//! whose client follows same-origin ones).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;
use http_body_util::Full;
use hyper::{
    Request, Response,
    body::{Body, Bytes, Incoming},
    client::conn::http1::{self, Connection, SendRequest},
    header::{HOST, HeaderMap, HeaderValue},
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::sync::lock;

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// Idle connections kept per upstream.
const MAX_IDLE: usize = 16;

/// How long a connection may sit idle before it is not used again. Servers close idle
/// connections after a while (Node and uvicorn after 5 s), and one closed just as a request
/// goes out leaves that request's outcome unknown: a connection idle this long is replaced
/// by a new one (a loopback connect costs about 100 µs) rather than risked.
const MAX_IDLE_AGE: Duration = Duration::from_secs(4);

/// One live connection: its request handle and the connection future the caller polls.
struct H1 {
    sender: SendRequest<Full<Bytes>>,
    conn: Pin<Box<Conn>>,
    /// The connection future has completed (the connection is closed).
    done: bool,
    /// When it was last put back idle.
    idle_since: std::time::Instant,
}

impl H1 {
    /// Drives the connection (reads and writes); true once it has closed.
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.done && self.conn.as_mut().poll(cx).is_ready() {
            self.done = true;
        }
        self.done
    }

    /// Whether the connection is still open and idle (polled once without waiting).
    fn alive(&mut self) -> bool {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        !self.poll_conn(&mut cx) && !self.sender.is_closed() && self.sender.is_ready()
    }
}

/// The pool of one upstream's connections.
pub(crate) struct Pool {
    /// `host:port`, to connect to and for the `Host` header.
    authority: String,
    host: HeaderValue,
    /// The request target (path and query).
    target: hyper::Uri,
    connect_timeout: Duration,
    /// [`MAX_IDLE_AGE`] (shorter in tests).
    max_idle_age: Duration,
    idle: Mutex<Vec<H1>>,
    /// Connections whose response body was dropped before its end (the caller had its
    /// answer): the rest of the body is read at the next checkout, without a task.
    draining: Mutex<Vec<(H1, Incoming)>>,
}

/// Whether an HTTP proxy is configured in the environment (reqwest would use it).
fn proxy_configured() -> bool {
    ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

impl Pool {
    /// A pool for `url`, if it is a plain-`http` URL with no proxy configured.
    pub(crate) fn for_url(url: &reqwest::Url, connect_timeout: Duration) -> Option<Arc<Pool>> {
        if url.scheme() != "http" || proxy_configured() {
            return None;
        }
        // `host_str` keeps an IPv6 address's brackets, as an authority needs them.
        let authority = format!("{}:{}", url.host_str()?, url.port_or_known_default()?);
        let host_header = match url.port() {
            Some(_) => authority.clone(),
            None => url.host_str()?.to_owned(),
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        Some(Arc::new(Pool {
            host: HeaderValue::from_str(&host_header).ok()?,
            target: path.parse().ok()?,
            authority,
            connect_timeout,
            max_idle_age: MAX_IDLE_AGE,
            idle: Mutex::new(Vec::new()),
            draining: Mutex::new(Vec::new()),
        }))
    }

    fn checkout(&self) -> Option<H1> {
        self.drain();
        let mut idle = lock(&self.idle);
        while let Some(mut h1) = idle.pop() {
            if h1.idle_since.elapsed() <= self.max_idle_age && h1.alive() {
                return Some(h1);
            }
        }
        None
    }

    /// Reads what has arrived of the parked bodies: a body that ended frees its connection,
    /// one that broke closes it, the rest wait for the next checkout.
    fn drain(&self) {
        let parked = std::mem::take(&mut *lock(&self.draining));
        if parked.is_empty() {
            return;
        }
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut still = Vec::new();
        for (mut h1, mut body) in parked {
            loop {
                let closed = h1.poll_conn(&mut cx);
                match Pin::new(&mut body).poll_frame(&mut cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(None) if !closed => {
                        self.checkin(h1);
                        break;
                    }
                    Poll::Ready(_) => break,
                    Poll::Pending if closed => break,
                    Poll::Pending => {
                        still.push((h1, body));
                        break;
                    }
                }
            }
        }
        let mut draining = lock(&self.draining);
        draining.extend(still);
        // A server that never ends its streams must not pile up connections.
        let excess = draining.len().saturating_sub(MAX_IDLE);
        draining.drain(..excess);
    }

    fn checkin(&self, mut h1: H1) {
        h1.idle_since = std::time::Instant::now();
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(h1);
        }
    }

    async fn connect(&self) -> Result<H1, Error> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.authority))
            .await
            .map_err(|_| Error::Connect(io::Error::from(io::ErrorKind::TimedOut)))?
            .map_err(Error::Connect)?;
        tcp.set_nodelay(true).map_err(Error::Connect)?;
        let (sender, conn) = http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| Error::Connect(io::Error::other(e)))?;
        Ok(H1 {
            sender,
            conn: Box::pin(conn),
            done: false,
            idle_since: std::time::Instant::now(),
        })
    }

    /// POSTs `body` with `headers` (and the pool's `Host`); the response's body is read
    /// through the returned stream, which returns the connection to the pool when the body
    /// ends.
    pub(crate) async fn post(
        self: &Arc<Self>,
        mut headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<(Response<()>, PooledBody), Error> {
        let body = Bytes::from(body);
        headers.insert(HOST, self.host.clone());
        let mut headers = Some(headers);
        let mut idle = self.checkout();
        let (h1, response) = loop {
            let reused = idle.is_some();
            let mut h1 = match idle.take() {
                Some(h1) => h1,
                None => self.connect().await?,
            };
            let mut request = Request::post(self.target.clone())
                .body(Full::new(body.clone()))
                .map_err(|e| Error::Request(io::Error::other(e)))?;
            // Copied only for the one resend below; the first send takes them.
            *request.headers_mut() = match (reused, headers.take()) {
                (true, Some(h)) => {
                    headers = Some(h.clone());
                    h
                }
                (_, Some(h)) => h,
                (_, None) => HeaderMap::new(),
            };
            let mut sent = std::pin::pin!(h1.sender.send_request(request));
            let error = match (Drive {
                h1: &mut h1,
                fut: sent.as_mut(),
            })
            .await
            {
                Ok(r) => break (h1, r),
                Err(Some(e)) => e,
                Err(None) => {
                    // The connection ended with the request still queued or in flight:
                    // dropping it settles which (queued: canceled, never sent).
                    drop(h1);
                    match futures::FutureExt::now_or_never(sent.as_mut()) {
                        Some(Err(e)) => e,
                        _ => {
                            return Err(Error::Request(io::Error::new(
                                io::ErrorKind::ConnectionAborted,
                                "the connection closed before the response",
                            )));
                        }
                    }
                }
            };
            // An idle connection the server closed as the request went out: the request
            // was never sent, so it goes again on a new connection (once).
            if reused && error.is_canceled() {
                continue;
            }
            return Err(Error::Request(io::Error::other(error)));
        };
        let (parts, body) = response.into_parts();
        Ok((
            Response::from_parts(parts, ()),
            PooledBody {
                h1: Some(h1),
                body: Some(body),
                pool: self.clone(),
                keep: Arc::default(),
            },
        ))
    }
}

/// Why a request on a pooled connection failed.
#[derive(Debug)]
pub(crate) enum Error {
    /// No connection could be made: the request never left.
    Connect(io::Error),
    /// The request failed after a connection was in hand: it may have been sent.
    Request(io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Connect(e) => write!(f, "connecting: {e}"),
            Error::Request(e) => write!(f, "{e}"),
        }
    }
}

/// Polls the connection alongside the request until the response head arrives.
struct Drive<'a, F> {
    h1: &'a mut H1,
    fut: F,
}

impl<F> Future for Drive<'_, F>
where
    F: Future<Output = hyper::Result<Response<Incoming>>> + Unpin,
{
    /// `Err(None)`: the connection closed and hyper gave no error for the request.
    type Output = Result<Response<Incoming>, Option<hyper::Error>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let closed = this.h1.poll_conn(cx);
        match Pin::new(&mut this.fut).poll(cx) {
            Poll::Ready(r) => Poll::Ready(r.map_err(Some)),
            Poll::Pending if closed => Poll::Ready(Err(None)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A response body read by the caller's task, which also drives its connection; the
/// connection goes back to the pool when the body ends, or is parked there to finish the body
/// when this is dropped first.
pub(crate) struct PooledBody {
    h1: Option<H1>,
    body: Option<Incoming>,
    pool: Arc<Pool>,
    /// Set by the reader once it has what it came for (see [`PooledBody::keeper`]).
    keep: Arc<std::sync::atomic::AtomicBool>,
}

impl PooledBody {
    /// The flag that lets a dropped body's connection be parked in the pool to finish the
    /// body. A reader sets it once it has its answer; a body dropped without it (a call
    /// that timed out or was cancelled while the server was still sending) closes its
    /// connection, so a server that never ends the stream holds no socket of Quiver's.
    pub(crate) fn keeper(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.keep.clone()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        if let (Some(h1), Some(body)) = (self.h1.take(), self.body.take())
            && !h1.done
            && self.keep.load(std::sync::atomic::Ordering::Acquire)
        {
            lock(&self.pool.draining).push((h1, body));
        }
    }
}

impl Stream for PooledBody {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let closed = this.h1.as_mut().is_some_and(|h1| h1.poll_conn(cx));
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => return Poll::Ready(Some(Ok(data))),
                    Err(_) => continue, // trailers
                },
                Poll::Ready(Some(Err(e))) => {
                    this.h1 = None;
                    return Poll::Ready(Some(Err(io::Error::other(e))));
                }
                Poll::Ready(None) => {
                    this.body = None;
                    if let Some(h1) = this.h1.take()
                        && !closed
                    {
                        this.pool.checkin(h1);
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending if closed => {
                    this.h1 = None;
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the connection closed before the response ended",
                    ))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A raw HTTP/1.1 server answering every POST with a chunked SSE body whose last chunk
    /// comes `end_after` after the first; counts the connections it accepted.
    async fn sse_server(end_after: Duration) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request: headers, then a body of content-length bytes.
                        let (head_end, len) = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                                let len = head
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length: "))
                                    .and_then(|v| v.trim().parse::<usize>().ok())
                                    .unwrap_or(0);
                                break (i + 4, len);
                            }
                            match tcp.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        while buf.len() < head_end + len {
                            match tcp.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..head_end + len);
                        let event = "data: {\"ok\":true}\n\n";
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                            event.len()
                        );
                        if tcp.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(end_after).await;
                        if tcp.write_all(b"0\r\n\r\n").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    #[tokio::test]
    async fn connections_are_reused_after_a_whole_body_and_after_a_parked_one() {
        let (url, accepted) = sse_server(Duration::from_millis(20)).await;
        let pool = Pool::for_url(&reqwest::Url::parse(&url).unwrap(), Duration::from_secs(5))
            .expect("a pool");
        let headers = HeaderMap::new();
        // Read to the end: the connection goes straight back.
        for _ in 0..3 {
            let (head, body) = pool
                .post(headers.clone(), b"{}".to_vec())
                .await
                .expect("answered");
            assert_eq!(head.status(), 200);
            let chunks: Vec<_> = body.collect().await;
            assert!(chunks.iter().all(Result::is_ok) && !chunks.is_empty());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Dropped after the first event (the caller had its answer): parked, and reused once
        // the rest of the body has arrived.
        let (_, mut body) = pool
            .post(headers.clone(), b"{}".to_vec())
            .await
            .expect("answered");
        assert!(body.next().await.expect("an event").is_ok());
        body.keeper().store(true, Ordering::Release);
        drop(body);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            pool.drain();
            if !pool.idle.lock().unwrap().is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the parked body never ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (_, body) = pool
            .post(headers.clone(), b"{}".to_vec())
            .await
            .expect("answered");
        let _: Vec<_> = body.collect().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the parked connection was reused"
        );
        // Dropped before the reader had what it came for (a call that timed out or was
        // cancelled): the connection is closed, not parked, and the next request makes a
        // new one.
        let (_, mut body) = pool
            .post(headers.clone(), b"{}".to_vec())
            .await
            .expect("answered");
        assert!(body.next().await.expect("an event").is_ok());
        drop(body);
        assert!(pool.draining.lock().unwrap().is_empty(), "not parked");
        let (_, body) = pool
            .post(headers.clone(), b"{}".to_vec())
            .await
            .expect("answered");
        let _: Vec<_> = body.collect().await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection");
    }

    /// A connection idle longer than the pool's limit is not used again (a server may be
    /// closing it as the request goes out); a fresh one is made.
    #[tokio::test]
    async fn a_connection_idle_too_long_is_replaced() {
        let (url, accepted) = sse_server(Duration::from_millis(1)).await;
        let mut pool = Pool::for_url(&reqwest::Url::parse(&url).unwrap(), Duration::from_secs(5))
            .expect("a pool");
        Arc::get_mut(&mut pool)
            .expect("not shared yet")
            .max_idle_age = Duration::from_millis(100);
        let call = || async {
            let (_, body) = pool
                .post(HeaderMap::new(), b"{}".to_vec())
                .await
                .expect("answered");
            let _: Vec<_> = body.collect().await;
        };
        call().await;
        call().await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "reused while fresh");
        tokio::time::sleep(Duration::from_millis(250)).await;
        call().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "replaced once idle too long"
        );
    }

    #[test]
    fn only_plain_http_urls_get_a_pool() {
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let t = Duration::from_secs(1);
        assert!(Pool::for_url(&url("https://example.com/mcp"), t).is_none());
        let p = Pool::for_url(&url("http://127.0.0.1:8080/mcp?x=1"), t).expect("a pool");
        assert_eq!(p.authority, "127.0.0.1:8080");
        assert_eq!(p.host, "127.0.0.1:8080");
        assert_eq!(p.target, "/mcp?x=1");
        let p = Pool::for_url(&url("http://[::1]:9/"), t).expect("a pool");
        assert_eq!(p.authority, "[::1]:9");
        let p = Pool::for_url(&url("http://example.com/mcp"), t).expect("a pool");
        assert_eq!(
            (p.authority.as_str(), p.host.to_str().unwrap()),
            ("example.com:80", "example.com")
        );
    }
}
