//! `flashrt serve`: a policy server speaking the openpi websocket protocol, so that robot clients
//! and evaluation scripts written for openpi (`openpi_client.WebsocketClientPolicy`) run against
//! FlashRT unchanged.
//!
//! The protocol, as openpi's `src/openpi/serving/websocket_policy_server.py` serves it: on
//! connect the server sends its metadata (a msgpack map) as the first binary frame; then each
//! binary frame from the client is a msgpack-numpy observation, answered with a msgpack map
//! holding `actions` (float32 `[horizon, action_dim]`), `policy_timing` and `server_timing`.
//! An error is sent as a text frame (the client raises it as `RuntimeError`), after which the
//! server closes the connection with code 1011, as openpi does; the server itself keeps serving
//! every other connection and accepts new ones. The client's optional API key arrives as the
//! header `Authorization: Api-Key <key>`; a server started with `--api-key` refuses a handshake
//! without the right one (HTTP 401).
//!
//! Threads: one per connection (at most `max_connections`; further handshakes get HTTP 503),
//! sharing one [`Policy`] behind a mutex (a policy steps one observation at a time). Requests
//! are decoded and checked outside the lock; the lock covers the prompt change and the step.
//! Shutdown: [`install_signal_handlers`] (SIGINT, SIGTERM), [`Server::stopper`], or
//! `max_requests`. The server then stops accepting, answers every request that has already
//! arrived, closes each connection with code 1001 (going away) and returns.
//!
//! Recording ([`ServeConfig::record`], `flashrt serve --record` / `flashrt record`): every
//! observation the policy steps on successfully is handed, under the same lock and so in step
//! order, to a [`Recorder`], with the prompt of each request; a refused request records nothing.

pub mod bench;
pub mod mapping;
pub mod msgpack_numpy;

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tungstenite::handshake::HandshakeError;
use tungstenite::handshake::server::{ErrorResponse, Request as HttpRequest, Response as HttpResponse};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use self::mapping::{Limits, Mapping};
use self::msgpack_numpy::Reply;
use crate::error::{Error, Result};
use crate::image::{Frame, PixelFormat};
use crate::observation_log::{Recorder, RecorderStats};
use crate::policy::{Observation, Policy};

/// How the server listens and what it accepts.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to bind, e.g. `127.0.0.1:8000` (port 0: any free port; see [`Server::local_addr`]).
    pub addr: String,
    /// Required `Authorization: Api-Key <key>` header, if set.
    pub api_key: Option<String>,
    /// Connections served at once; each has its own thread.
    pub max_connections: usize,
    /// Largest websocket message (a whole observation), in bytes.
    pub max_message_bytes: usize,
    /// Largest data of one numpy array in a request, in bytes.
    pub max_array_bytes: usize,
    /// Task text for requests without a prompt key.
    pub default_prompt: Option<String>,
    /// Stop after this many requests (answered or refused): for tests and benchmarks.
    pub max_requests: Option<u64>,
    /// Record every observation stepped (prompt included) into this observation log
    /// (`flashrt::observation_log`), created at bind.
    pub record: Option<PathBuf>,
    /// The log header's note.
    pub record_note: String,
}

impl ServeConfig {
    pub fn new(addr: impl Into<String>) -> ServeConfig {
        ServeConfig {
            addr: addr.into(),
            api_key: None,
            max_connections: 8,
            // Four full-HD RGB frames and a state fit; an array up to one 1920x1080 frame, the
            // policy's default largest.
            max_message_bytes: 32 << 20,
            max_array_bytes: 8 << 20,
            default_prompt: None,
            max_requests: None,
            record: None,
            record_note: String::new(),
        }
    }
}

/// Counters of one server run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServeSummary {
    pub connections: u64,
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Handshakes refused (bad API key, too many connections, not a websocket).
    pub refused: u64,
    /// With [`ServeConfig::record`]: observations written to the log, and dropped because the
    /// disk fell behind.
    pub recorded: RecorderStats,
}

/// The policy, the prompt it has, its action buffer and the recording of what it steps on: what
/// one step needs under the lock.
struct Stepper {
    policy: Policy,
    prompt: Option<String>,
    actions: Vec<f32>,
    recorder: Option<Recorder>,
}

struct Shared {
    stepper: Mutex<Stepper>,
    mapping: Mapping,
    config: ServeConfig,
    metadata: Vec<u8>,
    action_shape: [usize; 2],
    stop: Arc<AtomicBool>,
    active: AtomicUsize,
    connections: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    refused: AtomicU64,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || SIGNALLED.load(Ordering::Relaxed)
    }
}

/// A bound server; [`Server::run`] serves until it is stopped.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

