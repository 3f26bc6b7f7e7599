//! The ROS 2 side: one DDS participant and node, the subscriptions, the publishers, and the
//! threads that share [`Shared`]:
//!
//! - the calling thread receives: it waits on the subscriptions (mio) and hands each message to
//!   [`Intake`] (validate, copy into its slot, count), and the participant's status events to
//!   [`QosWatch`] (incompatible QoS per topic);
//! - chunk mode: `flashrt-infer` runs [`Inference::run_loop`], and `flashrt-publish` publishes
//!   each new chunk (trajectory + array) and the 1 Hz health report;
//! - stream mode: `flashrt-control` runs [`Control::tick`] at the control rate and publishes each
//!   tick's action itself, the stream's own thread (`flashrt-stream`) runs inference, and
//!   `flashrt-publish` sends only the health report.
//!
//! ros2-client / RustDDS allocate on both ends: every received sample is decoded into an owned
//! message (`Vec`s and `String`s), and every `publish` takes an owned message and serializes it
//! into a fresh buffer. Those allocations stay off the inference thread (in stream mode the
//! control thread publishes, and so allocates, once per tick).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use flashrt::observation_log::RecordingPolicy;
use ros2_client::dds::rustdds::mio1::{Events, Interest, Poll, Token};
use ros2_client::dds::rustdds::{DomainParticipantStatusListener, StatusEvented};
use ros2_client::{Context, ContextOptions, Name, Node, NodeName, NodeOptions, Publisher, Subscription};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::{Config, ConfigError, OutputMode, Qos, resolve_topic};
use crate::control::Control;
use crate::infer::{Inference, run_every};
use crate::intake::Intake;
use crate::msg::{Float32MultiArray, Float64MultiArray, Image, JointState, JointTrajectory, RosMessage, StringMsg};
use crate::output::{ChunkFormat, command};
use crate::qos_watch::{Endpoint, QosWatch};
use crate::shared::{Health, Shared, lock};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("policy: {0}")]
    Policy(#[from] flashrt::Error),
    #[error("ROS 2 / DDS: {0}")]
    Ros(String),
    #[error("real-time setup of the inference thread: {0}")]
    Realtime(flashrt::Error),
    #[error("node thread: {0}")]
    Thread(String),
}

fn dds_err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> NodeError + '_ {
    move |e| NodeError::Ros(format!("{what}: {e:?}"))
}

