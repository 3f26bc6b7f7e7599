//! `flashrt`: run, benchmark, inspect, serve and synthesize Pi0.5 and GR00T N1.7 policies; record
//! and replay the observations a policy steps on.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use flashrt::bench::{self, SyntheticInputs};
use flashrt::calibration::{self, CalibrationSettings};
use flashrt::compare;
use flashrt::image::{Frame, PixelFormat};
use flashrt::models::groot_n17::synth as groot_synth;
use flashrt::models::pi05::synth::{self, SynthSize};
use flashrt::observation_log::ObservationLogReader;
use flashrt::realtime::{self, RealtimeConfig};
use flashrt::serve::mapping::{KeyMap, Mapping};
use flashrt::serve::{self, ServeConfig, Server};
use flashrt::soak::{self, SoakConfig};
use flashrt::{BackendKind, Continuation, Observation, Policy, PolicyConfig, Precision, Result, RtcConfig, RtcSchedule};

#[derive(Parser)]
#[command(name = "flashrt", version, about = "Real-time inference runtime for vision-language-action robot policies")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Synthesize a tiny policy in a temporary directory and run it: the five-second tour.
    Demo {
        #[arg(long, default_value_t = 100)]
        steps: usize,
        #[arg(long, value_enum, default_value_t = Model::Pi05)]
        model: Model,
    },
    /// Open a checkpoint and run control steps at a target rate; print latency statistics.
    Run {
        #[command(flatten)]
        open: OpenArgs,
        #[command(flatten)]
        realtime: RealtimeArgs,
        /// Steps to run (default 100; with --observations, every record once, and a larger
        /// number replays the log in a loop).
        #[arg(long)]
        steps: Option<usize>,
        /// Control rate in Hz (0: as fast as possible).
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Task text (Pi0.5 appends the state each step); with --observations the records' own.
        #[arg(long, default_value = "pick up the red block and put it in the bowl")]
        prompt: String,
        /// Observation file (safetensors): `image.<slot>` u8 [H,W,3] RGB per present camera and
        /// `state` f32 [state_dim]. Default: random synthetic observations.
        #[arg(long, conflicts_with = "observations")]
        observation: Option<PathBuf>,
        /// Replay an observation log (`flashrt record`, `serve --record`, the ROS 2 node's
        /// `inputs.record_observations`, `frt_policy_record_start`): every record in order, with
        /// its prompt and noise. A log recorded for another model, camera count or state width is
        /// refused.
        #[arg(long, value_name = "FILE")]
        observations: Option<PathBuf>,
    },
    /// Benchmark the whole step and write JSON (DESIGN.md §8 field names).
    Bench {
        #[command(flatten)]
        open: OpenArgs,
        #[command(flatten)]
        realtime: RealtimeArgs,
        #[arg(long, default_value_t = 1000)]
        iterations: usize,
        #[arg(long, default_value_t = 10)]
        warmup: usize,
        /// Cameras present per step (the rest are passed as missing).
        #[arg(long, default_value_t = 2)]
        views: usize,
        /// Pi0.5: valid prompt tokens (random ids; the prompt capacity stays as configured).
        #[arg(long, default_value_t = 64)]
        prompt_tokens: usize,
        /// A task text instead of random ids (GR00T, whose prompt holds the image tokens, always
        /// takes a text: default a 20-word instruction).
        #[arg(long)]
        prompt: Option<String>,
        #[arg(long, default_value = "pi05-2v")]
        workload: String,
        /// Append the result to this JSON file (a list), or create it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Serve the policy over the openpi websocket protocol (`openpi_client.WebsocketClientPolicy`
    /// connects unchanged); SIGINT/SIGTERM stop it gracefully.
    Serve {
        #[command(flatten)]
        open: OpenArgs,
        #[command(flatten)]
        serve: ServeArgs,
        /// Record every observation the server steps on (with its prompt and noise) into this
        /// observation log, created or truncated; `flashrt run --observations FILE` replays it.
        #[arg(long, value_name = "FILE")]
        record: Option<PathBuf>,
    },
    /// `serve --record`: serve the policy and record every observation it steps on into a log.
    ///
    /// The same server as `flashrt serve` (openpi websocket protocol, the same options), writing
    /// every observation it steps on — the robot's own inputs, prompts and noise included — into
    /// an observation log, for FP8 calibration and regression tests (`flashrt run --observations
    /// FILE` replays it). SIGINT/SIGTERM or --max-requests stop it; the log is complete when it
    /// exits.
    Record {
        #[command(flatten)]
        open: OpenArgs,
        #[command(flatten)]
        serve: ServeArgs,
        /// The observation log to write (created or truncated).
        #[arg(long, value_name = "FILE")]
        observations: PathBuf,
    },
    /// Measure what `serve` adds to a step: openpi requests over a loopback websocket against the
    /// same steps in-process, alternating; JSON as `bench` writes it.
    BenchServe {
        #[command(flatten)]
        open: OpenArgs,
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        #[arg(long, default_value_t = 10)]
        warmup: usize,
        /// Cameras present per request.
        #[arg(long, default_value_t = 2)]
        views: usize,
        /// Frame side in pixels (square RGB8 frames).
        #[arg(long, default_value_t = 224)]
        size: usize,
        #[arg(long, default_value = "pick up the red block and put it in the bowl")]
        prompt: String,
        /// Append the result to this JSON file (a list), or create it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Soak: step for a bounded number of steps or seconds on inputs that change every step
    /// (frame sizes, formats, missing cameras, prompts) with bad observations mixed in, recording
    /// RSS, open descriptors, device memory, latency and errors per window; or, with
    /// `--open-close N`, open and drop the policy N times. Writes JSON (rewritten after every
    /// window, so a stopped run leaves what it measured).
    Soak {
        #[command(flatten)]
        open: OpenArgs,
        #[arg(long, default_value_t = 1_000_000)]
        steps: u64,
        /// Stop after this many seconds even if steps remain.
        #[arg(long, default_value_t = 3600.0)]
        max_seconds: f64,
        /// Steps per window (one sample of latency, memory and descriptors).
        #[arg(long, default_value_t = 10_000)]
        window: u64,
        /// Every this many steps a bad observation (or blank prompt) that must be refused; 0: none.
        #[arg(long, default_value_t = 10)]
        bad_every: u64,
        /// A new prompt (texts of 1 to ~40 tokens, in turn) every this many steps.
        #[arg(long, default_value_t = 100)]
        prompt_every: u64,
        /// Instead of stepping: open, step once and drop the policy this many times.
        #[arg(long)]
        open_close: Option<u64>,
        /// With --open-close: sample the process every this many cycles.
        #[arg(long, default_value_t = 10)]
        sample_every: u64,
        #[arg(long, default_value = "soak")]
        workload: String,
        /// Write the JSON record here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// FP8 calibration: run the policy on the CPU in f32 over observations, measure each
    /// product's input range and its error in FP8, and write the scales and the products that stay
    /// in bf16 as JSON keyed by the checkpoint's content hash, the plan and this runtime's version
    /// (open with `--precision fp8`). Give the options the deployment opens with (cameras, prompt
    /// capacity, denoise steps, real-time chunking): a calibration is only used for that plan.
    Calibrate {
        #[command(flatten)]
        open: OpenArgs,
        /// Observations whose activation ranges are taken.
        #[arg(long, default_value_t = CalibrationSettings::default().steps)]
        steps: usize,
        /// Of those, how many (the first) run again to measure each product's FP8 error.
        #[arg(long, default_value_t = CalibrationSettings::default().measure_steps)]
        measure_steps: usize,
        /// Products whose FP8 output strays further from f32 (normalized MSE) stay in bf16.
        #[arg(long, default_value_t = CalibrationSettings::default().max_product_nmse)]
        max_product_nmse: f64,
        /// Products with fewer input or output features stay in bf16.
        #[arg(long, default_value_t = CalibrationSettings::default().min_product_features)]
        min_product_features: usize,
        /// Products whose weight name starts with one of these prefixes stay in bf16 (a `*`
        /// stands for any run of characters: `vision.*.fc2`). Not given: the model's default
        /// (Pi0.5: its vision tower; GR00T N1.7: its backbone's language model); given with no
        /// prefix: none kept, every product that qualifies in FP8.
        #[arg(long, num_args = 0.., value_name = "PREFIX")]
        keep_bf16: Option<Vec<String>>,
        /// A recorded observation log (`flashrt record`, `serve --record`, the ROS 2 node's
        /// `inputs.record_observations`, `frt_policy_record_start`): the robot's own inputs.
        /// Without it: synthetic observations, with a warning that the scales fit random inputs.
        #[arg(long)]
        observations: Option<PathBuf>,
        /// Seed of the synthetic observations.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write the calibration here (default: flashrt_fp8_calibration.json beside the checkpoint,
        /// where an FP8 open looks for it).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Step this build of a checkpoint (its --backend and --precision, e.g. cuda and fp8) and a
    /// reference build of the same checkpoint (--reference-backend, --reference-precision) on
    /// the same observations with the same noise, and measure how far this one's actions are from
    /// the reference's (cosine, relative L2, max |Δ| per observation; mean and worst). Exits with
    /// an error when a given bound is missed: a regression test on the robot's own recordings.
    Compare {
        #[command(flatten)]
        open: OpenArgs,
        /// The reference's backend (default: this build's).
        #[arg(long, value_enum)]
        reference_backend: Option<Backend>,
        /// The reference's precision (auto: f32 on the CPU, bf16 on CUDA).
        #[arg(long, value_enum, default_value_t = PrecisionArg::Auto)]
        reference_precision: PrecisionArg,
        /// A recorded observation log (its records in order, each with its prompt and noise).
        /// Without it: synthetic observations (random frames on all, then fewer, of the cameras in turn,
        /// random states, three prompts in turn).
        #[arg(long, value_name = "FILE")]
        observations: Option<PathBuf>,
        /// Observations to compare (default: 32 synthetic, or every record of a log).
        #[arg(long)]
        count: Option<usize>,
        /// Seed of the synthetic observations and of the noise of those without recorded noise.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Fail unless the mean cosine is at least this.
        #[arg(long)]
        min_mean_cosine: Option<f64>,
        /// Fail unless every observation's cosine is at least this.
        #[arg(long)]
        min_cosine: Option<f64>,
        /// Fail unless every observation's relative L2 distance is at most this.
        #[arg(long)]
        max_rel_l2: Option<f64>,
        #[arg(long, default_value = "compare")]
        workload: String,
        /// Write the JSON record here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print sizes, parameter count, memory and the execution plan of a checkpoint.
    Inspect {
        #[command(flatten)]
        open: OpenArgs,
    },
    /// Compile every CUDA kernel ahead of time with NVRTC (no GPU needed) into DIR, named as the
    /// kernel cache names them: copy DIR into the target's `$XDG_CACHE_HOME/flashrt/kernels`.
    Kernels {
        /// GPU architecture: sm_87 (Orin), sm_90a (H100/H200; sm_90 with FRT_NO_WGMMA=1), sm_110 (Thor), ...
        #[arg(long)]
        arch: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a random checkpoint: Pi0.5 in the lerobot layout, GR00T N1.7 in the Hugging Face
    /// layout with its sidecar files and a byte-level tokenizer.
    Synth {
        #[arg(long, value_enum, default_value_t = Model::Pi05)]
        model: Model,
        #[arg(long, value_enum, default_value_t = SynthSize::Tiny)]
        size: SynthSize,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// GR00T N1.7: cameras of every embodiment (default 2: front, wrist; then camera_2, ...).
        #[arg(long)]
        cameras: Option<usize>,
        /// GR00T N1.7: embodiments with statistics, switchable at run time (default 1: robot;
        /// then robot_2, ...).
        #[arg(long)]
        embodiments: Option<usize>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Model {
    Pi05,
    #[value(name = "groot-n17")]
    GrootN17,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    Auto,
    F32,
    Bf16,
    Fp8,
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Args, Clone)]
struct OpenArgs {
    /// Checkpoint directory (lerobot layout) or .safetensors file.
    #[arg(long)]
    checkpoint: PathBuf,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// tokenizer.json (default: the one beside the checkpoint).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Camera slots (default: the cameras of config.json).
    #[arg(long)]
    cameras: Option<usize>,
    /// Prompt token slots (default: config.json `tokenizer_max_length`); a longer prompt is
    /// truncated, as in lerobot.
    #[arg(long)]
    prompt_capacity: Option<usize>,
    /// Compute the prefix for every prompt slot each step, instead of for the smallest bucket
    /// (32, 64, 128 slots or the capacity) that holds the prompt.
    #[arg(long)]
    no_prompt_buckets: bool,
    #[arg(long)]
    denoise_steps: Option<usize>,
    /// The robot's state width when the checkpoint does not state it.
    #[arg(long)]
    state_dim: Option<usize>,
    /// CPU backend: threads per step, this one included (default: the available parallelism).
    #[arg(long)]
    threads: Option<usize>,
    /// auto: f32 on the CPU, bf16 on CUDA. fp8: e4m3 products with a calibration (`flashrt
    /// calibrate`); on the CPU, an emulation of the GPU's FP8 numerics.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Auto)]
    precision: PrecisionArg,
    /// With --precision fp8: the calibration file (default: flashrt_fp8_calibration.json beside
    /// the checkpoint).
    #[arg(long)]
    fp8_calibration: Option<PathBuf>,
    /// GR00T: the embodiment tag (default: the checkpoint's only one).
    #[arg(long)]
    embodiment: Option<String>,
    /// Real-time chunking: continue the previous chunk. Pi0.5 guides towards it with a
    /// prefix-weight schedule (zeros, ones, linear, exp); GR00T N1.7 takes `ramp` (its own scheme:
    /// a frozen prefix with a velocity ramp).
    #[arg(long, value_parser = parse_schedule)]
    rtc: Option<RtcSchedule>,
    /// Real-time chunking: rows of a new chunk that continue the previous one at all.
    #[arg(long, default_value_t = RtcConfig::default().execution_horizon)]
    rtc_horizon: usize,
    /// Real-time chunking: upper bound of the guidance weight (Pi0.5's schedules; not `ramp`).
    #[arg(long, default_value_t = RtcConfig::default().max_guidance_weight)]
    rtc_max_guidance: f32,
    /// Real-time chunking in `run` and `bench`: actions of the previous chunk executed when each
    /// observation is taken, and actions executed while the step runs.
    #[arg(long, default_value_t = 5)]
    rtc_executed: usize,
    #[arg(long, default_value_t = 2)]
    rtc_delay: usize,
}

fn parse_schedule(s: &str) -> std::result::Result<RtcSchedule, String> {
    RtcSchedule::parse(s).ok_or_else(|| format!("{s:?}: expected zeros, ones, linear or exp (Pi0.5), or ramp (GR00T N1.7)"))
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (a robot on another machine needs 0.0.0.0 or the interface's).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free port; the address is printed as `listening on ws://...`).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Observation keys: `libero`, `aloha`, `droid` (openpi's examples) or a JSON file; default:
    /// each camera under the policy's camera name, `state`, `prompt`.
    #[arg(long)]
    keys: Option<String>,
    /// Print the key map in effect as JSON (a starting point for a file) and exit.
    #[arg(long)]
    print_keys: bool,
    /// Require the header `Authorization: Api-Key KEY` (openpi_client's `api_key=`).
    #[arg(long)]
    api_key: Option<String>,
    /// Connections served at once (a thread each); more are refused with HTTP 503.
    #[arg(long, default_value_t = 8)]
    max_connections: usize,
    /// Largest request message in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_message_bytes: usize,
    /// Largest numpy array in a request, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_array_bytes: usize,
    /// Task text for requests that carry none (openpi's ALOHA client sends no prompt).
    #[arg(long)]
    prompt: Option<String>,
    /// Stop after this many requests (for scripts and tests).
    #[arg(long)]
    max_requests: Option<u64>,
    /// When recording: free text kept in the observation log's header (robot, site, task).
    #[arg(long, default_value = "")]
    note: String,
}

/// Real-time setup of the stepping thread, applied after open (see `flashrt::realtime`).
#[derive(Args)]
struct RealtimeArgs {
    /// mlockall(MCL_CURRENT | MCL_FUTURE): needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK.
    #[arg(long)]
    mlock: bool,
    /// Run the stepping thread SCHED_FIFO at this priority (1-99): needs CAP_SYS_NICE or RLIMIT_RTPRIO.
    #[arg(long)]
    fifo_priority: Option<i32>,
    /// Pin the stepping thread to these CPUs (e.g. `--cpus 4,5`).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
}

impl RealtimeArgs {
    fn apply(&self) -> Result<()> {
        realtime::apply(&RealtimeConfig { lock_memory: self.mlock, fifo_priority: self.fifo_priority, cpus: self.cpus.clone() })
    }
}

impl OpenArgs {
    fn config(&self) -> PolicyConfig {
        let mut c = PolicyConfig::new(&self.checkpoint);
        c.backend = match self.backend {
            Backend::Auto => BackendKind::Auto,
            Backend::Cpu => BackendKind::Cpu,
            Backend::Cuda => BackendKind::Cuda,
        };
        c.tokenizer = self.tokenizer.clone();
        c.cameras = self.cameras;
        c.prompt_len = self.prompt_capacity;
        c.prompt_buckets = !self.no_prompt_buckets;
        c.denoise_steps = self.denoise_steps;
        c.state_dim = self.state_dim;
        c.threads = self.threads;
        c.precision = match self.precision {
            PrecisionArg::Auto => Precision::Auto,
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Fp8 => Precision::Fp8,
        };
        c.fp8_calibration = self.fp8_calibration.clone();
        c.embodiment = self.embodiment.clone();
        c.rtc = self.rtc.map(|schedule| RtcConfig {
            schedule,
            max_guidance_weight: self.rtc_max_guidance,
            execution_horizon: self.rtc_horizon,
        });
        c.progress = true;
        c
    }

    /// What each step of `run` and `bench` continues, under real-time chunking.
    fn continuation(&self) -> Option<Continuation> {
        self.rtc.map(|_| Continuation { executed: self.rtc_executed, inference_delay: self.rtc_delay })
    }
}

fn main() -> ExitCode {
    let started = Instant::now();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { steps, model } => demo(steps, model),
        Command::Run { open, realtime, steps, rate, prompt, observation, observations } => {
            let inputs = match (&observation, &observations) {
                (Some(path), _) => Inputs::File(path),
                (_, Some(path)) => Inputs::Log(path),
                (None, None) => Inputs::Synthetic,
            };
            Policy::open(&open.config()).and_then(|mut p| {
                realtime.apply()?;
                run(&mut p, steps, rate, &prompt, inputs, open.continuation())
            })
        }
        Command::Bench { open, realtime, iterations, warmup, views, prompt_tokens, prompt, workload, out } => {
            let prompt = BenchPrompt { tokens: prompt_tokens, text: prompt };
            bench_command(&open, &realtime, started, iterations, warmup, views, &prompt, &workload, out.as_deref())
        }
        Command::Serve { open, serve, record } => serve_command(&open, &serve, record.as_deref()),
        Command::Record { open, serve, observations } => serve_command(&open, &serve, Some(&observations)),
        Command::BenchServe { open, iterations, warmup, views, size, prompt, out } => {
            bench_serve(&open, iterations, warmup, views, size, &prompt, out.as_deref())
        }
        Command::Soak { open, steps, max_seconds, window, bad_every, prompt_every, open_close, sample_every, workload, out } => {
            let bound = Duration::from_secs_f64(max_seconds);
            match open_close {
                Some(cycles) => open_close_command(&open, cycles, sample_every, bound, &workload, out.as_deref()),
                None => {
                    let config = SoakConfig { steps, max_duration: bound, window, bad_every, prompt_every, seed: 0 };
                    soak_command(&open, &config, &workload, out.as_deref())
                }
            }
        }
        Command::Calibrate { open, steps, measure_steps, max_product_nmse, min_product_features, keep_bf16, observations, seed, out } => {
            let settings = CalibrationSettings {
                steps,
                measure_steps,
                max_product_nmse,
                min_product_features,
                keep_bf16,
                observations: String::new(),
            };
            calibrate_command(&open, &settings, observations.as_deref(), seed, out.as_deref())
        }
        Command::Compare {
            open,
            reference_backend,
            reference_precision,
            observations,
            count,
            seed,
            min_mean_cosine,
            min_cosine,
            max_rel_l2,
            workload,
            out,
        } => {
            let reference = ReferenceArgs { backend: reference_backend, precision: reference_precision };
            let bounds = CompareBounds { min_mean_cosine, min_cosine, max_rel_l2 };
            compare_command(&open, &reference, observations.as_deref(), count, seed, &bounds, &workload, out.as_deref())
        }
        Command::Inspect { open } => Policy::open(&open.config()).map(|p| inspect(&p)),
        Command::Synth { model, size, out, seed, cameras, embodiments } => synth_command(model, &out, size, seed, cameras, embodiments),
        Command::Kernels { arch, out } => {
            flashrt::cuda::write_kernels(&arch, &out).map(|paths| paths.iter().for_each(|p| println!("{}", p.display())))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `flashrt calibrate`: the policy on the CPU in f32, calibrated and written as JSON.
fn calibrate_command(open: &OpenArgs, settings: &CalibrationSettings, log: Option<&Path>, seed: u64, out: Option<&Path>) -> Result<()> {
    let mut config = open.config();
    if !matches!(open.backend, Backend::Auto | Backend::Cpu) || !matches!(open.precision, PrecisionArg::Auto | PrecisionArg::F32) {
        return Err(flashrt::Error::invalid("--backend/--precision", "calibration runs on the CPU backend in f32; leave both unset"));
    }
    (config.backend, config.precision) = (BackendKind::Cpu, Precision::F32);
    let mut policy = Policy::open(&config)?;
    let started = Instant::now();
    let result = match log {
        Some(log) => calibration::calibrate_log(&mut policy, settings, log)?,
        None => calibration::calibrate_synthetic(&mut policy, settings, seed)?,
    };
    let path = calibration::file_for(out, &open.checkpoint);
    result.save(&path)?;
    let (fp8, bf16) = result.counts();
    print!("{}", result.describe());
    println!(
        "calibrated {} steps ({} measured) in {:.1} s: {fp8} weights' products in FP8, {bf16} in bf16; wrote {}",
        result.settings.steps,
        result.settings.measure_steps,
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

/// The reference build of `flashrt compare`.
struct ReferenceArgs {
    backend: Option<Backend>,
    precision: PrecisionArg,
}

/// What `flashrt compare` must meet (unset: not checked).
#[derive(serde::Serialize)]
struct CompareBounds {
    min_mean_cosine: Option<f64>,
    min_cosine: Option<f64>,
    max_rel_l2: Option<f64>,
}

impl CompareBounds {
    /// The bounds `c` misses, in words (a NaN misses every bound).
    fn missed(&self, c: &compare::Comparison) -> Vec<String> {
        let mut missed = Vec::new();
        let mut check = |bound: Option<f64>, value: f64, ok: fn(f64, f64) -> bool, what: &str| {
            if let Some(bound) = bound
                && !ok(value, bound)
            {
                missed.push(format!("{what} {value:.6} (bound {bound})"));
            }
        };
        check(self.min_mean_cosine, c.mean_cosine, |v, b| v >= b, "mean cosine");
        check(self.min_cosine, c.worst_cosine, |v, b| v >= b, "worst cosine");
        check(self.max_rel_l2, c.worst_rel_l2, |v, b| v <= b, "worst rel-L2");
        missed
    }
}

/// `flashrt compare`: this build and the reference on the same observations and noise.
#[allow(clippy::too_many_arguments)] // the command's own options, one to one
fn compare_command(
    open: &OpenArgs,
    reference: &ReferenceArgs,
    log: Option<&Path>,
    count: Option<usize>,
    seed: u64,
    bounds: &CompareBounds,
    workload: &str,
    out: Option<&Path>,
) -> Result<()> {
    let mut candidate = Policy::open(&open.config())?;
    let reference_open = OpenArgs { backend: reference.backend.unwrap_or(open.backend), precision: reference.precision, ..open.clone() };
    let mut reference = Policy::open(&reference_open.config())?;
    let records = match log {
        Some(log) => compare::log_observations(&candidate, log, count)?,
        None => flashrt::synthetic::observations(&candidate, count.unwrap_or(32), seed),
    };
    let result = compare::compare(&mut candidate, &mut reference, &records, seed)?;
    println!(
        "{} {} against {} {}: {}",
        candidate.info().backend,
        candidate.info().precision,
        reference.info().backend,
        reference.info().precision,
        result.summary()
    );
    let groups = result.by_cameras();
    if groups.len() > 1 {
        for (cameras, group) in groups {
            println!("  with {cameras} camera{}: {}", if cameras == 1 { "" } else { "s" }, group.summary());
        }
    }
    let side = |p: &Policy| {
        let info = p.info();
        serde_json::json!({ "backend": info.backend, "precision": info.precision, "device": info.device })
    };
    let missed = bounds.missed(&result);
    let observations = match log {
        Some(log) => format!("log {}", log.display()),
        None => flashrt::synthetic::describe(&candidate, seed),
    };
    let mut fields = serde_json::to_value(&result).expect("json");
    fields.as_object_mut().expect("a struct serializes to an object").extend([
        ("candidate".to_string(), side(&candidate)),
        ("reference".to_string(), side(&reference)),
        ("observations_from".to_string(), observations.into()),
        ("bounds".to_string(), serde_json::to_value(bounds).expect("json")),
        ("pass".to_string(), missed.is_empty().into()),
    ]);
    write_record(policy_record(&candidate, workload), fields, out)?;
    match missed.as_slice() {
        [] => Ok(()),
        _ => Err(flashrt::Error::Backend(format!("compare: missed {}", missed.join(", ")))),
    }
}

fn demo(steps: usize, model: Model) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("flashrt-demo-{}", std::process::id()));
    println!("synthesizing a tiny {} checkpoint in {}", model.title(), dir.display());
    synthesize(model, &dir, SynthSize::Tiny, 0, &groot_synth::Options::default(), &|_| {})?;
    let result = Policy::open(&PolicyConfig::new(&dir)).and_then(|mut policy| {
        inspect_summary(&policy);
        run(&mut policy, Some(steps), 50.0, "pick up the red block and put it in the bowl", Inputs::Synthetic, None)
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

impl Model {
    fn title(self) -> &'static str {
        match self {
            Model::Pi05 => "Pi0.5",
            Model::GrootN17 => "GR00T N1.7",
        }
    }
}

/// A random checkpoint of `model` at `out` (GR00T with `options`); GR00T has no micro size.
fn synthesize(model: Model, out: &Path, size: SynthSize, seed: u64, options: &groot_synth::Options, progress: &dyn Fn(u64)) -> Result<()> {
    match (model, size) {
        (Model::Pi05, _) => synth::synthesize(out, size, seed, progress),
        (Model::GrootN17, SynthSize::Micro) => {
            Err(flashrt::Error::invalid("--size", "micro is a Pi0.5 size; GR00T N1.7 has tiny and full"))
        }
        (Model::GrootN17, SynthSize::Tiny) => groot_synth::synthesize_with(out, groot_synth::Size::Tiny, options, seed, progress),
        (Model::GrootN17, SynthSize::Full) => groot_synth::synthesize_with(out, groot_synth::Size::Full, options, seed, progress),
    }
}

fn inspect_summary(policy: &Policy) {
    let i = policy.info();
    println!(
        "model {} | backend {} ({}) on {} | {} cameras | state {} -> actions {}x{} | {} denoise steps | {:.2} M parameters | {:.1} MiB",
        i.model,
        i.backend,
        i.precision,
        i.device,
        i.cameras.len(),
        i.state_dim,
        i.horizon,
        i.action_dim,
        i.denoise_steps,
        i.parameters as f64 / 1e6,
        i.memory_bytes as f64 / (1 << 20) as f64
    );
}

fn inspect(policy: &Policy) {
    inspect_summary(policy);
    println!("{:#?}", policy.info().config);
    print!("{}", policy.explain());
}

/// Observation from a safetensors file (see `Run::observation`).
struct FileObservation {
    frames: Vec<Option<(Vec<u8>, usize, usize)>>,
    state: Vec<f32>,
}

fn read_observation(path: &Path, cameras: usize) -> Result<FileObservation> {
    let ckpt_err = |m: String| flashrt::Error::checkpoint(path, m);
    let bytes = std::fs::read(path).map_err(|source| flashrt::Error::Io { path: path.into(), source })?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| ckpt_err(format!("not a safetensors file: {e}")))?;
    let mut frames = Vec::with_capacity(cameras);
    for slot in 0..cameras {
        frames.push(match st.tensor(&format!("image.{slot}")) {
            Ok(t) if t.dtype() == safetensors::Dtype::U8 && t.shape().len() == 3 && t.shape()[2] == 3 => {
                Some((t.data().to_vec(), t.shape()[1], t.shape()[0]))
            }
            Ok(t) => return Err(ckpt_err(format!("image.{slot}: expected u8 [H,W,3], found {:?} {:?}", t.dtype(), t.shape()))),
            Err(_) => None,
        });
    }
    let state = st.tensor("state").map_err(|_| ckpt_err("missing tensor `state` (f32 [state_dim])".into()))?;
    if state.dtype() != safetensors::Dtype::F32 {
        return Err(ckpt_err(format!("state: expected f32, found {:?}", state.dtype())));
    }
    let state = state.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(FileObservation { frames, state })
}

/// Where `run` takes its observations from.
enum Inputs<'a> {
    /// Random frames and states.
    Synthetic,
    /// One observation from a safetensors file, every step (see `Run::observation`).
    File(&'a Path),
    /// The records of an observation log, in order.
    Log(&'a Path),
}

fn run(
    policy: &mut Policy,
    steps: Option<usize>,
    rate: f64,
    prompt: &str,
    inputs: Inputs,
    continuation: Option<Continuation>,
) -> Result<()> {
    let period = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let cameras = policy.info().cameras.len();
    let (file, mut replay) = match inputs {
        Inputs::Synthetic => (None, None),
        Inputs::File(path) => (Some(read_observation(path, cameras)?), None),
        Inputs::Log(path) => (None, Some(Replay::open(path, policy)?)),
    };
    if replay.is_none() {
        policy.set_prompt(prompt)?;
    }
    // A log runs once through unless told how many steps; anything else 100 steps.
    let limit = steps.or(if replay.is_some() { None } else { Some(100) });
    let synthetic = SyntheticInputs::new(policy, cameras, 224, 224, 4, 1).continuing(continuation);
    let mut actions = vec![0.0; policy.actions_len()];
    let mut next = Instant::now();
    let mut i = 0;
    while limit.is_none_or(|n| i < n) {
        match (&file, &mut replay) {
            (Some(obs), _) => {
                let frames: Vec<Option<Frame>> =
                    obs.frames.iter().map(|f| f.as_ref().map(|(d, w, h)| Frame::packed(d, *w, *h, PixelFormat::Rgb8))).collect();
                policy.step_continuing(&Observation { cameras: &frames, state: &obs.state, noise: None }, continuation, &mut actions)?;
            }
            (None, Some(replay)) => {
                if !replay.step(policy, continuation, &mut actions, limit.is_some())? {
                    break;
                }
            }
            (None, None) => {
                synthetic.step(policy, i, &mut actions)?;
            }
        }
        i += 1;
        if let Some(p) = period {
            next += p;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
    }
    let s = policy.stats().summary();
    println!("first action row: {:?}", &actions[..policy.info().action_dim]);
    if let Some(r) = &replay {
        println!("replayed {} records of {} ({} passes)", r.records, r.path.display(), r.passes);
    }
    println!(
        "{} steps{}: p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        s.count,
        period.map(|p| format!(" at {:.0} Hz", 1.0 / p.as_secs_f64())).unwrap_or_default(),
        s.p50_ms,
        s.p90_ms,
        s.p99_ms,
        s.max_ms
    );
    Ok(())
}

/// `run --observations`: the records of an observation log, read as they are stepped.
struct Replay {
    path: PathBuf,
    reader: ObservationLogReader,
    /// Index of the next record in the log.
    index: u64,
    /// Records in the log (known after the first pass).
    records: u64,
    /// Passes started through the log.
    passes: u64,
    /// The prompt the policy has from this log.
    prompt: Option<String>,
}

impl Replay {
    /// Opens the log and checks that `policy` can step its records.
    fn open(path: &Path, policy: &Policy) -> Result<Replay> {
        let reader = ObservationLogReader::open(path)?;
        reader.check_policy(&policy.info())?;
        Ok(Replay { path: path.into(), reader, index: 0, records: 0, passes: 1, prompt: None })
    }

    /// Steps `policy` on the next record (the first again at the end of the log when `wrap`);
    /// `false` at the end of the log otherwise.
    fn step(&mut self, policy: &mut Policy, continuation: Option<Continuation>, actions: &mut [f32], wrap: bool) -> Result<bool> {
        let record = match self.reader.next() {
            Some(record) => record?,
            None if self.index == 0 => {
                return Err(flashrt::Error::invalid(format!("observation log {}", self.path.display()), "it holds no records"));
            }
            None if !wrap => return Ok(false),
            None => {
                (self.reader, self.index, self.passes) = (ObservationLogReader::open(&self.path)?, 0, self.passes + 1);
                return self.step(policy, continuation, actions, wrap);
            }
        };
        // A record the policy refuses is named: the log's file and index, then the policy's words.
        let at = |e: flashrt::Error| flashrt::Error::invalid(format!("{} record {}", self.path.display(), self.index), e.to_string());
        if self.prompt.as_deref() != Some(&record.prompt) {
            policy.set_prompt(&record.prompt).map_err(at)?;
            self.prompt = Some(record.prompt.clone());
        }
        let frames = record.frames();
        policy.step_continuing(&record.observation(&frames), continuation, actions).map_err(at)?;
        self.index += 1;
        self.records = self.records.max(self.index);
        Ok(true)
    }
}

/// The benchmark's prompt: random ids of a length, or a text.
struct BenchPrompt {
    tokens: usize,
    text: Option<String>,
}

/// A 20-word instruction, the `gr00t-2v` workload's.
const BENCH_INSTRUCTION: &str =
    "pick up the red cup from the left side of the table and place it carefully inside the blue bowl near the robot";

#[allow(clippy::too_many_arguments)]
fn bench_command(
    open: &OpenArgs,
    realtime: &RealtimeArgs,
    started: Instant,
    iterations: usize,
    warmup: usize,
    views: usize,
    prompt: &BenchPrompt,
    workload: &str,
    out: Option<&Path>,
) -> Result<()> {
    let mut policy = Policy::open(&open.config())?;
    realtime.apply()?;
    let info = policy.info();
    let text = prompt.text.clone().or_else(|| (info.model == "groot-n17").then(|| BENCH_INSTRUCTION.to_string()));
    let prompt_tokens = match text {
        Some(text) => {
            policy.set_prompt(&text)?;
            let (inputs, mut actions) =
                (SyntheticInputs::new(&policy, views, 224, 224, 1, 1).continuing(open.continuation()), vec![0.0; policy.actions_len()]);
            inputs.step(&mut policy, 0, &mut actions)?.prompt_tokens
        }
        None => {
            // Random prompt ids of the requested length, BOS first.
            let ids: Vec<i32> = std::iter::once(2).chain((1..prompt.tokens).map(|i| 4 + (i as i32 * 7919) % 1000)).collect();
            policy.set_prompt_tokens(&ids)?;
            prompt.tokens
        }
    };
    let inputs = SyntheticInputs::new(&policy, views, 224, 224, 8, 1).continuing(open.continuation());
    let mut actions = vec![0.0; policy.actions_len()];
    inputs.step(&mut policy, 0, &mut actions)?;
    let cold_start = started.elapsed();
    let (summary, backend) = bench::run(&mut policy, &inputs, warmup, iterations)?;
    // The work of the prompt bucket these steps run (all slots without buckets).
    let plan = policy.plan();
    let gflop = plan.flops(plan.bucket_for(prompt_tokens.checked_sub(1))) as f64 / 1e9;
    let result = serde_json::json!({
        "workload": workload,
        "model": info.model,
        "device": info.device,
        "backend": info.backend,
        "precision": info.precision,
        "views": views,
        "prompt_tokens": prompt_tokens,
        "prompt_capacity": info.prompt_capacity,
        "steps": info.denoise_steps,
        "horizon": info.horizon,
        "iterations": iterations,
        "p50_ms": summary.p50_ms,
        "p90_ms": summary.p90_ms,
        "p99_ms": summary.p99_ms,
        "max_ms": summary.max_ms,
        // Of the step, the backend's run (a GPU: graph launch to completion); the rest is host
        // work. Its tail beside the step's says whether a slow step was slow on the device (or
        // waking from the wait) or in the host's own work around it.
        "backend_p50_ms": backend.p50_ms,
        "backend_p99_ms": backend.p99_ms,
        "backend_max_ms": backend.max_ms,
        "cold_start_s": cold_start.as_secs_f64(),
        "device_mem_mib": info.memory_bytes as f64 / (1 << 20) as f64,
        "gflop_per_step": gflop,
        // GFLOP per millisecond is TFLOP per second.
        "achieved_tflops": gflop / summary.p50_ms,
        "parameters": info.parameters,
        "commit": env!("FLASHRT_GIT_COMMIT"),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": bench::utc_now(),
    });
    print_and_append(result, out)
}

/// Prints a benchmark's JSON record and appends it to `out`, when given.
fn print_and_append(result: serde_json::Value, out: Option<&Path>) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&result).expect("a JSON value serializes"));
    match out {
        Some(path) => append_json(path, result),
        None => Ok(()),
    }
}

/// Appends `result` to the JSON list in `path` (a single object there becomes the list's first).
fn append_json(path: &Path, result: serde_json::Value) -> Result<()> {
    let io = |source| flashrt::Error::Io { path: path.into(), source };
    let mut list: Vec<serde_json::Value> = match std::fs::read_to_string(path) {
        Ok(text) => {
            match serde_json::from_str(&text).map_err(|e| flashrt::Error::invalid("--out", format!("{}: not JSON: {e}", path.display())))? {
                serde_json::Value::Array(items) => items,
                other => vec![other],
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(e)),
    };
    list.push(result);
    std::fs::write(path, serde_json::to_string_pretty(&list).expect("json") + "\n").map_err(io)
}

fn serve_command(open: &OpenArgs, args: &ServeArgs, record: Option<&Path>) -> Result<()> {
    let policy = Policy::open(&open.config())?;
    let info = policy.info();
    let keys = match &args.keys {
        Some(spec) => KeyMap::load(spec)?,
        None => KeyMap::generic(&info.cameras),
    };
    if args.print_keys {
        println!("{}", serde_json::to_string_pretty(&keys).expect("json"));
        return Ok(());
    }
    let mapping = Mapping::resolve(&keys, &info.cameras, info.state_dim)?;
    let host = if args.host.contains(':') { format!("[{}]", args.host) } else { args.host.clone() };
    let mut config = ServeConfig::new(format!("{host}:{}", args.port));
    config.api_key = args.api_key.clone();
    config.max_connections = args.max_connections;
    config.max_message_bytes = args.max_message_bytes;
    config.max_array_bytes = args.max_array_bytes;
    config.default_prompt = args.prompt.clone();
    config.max_requests = args.max_requests;
    config.record = record.map(Path::to_path_buf);
    config.record_note = args.note.clone();
    let server = Server::bind(policy, mapping, config)?;
    serve::install_signal_handlers()?;
    let addr = server.local_addr()?;
    // Scripts and tests read the address from this line (with --port 0 it is the only way).
    println!("listening on ws://{addr}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let s = server.run()?;
    println!(
        "served {} requests ({} refused with an error) on {} connections; {} handshakes refused",
        s.requests, s.errors, s.connections, s.refused
    );
    if let Some(path) = record {
        let r = s.recorded;
        println!("recorded {} observations to {} ({} dropped: the disk fell behind)", r.written, path.display(), r.dropped);
    }
    Ok(())
}

fn bench_serve(
    open: &OpenArgs,
    iterations: usize,
    warmup: usize,
    views: usize,
    size: usize,
    prompt: &str,
    out: Option<&Path>,
) -> Result<()> {
    let o = serve::bench::overhead(&open.config(), views, size, prompt, warmup, iterations.max(1))?;
    let (a, b) = (&o.served, &o.in_process);
    let result = serde_json::json!({
        "workload": "serve-overhead",
        "model": o.info.model,
        "device": o.info.device,
        "backend": o.info.backend,
        "precision": o.info.precision,
        "views": views,
        "image_size": size,
        "steps": o.info.denoise_steps,
        "horizon": o.info.horizon,
        "iterations": iterations,
        // The whole round trip of an openpi request through `flashrt serve` on loopback.
        "p50_ms": a.p50_ms,
        "p90_ms": a.p90_ms,
        "p99_ms": a.p99_ms,
        "max_ms": a.max_ms,
        // The same steps in-process, alternating with the requests.
        "in_process_p50_ms": b.p50_ms,
        "in_process_p90_ms": b.p90_ms,
        "in_process_p99_ms": b.p99_ms,
        "in_process_max_ms": b.max_ms,
        // Per request, its round trip less its own step in the server: what serving adds.
        "overhead_p50_ms": o.added.p50_ms,
        "overhead_p90_ms": o.added.p90_ms,
        "overhead_p99_ms": o.added.p99_ms,
        "overhead_max_ms": o.added.max_ms,
        "request_bytes": o.request_bytes,
        "transport": "websocket over loopback; Rust tungstenite client, requests encoded before timing, replies decoded inside it",
        "commit": env!("FLASHRT_GIT_COMMIT"),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": bench::utc_now(),
    });
    print_and_append(result, out)
}

/// The fields every soak and compare record shares (DESIGN.md §8 names), for `policy`.
fn policy_record(policy: &Policy, workload: &str) -> serde_json::Value {
    let info = policy.info();
    serde_json::json!({
        "workload": workload,
        "model": info.model,
        "device": info.device,
        "backend": info.backend,
        "precision": info.precision,
        "cameras": info.cameras.len(),
        "steps": info.denoise_steps,
        "horizon": info.horizon,
        "prompt_capacity": info.prompt_capacity,
        "commit": env!("FLASHRT_GIT_COMMIT"),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": bench::utc_now(),
    })
}

/// Writes `record` (an object) with `fields` merged in to `out`, replacing the file.
fn write_record(mut record: serde_json::Value, fields: serde_json::Value, out: Option<&Path>) -> Result<()> {
    if let (Some(r), serde_json::Value::Object(f)) = (record.as_object_mut(), fields) {
        r.extend(f);
    }
    match out {
        Some(path) => std::fs::write(path, serde_json::to_string_pretty(&record).expect("json") + "\n")
            .map_err(|source| flashrt::Error::Io { path: path.into(), source }),
        None => Ok(()),
    }
}

fn soak_command(open: &OpenArgs, config: &SoakConfig, workload: &str, out: Option<&Path>) -> Result<()> {
    let mut policy = Policy::open(&open.config())?;
    let record = policy_record(&policy, workload);
    let fields = |r: &soak::SoakReport| {
        let good: Vec<_> = r.windows.iter().filter(|w| w.good_steps > 0).collect();
        serde_json::json!({
            "iterations": r.steps,
            // Of the windows: the median window's p50, the worst window's p99 and max.
            "p50_ms": median(good.iter().map(|w| w.p50_ms)),
            "p99_ms": good.iter().map(|w| w.p99_ms).fold(0.0, f64::max),
            "max_ms": good.iter().map(|w| w.max_ms).fold(0.0, f64::max),
            "bad_every": config.bad_every,
            "prompt_every": config.prompt_every,
            "window": config.window,
            "report": r,
        })
    };
    let report = soak::steps(&mut policy, config, |r| {
        let w = r.windows.last().expect("called after a window");
        println!(
            "{:>9} steps {:>7.0} s | p50 {:.2} ms p99 {:.2} ms max {:.2} ms | RSS {:.1} MiB, {} fds{} | refused {} unexpected {}",
            w.steps,
            w.elapsed_s,
            w.p50_ms,
            w.p99_ms,
            w.max_ms,
            w.process.rss_mib,
            w.process.open_fds,
            w.process.device_mem_mib.map(|m| format!(", device {m:.0} MiB")).unwrap_or_default(),
            w.refused,
            w.unexpected
        );
        if let Err(e) = write_record(record.clone(), fields(r), out) {
            log::warn!("{e}");
        }
    })?;
    write_record(record, fields(&report), out)?;
    println!(
        "{} steps ({} good, {} bad refused, {} unexpected), stopped by {}",
        report.steps, report.good_steps, report.refused, report.unexpected, report.stopped_by
    );
    match report.unexpected {
        0 => Ok(()),
        n => Err(flashrt::Error::Backend(format!("soak: {n} unexpected outcomes, e.g. {:?}", report.unexpected_examples))),
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn open_close_command(open: &OpenArgs, cycles: u64, every: u64, bound: Duration, workload: &str, out: Option<&Path>) -> Result<()> {
    let mut config = open.config();
    config.progress = false;
    let record = policy_record(&Policy::open(&config)?, workload);
    let fields = |r: &soak::OpenCloseReport| serde_json::json!({ "iterations": r.cycles, "sample_every": every, "report": r });
    let report = soak::open_close(&config, cycles, every, bound, |r| {
        let s = r.samples.last().expect("called after a sample");
        println!(
            "{:>6} cycles {:>6.0} s | open {:.1} ms | RSS {:.1} MiB, {} fds{}",
            s.cycle + 1,
            s.elapsed_s,
            s.open_ms,
            s.process.rss_mib,
            s.process.open_fds,
            s.process.device_mem_mib.map(|m| format!(", device {m:.0} MiB")).unwrap_or_default()
        );
        if let Err(e) = write_record(record.clone(), fields(r), out) {
            log::warn!("{e}");
        }
    })?;
    write_record(record, fields(&report), out)?;
    println!("{} cycles, {} with different actions, stopped by {}", report.cycles, report.mismatched_actions, report.stopped_by);
    match report.mismatched_actions {
        0 => Ok(()),
        n => Err(flashrt::Error::Backend(format!("open/close: {n} cycles returned different actions for the same inputs"))),
    }
}

fn synth_command(model: Model, out: &Path, size: SynthSize, seed: u64, cameras: Option<usize>, embodiments: Option<usize>) -> Result<()> {
    let defaults = groot_synth::Options::default();
    let options =
        groot_synth::Options { cameras: cameras.unwrap_or(defaults.cameras), embodiments: embodiments.unwrap_or(defaults.embodiments) };
    if model == Model::Pi05 && (cameras.is_some() || embodiments.is_some()) {
        return Err(flashrt::Error::invalid("--cameras/--embodiments", "GR00T N1.7 options; a synthesized Pi0.5 has its own 3 cameras"));
    }
    let bytes = match (model, size) {
        (Model::GrootN17, SynthSize::Full) => groot_synth::Size::Full.data_bytes(),
        (Model::GrootN17, _) => groot_synth::Size::Tiny.data_bytes(),
        (Model::Pi05, _) => size.data_bytes(),
    };
    let bar = indicatif::ProgressBar::new(bytes);
    bar.set_style(
        indicatif::ProgressStyle::with_template("writing {bar:40} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    synthesize(model, out, size, seed, &options, &|n| bar.set_position(n))?;
    bar.finish_and_clear();
    println!("wrote a {size:?} {} checkpoint to {}", model.title(), out.display());
    Ok(())
}