/// Set by SIGINT/SIGTERM once [`install_signal_handlers`] ran.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALLED.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM stop every running [`Server`] gracefully instead of killing the process.
pub fn install_signal_handlers() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a handler that only stores an atomic; no SA_RESTART, so
        // a blocking call sees EINTR and the loops re-check the flag.
        let ok = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut()) == 0
        };
        if !ok {
            return Err(Error::Backend(format!("sigaction({sig}) failed: {}", std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

/// How often idle loops look at the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping connection keeps answering requests that keep arriving.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

impl Server {
    /// Binds the address and prepares the metadata; `mapping` must have been resolved against
    /// this policy.
    pub fn bind(policy: Policy, mapping: Mapping, config: ServeConfig) -> Result<Server> {
        if config.max_connections == 0 {
            return Err(Error::invalid("max_connections", "must be at least 1"));
        }
        let listener = TcpListener::bind(&config.addr).map_err(|e| Error::invalid("serve address", format!("{}: {e}", config.addr)))?;
        listener.set_nonblocking(true).map_err(|e| Error::Backend(format!("listener: {e}")))?;
        let info = policy.info();
        let action_shape = [info.horizon, info.action_dim];
        let noise_shape = [info.horizon, policy.noise_len() / info.horizon.max(1)];
        let keys: Vec<Reply> = mapping.cameras().map(|(_, k)| k.map_or(Reply::Nil, Reply::Str)).collect();
        let metadata = Reply::Map(vec![
            ("server", Reply::Str("flashrt")),
            ("version", Reply::Str(env!("CARGO_PKG_VERSION"))),
            ("model", Reply::Str(info.model)),
            ("backend", Reply::Str(info.backend)),
            ("device", Reply::Str(&info.device)),
            ("cameras", Reply::List(info.cameras.iter().map(|c| Reply::Str(c)).collect())),
            ("camera_keys", Reply::List(keys)),
            ("state_keys", Reply::List(mapping.state_keys().iter().map(|k| Reply::Str(k)).collect())),
            ("prompt_key", mapping.prompt_key().map_or(Reply::Nil, Reply::Str)),
            ("noise_key", mapping.noise_key().map_or(Reply::Nil, Reply::Str)),
            ("state_dim", Reply::Int(info.state_dim as i64)),
            ("action_shape", Reply::List(action_shape.iter().map(|&d| Reply::Int(d as i64)).collect())),
            ("noise_shape", Reply::List(noise_shape.iter().map(|&d| Reply::Int(d as i64)).collect())),
        ])
        .encode();
        let actions = vec![0.0; policy.actions_len()];
        let recorder = config.record.as_ref().map(|path| Recorder::for_policy(path, &policy, &config.record_note)).transpose()?;
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                stepper: Mutex::new(Stepper { policy, prompt: None, actions, recorder }),
                mapping,
                config,
                metadata,
                action_shape,
                stop: Arc::new(AtomicBool::new(false)),
                active: AtomicUsize::new(0),
                connections: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|e| Error::Backend(format!("listener: {e}")))
    }

    /// A flag that stops the server when set (from any thread).
    pub fn stopper(&self) -> Arc<AtomicBool> {
        self.shared.stop.clone()
    }

    /// Serves until stopped; returns when every connection has closed.
    pub fn run(self) -> Result<ServeSummary> {
        let Server { listener, shared } = self;
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        while !shared.stopping() {
            match listener.accept() {
                Ok((stream, peer)) => {
                    threads.retain(|t| !t.is_finished());
                    if shared.active.load(Ordering::SeqCst) >= shared.config.max_connections {
                        shared.refused.fetch_add(1, Ordering::Relaxed);
                        log::warn!("refused {peer}: {} connections already open", shared.config.max_connections);
                        refuse_busy(stream, shared.config.max_connections);
                        continue;
                    }
                    shared.active.fetch_add(1, Ordering::SeqCst);
                    let conn = shared.clone();
                    let spawned = std::thread::Builder::new().name(format!("serve {peer}")).spawn(move || {
                        let _active = ActiveGuard(&conn.active);
                        connection(&conn, stream, peer);
                    });
                    match spawned {
                        Ok(t) => threads.push(t),
                        Err(e) => {
                            shared.active.fetch_sub(1, Ordering::SeqCst);
                            log::error!("cannot start a connection thread: {e}");
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => std::thread::sleep(POLL),
                Err(e) => {
                    log::warn!("accept: {e}");
                    std::thread::sleep(POLL);
                }
            }
        }
        drop(listener);
        log::info!("stopping: finishing {} open connection(s)", threads.iter().filter(|t| !t.is_finished()).count());
        for t in threads {
            let _ = t.join();
        }
        let recorder = shared.stepper.lock().unwrap_or_else(|e| e.into_inner()).recorder.take();
        Ok(ServeSummary {
            connections: shared.connections.load(Ordering::Relaxed),
            requests: shared.requests.load(Ordering::Relaxed),
            errors: shared.errors.load(Ordering::Relaxed),
            refused: shared.refused.load(Ordering::Relaxed),
            recorded: recorder.map(Recorder::finish).transpose()?.unwrap_or_default(),
        })
    }
}

struct ActiveGuard<'a>(&'a AtomicUsize);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers a connection over the limit with HTTP 503 without reading it (no thread for it).
fn refuse_busy(mut stream: TcpStream, max: usize) {
    let body = format!("flashrt serve: {max} connections already open\n");
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = write!(
        stream,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Whether the handshake carries the API key (always, without one). The comparison's time does
/// not depend on where the keys differ.
fn key_matches(expected: Option<&str>, request: &HttpRequest) -> bool {
    let Some(key) = expected else { return true };
    let given = request.headers().get("authorization").and_then(|v| v.to_str().ok());
    given
        .and_then(|g| g.strip_prefix("Api-Key "))
        .is_some_and(|g| g.len() == key.len() && g.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0)
}

// The handshake callback's error type is tungstenite's `Callback` signature.
#[allow(clippy::result_large_err)]
fn connection(shared: &Shared, stream: TcpStream, peer: SocketAddr) {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.set_read_timeout(Some(POLL)))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)));
    if let Err(e) = setup {
        log::warn!("{peer}: {e}");
        return;
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(shared.config.max_message_bytes))
        .max_frame_size(Some(shared.config.max_message_bytes));
    let api_key = shared.config.api_key.as_deref();
    let started = Instant::now();
    let check = |q: &HttpRequest, r: HttpResponse| {
        if key_matches(api_key, q) {
            return Ok(r);
        }
        let mut refusal =
            ErrorResponse::new(Some("flashrt serve: missing or wrong API key (header `Authorization: Api-Key <key>`)\n".into()));
        *refusal.status_mut() = tungstenite::http::StatusCode::UNAUTHORIZED;
        Err(refusal)
    };
    let mut attempt = tungstenite::accept_hdr_with_config(stream, check, Some(config));
    let mut ws = loop {
        match attempt {
            Ok(ws) => break ws,
            Err(HandshakeError::Interrupted(mid)) if started.elapsed() < HANDSHAKE_TIMEOUT && !shared.stopping() => {
                attempt = mid.handshake();
            }
            Err(HandshakeError::Interrupted(_)) => {
                log::warn!("{peer}: handshake not finished in time");
                shared.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(HandshakeError::Failure(e)) => {
                log::warn!("{peer}: handshake refused: {e}");
                shared.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    };
    shared.connections.fetch_add(1, Ordering::Relaxed);
    log::info!("{peer}: connected");
    if let Err(e) = ws.send(Message::binary(shared.metadata.clone())) {
        log::warn!("{peer}: sending metadata: {e}");
        return;
    }

    let mut prev_total_ms: Option<f64> = None;
    let mut draining: Option<Instant> = None;
    loop {
        if draining.is_none() && shared.stopping() {
            draining = Some(Instant::now());
        }
        if draining.is_some_and(|d| d.elapsed() > DRAIN_LIMIT) {
            break close(&mut ws, CloseCode::Away, "server shutting down");
        }
        let message = match ws.read() {
            Ok(m) => m,
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                // Idle: nothing has arrived. A stopping server closes here, every request that
                // arrived before having been answered.
                if draining.is_some() {
                    break close(&mut ws, CloseCode::Away, "server shutting down");
                }
                continue;
            }
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => break,
            Err(tungstenite::Error::Capacity(e)) => {
                count(shared, true);
                let text = format!("request refused: {e} (the server's limit is {} bytes per message)", shared.config.max_message_bytes);
                log::info!("{peer}: error: {text}");
                // tungstenite cannot read past a refused frame (its codec keeps the frame's header
                // and asserts on the next read): send the error and the close frame, then read the
                // rest of the oversized message away raw, so that the client can finish sending and
                // read the error instead of a reset connection.
                let close = CloseFrame { code: CloseCode::Size, reason: "message too big; the error is in the previous frame".into() };
                if ws.send(Message::text(text)).is_ok() && ws.close(Some(close)).is_ok() {
                    let _ = ws.flush();
                }
                break discard_input(ws.get_mut());
            }
            Err(e) => {
                log::warn!("{peer}: {e}");
                break;
            }
        };
        let received = Instant::now();
        let reply = match message {
            Message::Binary(bytes) => infer(shared, &bytes, prev_total_ms),
            Message::Text(_) => Err(Error::invalid("request", "a text frame; send the observation as a binary msgpack frame")),
            Message::Close(_) => continue,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
        };
        count(shared, reply.is_err());
        match reply {
            Ok(bytes) => {
                if let Err(e) = ws.send(Message::binary(bytes)) {
                    log::warn!("{peer}: sending actions: {e}");
                    break;
                }
                prev_total_ms = Some(received.elapsed().as_secs_f64() * 1e3);
            }
            // As openpi: the message as a text frame, then close (1011).
            Err(e) => break fail(&mut ws, peer, &e.to_string(), CloseCode::Error),
        }
    }
    log::info!("{peer}: closed");
}

/// Counts a request; the last of `max_requests` stops the server.
fn count(shared: &Shared, error: bool) {
    if error {
        shared.errors.fetch_add(1, Ordering::Relaxed);
    }
    let n = shared.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if shared.config.max_requests.is_some_and(|max| n >= max) {
        shared.stop.store(true, Ordering::Relaxed);
    }
}

fn fail(ws: &mut WebSocket<TcpStream>, peer: SocketAddr, text: &str, code: CloseCode) {
    log::info!("{peer}: error: {text}");
    if ws.send(Message::text(text.to_string())).is_ok() {
        close(ws, code, "error; the message is in the previous frame");
    }
}

/// Sends a close frame and waits (briefly) for the client's, so the client sees a clean close.
fn close(ws: &mut WebSocket<TcpStream>, code: CloseCode, reason: &str) {
    if ws.close(Some(CloseFrame { code, reason: reason.into() })).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match ws.read() {
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return,
        }
    }
}

/// Reads and drops what the client still sends, until it pauses (200 ms) or 5 s have passed.
fn discard_input(stream: &mut TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = Instant::now();
    while Instant::now() < deadline && last.elapsed() < Duration::from_millis(200) {
        match std::io::Read::read(stream, &mut buf) {
            Ok(0) => return,
            Ok(_) => last = Instant::now(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return,
        }
    }
}

/// One request: decode, map, step, encode the reply.
fn infer(shared: &Shared, bytes: &[u8], prev_total_ms: Option<f64>) -> Result<Vec<u8>> {
    let started = Instant::now();
    let value = msgpack_numpy::decode(bytes)?;
    let request = shared.mapping.parse(&value, Limits { max_array_bytes: shared.config.max_array_bytes })?;
    let prompt = request.prompt.or(shared.config.default_prompt.as_deref()).ok_or_else(|| {
        Error::invalid(
            format!("request[{:?}]", shared.mapping.prompt_key().unwrap_or("prompt")),
            "missing, and the server has no default prompt (--prompt)",
        )
    })?;
    let frames: Vec<Option<Frame>> =
        request.frames.iter().map(|f| f.as_ref().map(|i| Frame::packed(&i.data, i.width, i.height, PixelFormat::Rgb8))).collect();
    let obs = Observation { cameras: &frames, state: &request.state, noise: request.noise.as_deref() };

    // A panic elsewhere cannot leave the policy mid-step (step validates before it writes), so a
    // poisoned lock is still a usable policy.
    let mut guard = shared.stepper.lock().unwrap_or_else(|e| e.into_inner());
    let s = &mut *guard;
    if s.prompt.as_deref() != Some(prompt) {
        s.policy.set_prompt(prompt)?;
        s.prompt = Some(prompt.to_string());
        if let Some(r) = &mut s.recorder {
            r.set_prompt(prompt);
        }
    }
    let step = s.policy.step(&obs, &mut s.actions)?;
    if let Some(r) = &mut s.recorder {
        r.record(&obs);
    }
    let infer_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut timing = vec![("infer_ms", Reply::F64(infer_ms))];
    if let Some(prev) = prev_total_ms {
        timing.push(("prev_total_ms", Reply::F64(prev)));
    }
    let reply = Reply::Map(vec![
        ("actions", Reply::F32Array(&s.actions, shared.action_shape.to_vec())),
        ("policy_timing", Reply::Map(vec![("infer_ms", Reply::F64(step.latency.as_secs_f64() * 1e3))])),
        ("server_timing", Reply::Map(timing)),
    ]);
    Ok(reply.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(auth: Option<&str>) -> HttpRequest {
        let mut b = HttpRequest::builder().uri("ws://127.0.0.1:8000/");
        if let Some(a) = auth {
            b = b.header("Authorization", a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn api_key_must_match_exactly() {
        assert!(key_matches(None, &request(None)));
        assert!(key_matches(None, &request(Some("Api-Key anything"))));
        let key = Some("s3cret");
        assert!(key_matches(key, &request(Some("Api-Key s3cret"))));
        for wrong in [None, Some("Api-Key s3cre"), Some("Api-Key s3cret2"), Some("Bearer s3cret"), Some("s3cret"), Some("Api-Key S3cret")] {
            assert!(!key_matches(key, &request(wrong)), "{wrong:?} accepted");
        }
    }
}