/// Opens the policy, joins the DDS domain and runs until `should_stop` returns true or `run_for`
/// has passed. Returns the final health report.
pub fn run(config: &Config, run_for: Option<Duration>, should_stop: impl Fn() -> bool) -> Result<serde_json::Value, NodeError> {
    config.check()?;
    let domain_id = config.domain_id()?;
    let policy = flashrt::Policy::open(&config.policy_config()?)?;
    let info = policy.info();
    config.check_policy(&info)?;
    log::info!(
        "policy {} on {} ({}): cameras [{}], state {}, action {} x {}",
        info.model,
        info.backend,
        info.device,
        info.cameras.join(", "),
        info.state_dim,
        info.horizon,
        info.action_dim
    );
    let actions_len = policy.actions_len();
    let mode = config.output.mode;
    let max_frame = (config.policy.max_frame_width as usize, config.policy.max_frame_height as usize);
    let shared = Arc::new(Shared::new(config.cameras.len(), max_frame, info.state_dim, actions_len, mode));

    let context = Context::with_options(ContextOptions::new().domain_id(domain_id)).map_err(dds_err("DDS participant"))?;
    let node_name = NodeName::new(&config.node.namespace, &config.node.name).map_err(dds_err("node name"))?;
    let fq_name = node_name.fully_qualified_name();
    // Parameters come from the file and flags; the node serves no parameter services and does
    // not log to /rosout (it logs to stderr).
    let mut node =
        context.new_node(node_name, NodeOptions::new().enable_rosout(false).start_parameter_services(false)).map_err(dds_err("node"))?;
    let mut dds = Ros { node: &mut node, namespace: &config.node.namespace, name: &config.node.name };

    let camera_topics: Vec<String> = config.cameras.iter().map(|c| dds.resolve(&c.topic)).collect();
    let n_cameras = camera_topics.len();
    let mut camera_subs = Vec::new();
    for topic in &camera_topics {
        camera_subs.push(dds.subscribe::<Image>(topic, config.qos.images)?);
    }
    // Inputs in order: cameras, joint states, prompt (as `Intake` and `Health::input` number them).
    let mut input_topics = camera_topics.clone();
    input_topics.push(dds.resolve(&config.joint_states.topic));
    input_topics.push(dds.resolve(&config.prompt.topic));
    let mut state_sub = dds.subscribe::<JointState>(&input_topics[n_cameras], config.qos.joint_states)?;
    let mut prompt_sub = dds.subscribe::<StringMsg>(&input_topics[n_cameras + 1], config.qos.prompt)?;
    // In `shared::outputs(mode)` order, the health report last.
    let o = &config.output;
    let output_topics: Vec<String> = match mode {
        OutputMode::Chunk => vec![&o.trajectory_topic, &o.action_chunk_topic, &o.health_topic],
        OutputMode::Stream => vec![&o.action_topic, &o.health_topic],
    }
    .into_iter()
    .map(|t| dds.resolve(t))
    .collect();
    let (chunks, action) = match mode {
        OutputMode::Chunk => {
            let chunks = ChunkOutputs {
                trajectory: dds.publish(&output_topics[0], config.qos.outputs)?,
                array: dds.publish(&output_topics[1], config.qos.outputs)?,
                format: ChunkFormat {
                    joint_names: config.joint_names(info.action_dim),
                    horizon: info.horizon,
                    action_dim: info.action_dim,
                    period: config.control_period(),
                    frame_id: config.output.frame_id.clone(),
                },
            };
            (Some(chunks), None)
        }
        OutputMode::Stream => (None, Some(dds.publish::<Float64MultiArray>(&output_topics[0], config.qos.outputs)?)),
    };
    let outputs = Outputs {
        chunks,
        health: dds.publish(&output_topics[output_topics.len() - 1], config.qos.outputs)?,
        node: fq_name.clone(),
        camera_topics: camera_topics.clone(),
        output_topics: output_topics.clone(),
    };
    log::info!(
        "{fq_name} on domain {domain_id}: cameras [{}], joint states {}, prompt {}, publishing {}",
        camera_topics.join(", "),
        input_topics[n_cameras],
        input_topics[n_cameras + 1],
        output_topics.join(", ")
    );
    // Every subscription and publisher by GUID, for the incompatible-QoS reports.
    let mut endpoints = Vec::new();
    for (i, sub) in camera_subs.iter().enumerate() {
        endpoints.push((sub.guid(), Endpoint::Input(i), input_topics[i].clone(), "qos.images"));
    }
    endpoints.push((state_sub.guid(), Endpoint::Input(n_cameras), input_topics[n_cameras].clone(), "qos.joint_states"));
    endpoints.push((prompt_sub.guid(), Endpoint::Input(n_cameras + 1), input_topics[n_cameras + 1].clone(), "qos.prompt"));
    let writers: Vec<_> = match (&outputs.chunks, &action) {
        (Some(c), _) => vec![c.trajectory.guid(), c.array.guid()],
        (None, Some(a)) => vec![a.guid()],
        (None, None) => vec![],
    };
    for (o, guid) in writers.into_iter().chain([outputs.health.guid()]).enumerate() {
        endpoints.push((guid, Endpoint::Output(o), output_topics[o].clone(), "qos.outputs"));
    }
    let qos_watch = QosWatch::new(endpoints, Duration::from_secs_f64(config.inputs.warn_interval_s));
    // The participant's status channel (matches, losses, incompatible QoS). Nothing else in the
    // node reads it: ros2-client's Spinner would, and the node runs none.
    let status = context.domain_participant().status_listener();

    let poll = Poll::new().map_err(dds_err("mio poll"))?;
    let n = camera_subs.len();
    for (i, sub) in camera_subs.iter_mut().enumerate() {
        poll.registry().register(sub, Token(i), Interest::READABLE).map_err(dds_err("register"))?;
    }
    poll.registry().register(&mut state_sub, Token(n), Interest::READABLE).map_err(dds_err("register"))?;
    poll.registry().register(&mut prompt_sub, Token(n + 1), Interest::READABLE).map_err(dds_err("register"))?;

    let infer_thread = match action {
        None => spawn_inference(Inference::new(policy, config)?, config, &shared)?,
        Some(action) => spawn_control(policy, action, config, &shared)?,
    };
    let publish_thread = {
        let shared = Arc::clone(&shared);
        thread::Builder::new()
            .name("flashrt-publish".into())
            .spawn(move || outputs.run(&shared, actions_len))
            .map_err(|e| NodeError::Thread(e.to_string()))?
    };

    let intake = Intake::new(&shared, config, input_topics);
    let status = Status { listener: status, watch: qos_watch, health: &shared.health };
    let result = receive(intake, status, poll, &camera_subs, &state_sub, &prompt_sub, run_for, should_stop);
    shared.stop();
    let infer_ok = infer_thread.join().is_ok();
    let publish_ok = publish_thread.join().is_ok();
    result?;
    if !(infer_ok && publish_ok) {
        return Err(NodeError::Thread("a node thread panicked".into()));
    }
    Ok(shared.health.report(&fq_name, &camera_topics, &output_topics, &shared.camera_ages(Instant::now())))
}

