//! What `flashrt serve` adds to a step: the round trip of an openpi request over a loopback
//! websocket (server decode, key mapping, lock, step, reply encoding, client decode) against
//! the same step called in-process. Two policies are opened from the same checkpoint and the
//! two kinds of step alternate, so a machine whose speed drifts affects both alike.

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Bytes, Message, WebSocket};

use super::mapping::{KeyMap, Mapping};
use super::msgpack_numpy::{self as mpn, Leaf, Reply};
use super::{ServeConfig, Server};
use crate::error::{Error, Result};
use crate::image::{Frame, PixelFormat};
use crate::policy::{Observation, Policy, PolicyConfig, PolicyInfo};
use crate::stats::{Summary, summarize};

/// The measured latencies, and what one request weighs.
pub struct Overhead {
    pub in_process: Summary,
    pub served: Summary,
    /// Per request: its round trip less its own step in the server (the reply's
    /// `policy_timing.infer_ms`), i.e. what the server and the transport add, free of the step
    /// time's own spread.
    pub added: Summary,
    pub request_bytes: usize,
    pub info: PolicyInfo,
}

/// Request variants cycled through (fresh frames each step, prepared before timing).
const VARIANTS: usize = 4;

/// `warmup` then `iterations` alternating in-process steps and served requests: `views` cameras
/// of `size`×`size` RGB8 frames, a random state, `prompt`; the generic key map (each camera
/// under the policy's camera name, the state under `state`).
pub fn overhead(config: &PolicyConfig, views: usize, size: usize, prompt: &str, warmup: usize, iterations: usize) -> Result<Overhead> {
    let mut local = Policy::open(config)?;
    let served_policy = Policy::open(config)?;
    let info = local.info();
    let views = views.clamp(1, info.cameras.len());
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let frames: Vec<Vec<Vec<u8>>> =
        (0..VARIANTS).map(|_| (0..views).map(|_| (0..size * size * 3).map(|_| rng.random()).collect()).collect()).collect();
    let states: Vec<Vec<f32>> = (0..VARIANTS).map(|_| (0..info.state_dim).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
    let requests: Vec<Bytes> = (0..VARIANTS)
        .map(|v| {
            let mut entries: Vec<(&str, Reply)> = Vec::new();
            let arrays: Vec<Vec<u8>> = frames[v]
                .iter()
                .map(|f| {
                    let mut array = Vec::with_capacity(f.len() + 64);
                    mpn::write_u8_array(&mut array, f, &[size, size, 3]);
                    array
                })
                .collect();
            for (c, a) in arrays.iter().enumerate() {
                entries.push((&info.cameras[c], Reply::Raw(a)));
            }
            entries.push(("state", Reply::F32Array(&states[v], vec![info.state_dim])));
            entries.push(("prompt", Reply::Str(prompt)));
            Bytes::from(Reply::Map(entries).encode())
        })
        .collect();
    let request_bytes = requests[0].len();

    let mapping = Mapping::resolve(&KeyMap::generic(&info.cameras), &info.cameras, info.state_dim)?;
    let server = Server::bind(served_policy, mapping, ServeConfig::new("127.0.0.1:0"))?;
    let addr = server.local_addr()?;
    let stop = server.stopper();
    let serving = std::thread::spawn(move || server.run());
    let result = (|| {
        let (mut ws, _) =
            tungstenite::connect(format!("ws://{addr}")).map_err(|e| Error::Backend(format!("bench client: connect {addr}: {e}")))?;
        if let MaybeTlsStream::Plain(s) = ws.get_mut() {
            let _ = s.set_nodelay(true);
        }
        ws.read().map_err(|e| Error::Backend(format!("bench client: metadata: {e}")))?;
        local.set_prompt(prompt)?;
        let mut actions = vec![0.0; local.actions_len()];
        let (mut in_process, mut served, mut added) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..warmup + iterations {
            let v = i % VARIANTS;
            let cams: Vec<Option<Frame>> =
                (0..info.cameras.len()).map(|c| (c < views).then(|| Frame::packed(&frames[v][c], size, size, PixelFormat::Rgb8))).collect();
            let t = Instant::now();
            local.step(&Observation { cameras: &cams, state: &states[v], noise: None }, &mut actions)?;
            let local_ms = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let step_ms = round_trip(&mut ws, requests[v].clone(), actions.len())?;
            let served_ms = t.elapsed().as_secs_f64() * 1e3;
            if i >= warmup {
                in_process.push(local_ms / 1e3);
                served.push(served_ms / 1e3);
                added.push((served_ms - step_ms) / 1e3);
            }
        }
        let _ = ws.close(None);
        Ok((summarize(&in_process), summarize(&served), summarize(&added)))
    })();
    stop.store(true, Ordering::Relaxed);
    let summary = serving.join().map_err(|_| Error::Backend("bench server thread panicked".into()))??;
    let (in_process, served, added) = result?;
    log::info!("bench server: {summary:?}");
    Ok(Overhead { in_process, served, added, request_bytes, info })
}

/// Sends one request and decodes the reply's actions as a client must; returns the server's
/// step time for it (ms).
fn round_trip(ws: &mut WebSocket<MaybeTlsStream<TcpStream>>, request: Bytes, actions_len: usize) -> Result<f64> {
    let client = |e: tungstenite::Error| Error::Backend(format!("bench client: {e}"));
    let bad = |what: &str| Error::Backend(format!("bench client: the reply holds no {what}"));
    ws.send(Message::Binary(request)).map_err(client)?;
    let reply = match ws.read().map_err(client)? {
        Message::Binary(b) => b,
        Message::Text(t) => return Err(Error::Backend(format!("bench request refused: {t}"))),
        other => return Err(Error::Backend(format!("bench client: unexpected {other:?}"))),
    };
    let value = mpn::decode(&reply)?;
    let entries = mpn::entries(&value, "reply")?.unwrap_or_default();
    let get = |name: &str| entries.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    match get("actions").map(|v| mpn::leaf(v, "actions", usize::MAX)).transpose()? {
        Some(Leaf::Array(a)) if a.len() == actions_len => {}
        _ => return Err(bad("actions of the expected size")),
    }
    let timing = get("policy_timing").ok_or_else(|| bad("policy_timing"))?;
    let timing = mpn::entries(timing, "policy_timing")?.unwrap_or_default();
    match timing.iter().find(|(k, _)| *k == "infer_ms").map(|(_, v)| mpn::leaf(v, "infer_ms", 0)).transpose()? {
        Some(Leaf::Number(ms)) => Ok(ms),
        _ => Err(bad("policy_timing.infer_ms")),
    }
}
