//! The io spec: which host buffers of a model's plan hold what, with their shapes and element
//! types. [`crate::Policy`] stages every observation through it — frames and their geometry,
//! noise, the action chunk out — and leaves the model's own inputs (a prompt, a normalized state)
//! to the model's [`crate::models::Processing`], so the policy needs no model by name.

use std::fmt::Write as _;

use crate::backend::Backend;
use crate::image::Frame;
use crate::plan::{BufId, BufType, FRAME_INFO_FIELDS, HostIo, Plan};
use crate::rtc::{Continuation, RtcConfig, prefix_weights, ramp_strength};

/// One named host buffer of the plan, seen as a row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Port {
    pub buf: BufId,
    pub name: String,
    pub ty: BufType,
    pub shape: Vec<usize>,
}

impl Port {
    /// Declares the plan buffer behind a port: `shape`'s product elements of `ty`.
    pub fn declare(plan: &mut Plan, name: &str, ty: BufType, shape: &[usize], host: HostIo) -> Port {
        let buf = plan.host_buffer(name, ty, shape.iter().product(), host);
        Port { buf, name: name.to_string(), ty, shape: shape.to_vec() }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The host inputs and outputs every policy has, and those its model's processing writes.
#[derive(Clone, Debug)]
pub struct IoSpec {
    /// `u8 [cameras, max height, max width, 4]`: each present frame's packed rows from the start
    /// of its slot (the plan reads them through `frame_info`'s geometry).
    pub frames: Port,
    /// `i32 [cameras, FRAME_INFO_FIELDS]`: present, width, height, pixel format per slot.
    pub frame_info: Port,
    /// `f32 [horizon, model action width]`: the sampler's initial noise.
    pub noise: Port,
    /// `f32 [horizon, action width]`: the plan's action chunk, from which the model's processing
    /// makes the robot's (Pi0.5's plan unnormalizes itself; GR00T's chunk is decoded on the host).
    pub actions: Port,
    /// Inputs the model's processing writes each step (Pi0.5: prompt tokens and their mask).
    pub model_inputs: Vec<Port>,
    /// Frames must be square: the image transform keeps their aspect ratio, and the token grid
    /// is sized for a square image (GR00T's albumentations path without its letterbox).
    pub square_frames: bool,
    /// Present when the plan guides its sampler by real-time chunking ([`crate::rtc`]).
    pub rtc: Option<RtcPorts>,
}

/// The host inputs of real-time chunking, written by [`crate::Policy`] every step.
#[derive(Clone, Debug)]
pub struct RtcPorts {
    pub config: RtcConfig,
    /// `f32 [horizon]`: each row's weight: a guidance schedule's prefix weight (all 0: no
    /// guidance), or under `Ramp` the velocity strength (all 1: plain sampling).
    pub weights: Port,
    /// `i32`: where the new chunk meets the previous one: for a guidance schedule `[1]`, the row
    /// of the previous chunk that row 0 of this one continues; under `Ramp` `[2]`, the first row
    /// of the previous chunk the new one starts from and how many rows it takes.
    pub shift: Port,
    /// Present under `Ramp`: what it needs beyond the config.
    pub ramp: Option<Ramp>,
}

/// What the `Ramp` scheme (GR00T N1.7) needs beyond [`RtcConfig`], from the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ramp {
    /// The velocity ramp's rate (`rtc_ramp_rate`).
    pub rate: f32,
    /// Rows of the chunk a step returns, which `Continuation::executed` counts in (the plan's
    /// horizon may be longer).
    pub chunk_rows: usize,
}

impl RtcPorts {
    /// The inputs of a plan of `horizon` rows; `ramp` must be given exactly for the `Ramp`
    /// schedule.
    pub fn declare(plan: &mut Plan, config: RtcConfig, horizon: usize, ramp: Option<Ramp>) -> RtcPorts {
        RtcPorts {
            config,
            weights: Port::declare(plan, "rtc_weights", BufType::F32, &[horizon], HostIo::Input),
            shift: Port::declare(plan, "rtc_shift", BufType::I32, &[if ramp.is_some() { 2 } else { 1 }], HostIo::Input),
            ramp,
        }
    }