/// Chunk mode: the inference thread, with the real-time settings applied to it. It reports back
/// whether they took before the node goes on.
fn spawn_inference(inference: Inference, config: &Config, shared: &Arc<Shared>) -> Result<thread::JoinHandle<()>, NodeError> {
    let (applied_tx, applied_rx) = mpsc::sync_channel(1);
    let infer_thread = {
        let shared = Arc::clone(shared);
        let period = config.replan_period();
        let realtime = config.realtime();
        thread::Builder::new()
            .name("flashrt-infer".into())
            .spawn(move || {
                let applied = flashrt::realtime::apply(&realtime);
                let ok = applied.is_ok();
                let _ = applied_tx.send(applied);
                if ok {
                    inference.run_loop(&shared, period);
                }
            })
            .map_err(|e| NodeError::Thread(e.to_string()))?
    };
    if let Err(e) = applied_rx.recv().unwrap_or_else(|_| Err(flashrt::Error::Backend("the inference thread ended early".into()))) {
        shared.stop();
        let _ = infer_thread.join();
        return Err(NodeError::Realtime(e));
    }
    Ok(infer_thread)
}

/// Stream mode: the action stream over `policy` (its inference thread gets the real-time
/// settings; one the system refuses is logged and reported as `stream.realtime = false`) and the
/// control thread that publishes one action per tick on `action`.
fn spawn_control(
    mut policy: flashrt::Policy,
    action: Publisher<Float64MultiArray>,
    config: &Config,
    shared: &Arc<Shared>,
) -> Result<thread::JoinHandle<()>, NodeError> {
    if let Some(text) = &config.policy.prompt {
        policy.set_prompt(text)?;
    }
    // The stream's steps are recorded on its inference thread, as they are computed.
    let recorder = config.recorder(&policy)?;
    let mut control = Control::start(RecordingPolicy { policy, recorder }, config)?;
    let period = Duration::from_secs_f64(1.0 / config.stream_rate_hz());
    log::info!("stream mode: one action every {period:?}, the next chunk requested at {} actions left", control.stream().refill_at());
    let shared = Arc::clone(shared);
    thread::Builder::new()
        .name("flashrt-control".into())
        .spawn(move || {
            // Stopping drops the stream, which joins its inference thread.
            run_every(&shared, period, |now| {
                control.tick(&shared, now, |a| action.publish(command(a)));
            })
        })
        .map_err(|e| NodeError::Thread(e.to_string()))
}

struct Ros<'a> {
    node: &'a mut Node,
    namespace: &'a str,
    name: &'a str,
}

impl Ros<'_> {
    fn resolve(&self, topic: &str) -> String {
        resolve_topic(self.namespace, self.name, topic)
    }

    fn topic<M: RosMessage>(&mut self, resolved: &str, qos: Qos) -> Result<ros2_client::dds::rustdds::Topic, NodeError> {
        let name = Name::parse(resolved).map_err(|e| NodeError::Ros(format!("topic name {resolved:?}: {e:?}")))?;
        self.node.create_topic(&name, M::type_name(), &qos.profile()).map_err(|e| NodeError::Ros(format!("topic {resolved}: {e:?}")))
    }

    fn subscribe<M: RosMessage + 'static>(&mut self, resolved: &str, qos: Qos) -> Result<Subscription<M>, NodeError> {
        let topic = self.topic::<M>(resolved, qos)?;
        self.node.create_subscription(&topic, None).map_err(|e| NodeError::Ros(format!("subscription {resolved}: {e:?}")))
    }

    fn publish<M: RosMessage + Serialize>(&mut self, resolved: &str, qos: Qos) -> Result<Publisher<M>, NodeError> {
        let topic = self.topic::<M>(resolved, qos)?;
        self.node.create_publisher(&topic, None).map_err(|e| NodeError::Ros(format!("publisher {resolved}: {e:?}")))
    }
}

/// The participant's status events, for the incompatible-QoS reports.
struct Status<'a> {
    listener: DomainParticipantStatusListener,
    watch: QosWatch,
    health: &'a Health,
}

