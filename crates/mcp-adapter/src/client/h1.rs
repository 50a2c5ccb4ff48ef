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
//! Only for `http://` URLs with no proxy in the way (the lean path falls back to reqwest for
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

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// Idle connections kept per upstream.
const MAX_IDLE: usize = 16;

/// One live connection: its request handle and the connection future the caller polls.
struct H1 {
    sender: SendRequest<Full<Bytes>>,
    conn: Pin<Box<Conn>>,
    /// The connection future has completed (the connection is closed).
    done: bool,
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
    idle: Mutex<Vec<H1>>,
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
        let host = url.host_str()?;
        let port = url.port_or_known_default()?;
        let authority = match url.host()? {
            url::Host::Ipv6(_) => format!("[{}]:{port}", host.trim_matches(['[', ']'])),
            _ => format!("{host}:{port}"),
        };
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
            idle: Mutex::new(Vec::new()),
        }))
    }

    fn checkout(&self) -> Option<H1> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(mut h1) = idle.pop() {
            if h1.alive() {
                return Some(h1);
            }
        }
        None
    }

    fn checkin(&self, h1: H1) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
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
        })
    }

    /// POSTs `body` with `headers`; the response's body is read through the returned stream,
    /// which returns the connection to the pool when the body ends.
    pub(crate) async fn post(
        self: &Arc<Self>,
        headers: &HeaderMap,
        body: Vec<u8>,
    ) -> Result<(Response<()>, PooledBody), Error> {
        let body = Bytes::from(body);
        let (mut h1, mut reused) = match self.checkout() {
            Some(h1) => (h1, true),
            None => (self.connect().await?, false),
        };
        let response = loop {
            let mut request = Request::post(self.target.clone())
                .body(Full::new(body.clone()))
                .map_err(|e| Error::Request(io::Error::other(e)))?;
            *request.headers_mut() = headers.clone();
            request.headers_mut().insert(HOST, self.host.clone());
            let sent = std::pin::pin!(h1.sender.send_request(request));
            match (Drive {
                h1: &mut h1,
                fut: sent,
            })
            .await
            {
                Ok(r) => break r,
                // An idle connection the server closed as the request went out: the request
                // was never sent, so it goes again on a new connection (once).
                Err(Some(e)) if reused && e.is_canceled() => {
                    h1 = self.connect().await?;
                    reused = false;
                }
                Err(Some(e)) => return Err(Error::Request(io::Error::other(e))),
                Err(None) => {
                    return Err(Error::Request(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the connection closed before the response",
                    )));
                }
            }
        };
        let (parts, body) = response.into_parts();
        Ok((
            Response::from_parts(parts, ()),
            PooledBody {
                h1: Some(h1),
                body,
                pool: self.clone(),
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
/// connection goes back to the pool when the body ends.
pub(crate) struct PooledBody {
    h1: Option<H1>,
    body: Incoming,
    pool: Arc<Pool>,
}

impl Stream for PooledBody {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let closed = this.h1.as_mut().is_some_and(|h1| h1.poll_conn(cx));
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => return Poll::Ready(Some(Ok(data))),
                    Err(_) => continue, // trailers
                },
                Poll::Ready(Some(Err(e))) => {
                    this.h1 = None;
                    return Poll::Ready(Some(Err(io::Error::other(e))));
                }
                Poll::Ready(None) => {
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
    use super::*;

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
