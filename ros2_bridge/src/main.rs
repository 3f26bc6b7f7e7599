//! `flashrt-ros2`: run a FlashRT policy as a ROS 2 node. See ros2_bridge/README.md.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use flashrt_ros2::config::{Cli, Config};

static STOP: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(flashrt_ros2::DEFAULT_LOG_FILTER)).init();
    let cli = Cli::parse();
    let config = match Config::load(&cli) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = std::io::stdout().write_all(config.to_toml().as_bytes());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = ctrlc::set_handler(|| STOP.store(true, Ordering::Relaxed)) {
        log::warn!("no SIGINT/SIGTERM handler ({e}): stop the node with SIGKILL or --run-for");
    }
    let run_for = (cli.run_for > 0.0).then(|| Duration::from_secs_f64(cli.run_for));
    match flashrt_ros2::node::run(&config, run_for, || STOP.load(Ordering::Relaxed)) {
        Ok(health) => {
            log::info!("stopped: {health}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