impl Status<'_> {
    /// Handles every status event waiting. Unread, the channel fills up (2048 events) and RustDDS
    /// drops what comes after.
    fn drain(&mut self, now: Instant) {
        while let Some(event) = self.listener.try_recv_status() {
            self.watch.handle(self.health, &event, now);
        }
    }
}

/// Waits on the subscriptions and hands every message to `intake`, and the participant's status
/// events to `status`, until `should_stop` or the end of `run_for`.
#[allow(clippy::too_many_arguments)]
fn receive(
    mut intake: Intake,
    mut status: Status,
    mut poll: Poll,
    cameras: &[Subscription<Image>],
    state: &Subscription<JointState>,
    prompt: &Subscription<StringMsg>,
    run_for: Option<Duration>,
    should_stop: impl Fn() -> bool,
) -> Result<(), NodeError> {
    let deadline = run_for.map(|d| Instant::now() + d);
    let n = cameras.len();
    let mut events = Events::with_capacity(n + 2);
    while !should_stop() && deadline.is_none_or(|d| Instant::now() < d) {
        // A bounded wait, so that stop requests and the deadline are seen.
        match poll.poll(&mut events, Some(Duration::from_millis(100))) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(NodeError::Ros(format!("mio poll: {e}"))),
        }
        // At least every 100 ms (the poll's bound): status events are rare, and need no wake-up
        // of their own.
        status.drain(Instant::now());
        for event in events.iter() {
            let Token(i) = event.token();
            let now = Instant::now();
            if i < n {
                drain(&cameras[i], |msg| intake.camera(i, msg, now));
            } else if i == n {
                drain(state, |msg| intake.joint_state(msg, now));
            } else {
                drain(prompt, |msg| intake.prompt(msg, now));
            }
        }
    }
    Ok(())
}

/// Takes every sample waiting on `sub` (readiness events are edge-triggered), and every decode
/// error in their place, and hands each to `handle`.
fn drain<M: DeserializeOwned + 'static>(sub: &Subscription<M>, mut handle: impl FnMut(Result<M, ros2_client::ReadError>)) {
    loop {
        match sub.take() {
            Ok(Some((msg, _info))) => handle(Ok(msg)),
            Ok(None) => break,
            // RustDDS advances past a sample it cannot decode, so the loop still ends.
            Err(e) => handle(Err(e)),
        }
    }
}

/// Chunk mode's chunk publishers.
struct ChunkOutputs {
    trajectory: Publisher<JointTrajectory>,
    array: Publisher<Float32MultiArray>,
    format: ChunkFormat,
}

struct Outputs {
    /// Chunk mode only: in stream mode the control thread publishes the actions.
    chunks: Option<ChunkOutputs>,
    health: Publisher<StringMsg>,
    node: String,
    camera_topics: Vec<String>,
    output_topics: Vec<String>,
}

impl Outputs {
    /// Publishes each new chunk once (chunk mode), and the health report every second, until
    /// stopped.
    fn run(self, shared: &Shared, actions_len: usize) {
        let mut actions = vec![0.0; actions_len];
        let mut seen = 0;
        let mut next_health = Instant::now() + Duration::from_secs(1);
        loop {
            let mut out = lock(&shared.output);
            while out.seq == seen && !shared.stopping() && Instant::now() < next_health {
                let wait = next_health.saturating_duration_since(Instant::now());
                out = shared.output_ready.wait_timeout(out, wait).unwrap_or_else(|e| e.into_inner()).0;
            }
            if shared.stopping() {
                return;
            }
            let fresh = (out.seq != seen).then(|| {
                actions.copy_from_slice(&out.actions);
                seen = out.seq;
                out.stamp
            });
            drop(out);
            if let (Some(stamp), Some(c)) = (fresh, &self.chunks) {
                let trajectory = c.trajectory.publish(c.format.trajectory(&actions, stamp)).map_err(|e| e.to_string());
                let array = c.array.publish(c.format.array(&actions));
                match trajectory.and(array.map_err(|e| e.to_string())) {
                    Ok(()) => _ = shared.health.published.fetch_add(1, Relaxed),
                    Err(e) => log::warn!("publishing the action chunk failed: {e}"),
                }
            }
            if Instant::now() >= next_health {
                next_health += Duration::from_secs(1);
                let report =
                    shared.health.report(&self.node, &self.camera_topics, &self.output_topics, &shared.camera_ages(Instant::now()));
                if let Err(e) = self.health.publish(StringMsg { data: report.to_string() }) {
                    log::warn!("publishing health failed: {e}");
                }
            }
        }
    }
}