    /// Writes the inputs of a step that continues the previous chunk at `continuation`, or
    /// samples afresh (`None`). Does not allocate.
    pub fn stage(&self, continuation: Option<Continuation>, backend: &mut dyn Backend) {
        let weights = backend.input_f32(self.weights.buf);
        let horizon = weights.len();
        let shift = match (continuation, self.ramp) {
            (Some(c), None) => {
                prefix_weights(&self.config, horizon, c, weights);
                [c.executed.min(horizon), 0]
            }
            (Some(c), Some(ramp)) => {
                let (first, rows) = ramp_strength(&self.config, ramp.chunk_rows, c, ramp.rate, weights);
                [first, rows]
            }
            // A fresh chunk: no guidance, every row at full velocity, no prefix.
            (None, ramp) => {
                weights.fill(if ramp.is_some() { 1.0 } else { 0.0 });
                [0, 0]
            }
        };
        let staged = backend.input_i32(self.shift.buf);
        staged.copy_from_slice(&shift.map(|v| v as i32)[..staged.len()]);
    }
}

impl IoSpec {
    /// The frame ports for `cameras` slots of frames up to `max_width × max_height`.
    pub fn frame_ports(plan: &mut Plan, cameras: usize, max_width: usize, max_height: usize) -> (Port, Port) {
        (
            Port::declare(plan, "frames", BufType::U8, &[cameras, max_height, max_width, 4], HostIo::Input),
            Port::declare(plan, "frame_info", BufType::I32, &[cameras, FRAME_INFO_FIELDS], HostIo::Input),
        )
    }

    pub fn cameras(&self) -> usize {
        self.frames.shape[0]
    }

    /// Every port, inputs first.
    pub fn ports(&self) -> impl Iterator<Item = (&'static str, &Port)> {
        [("input", &self.frames), ("input", &self.frame_info), ("input", &self.noise)]
            .into_iter()
            .chain(self.model_inputs.iter().map(|p| ("input", p)))
            .chain(self.rtc.iter().flat_map(|r| [("input", &r.weights), ("input", &r.shift)]))
            .chain([("output", &self.actions)])
    }

    /// The ports as text, one per line, for `explain()`.
    pub fn describe(&self) -> String {
        let mut s = String::from("io:\n");
        for (dir, p) in self.ports() {
            let _ = writeln!(s, "  {dir:<6} {:<12} {:?} {:?}", p.name, p.ty, p.shape);
        }
        s
    }

    /// Copies validated frames into the staging slots and writes their geometry; a missing camera
    /// gets an all-zero `frame_info` row. Does not allocate.
    pub fn stage_frames(&self, cameras: &[Option<Frame>], backend: &mut dyn Backend) {
        let slot_bytes: usize = self.frames.shape[1..].iter().product();
        for (cam, frame) in cameras.iter().enumerate() {
            let info = match frame {
                Some(f) => {
                    let row = f.width * f.format.bytes_per_pixel();
                    let staged = &mut backend.input_u8(self.frames.buf)[cam * slot_bytes..];
                    if f.stride == row {
                        staged[..row * f.height].copy_from_slice(&f.data[..row * f.height]);
                    } else {
                        for y in 0..f.height {
                            staged[y * row..][..row].copy_from_slice(&f.data[y * f.stride..][..row]);
                        }
                    }
                    [1, f.width as i32, f.height as i32, f.format as i32]
                }
                None => [0; FRAME_INFO_FIELDS],
            };
            backend.input_i32(self.frame_info.buf)[cam * FRAME_INFO_FIELDS..][..FRAME_INFO_FIELDS].copy_from_slice(&info);
        }
    }
}
