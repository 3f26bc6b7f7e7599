//! Real-time setup for the thread that calls `Policy::step`: lock the process's memory, give the
//! thread a SCHED_FIFO priority and pin it to CPUs.
//!
//! `step` does not allocate, but a page fault on a swapped-out or never-touched page, or the
//! scheduler preferring a log shipper, still costs milliseconds at the wrong moment. Call
//! [`apply`] once, from the stepping thread, after `Policy::open` (so the weights are already
//! resident when `mlockall(MCL_CURRENT)` locks them, and the long open does not run at real-time
//! priority). Each setting is optional; a refusal names the capability or limit that is missing.

use std::io;

use crate::error::{Error, Result};

/// What [`apply`] should change; the default changes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RealtimeConfig {
    /// `mlockall(MCL_CURRENT | MCL_FUTURE)`: every page of the process stays in RAM.
    pub lock_memory: bool,
    /// SCHED_FIFO priority (1–99) for the calling thread; `None` keeps the current policy.
    pub fifo_priority: Option<i32>,
    /// CPUs the calling thread may run on (e.g. the cores isolated with `isolcpus`); empty keeps
    /// the current affinity.
    pub cpus: Vec<usize>,
}

impl RealtimeConfig {
    /// True when [`apply`] would change nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Applies `config` to the calling thread (affinity, priority) and the process (memory lock).
/// Stops at the first refusal; what was applied before it stays applied.
pub fn apply(config: &RealtimeConfig) -> Result<()> {
    if !config.cpus.is_empty() {
        set_affinity(&config.cpus)?;
        log::info!("stepping thread pinned to CPUs {:?}", config.cpus);
    }
    if config.lock_memory {
        // SAFETY: mlockall takes only flags and touches no memory of ours.
        if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
            return Err(mlock_error(io::Error::last_os_error()));
        }
        log::info!("process memory locked (mlockall MCL_CURRENT | MCL_FUTURE)");
    }
    if let Some(priority) = config.fifo_priority {
        set_fifo_priority(priority)?;
        log::info!("stepping thread runs SCHED_FIFO at priority {priority}");
    }
    Ok(())
}

fn set_affinity(cpus: &[usize]) -> Result<()> {
    // CPUs that exist, online or not: an index past them is a typo, not a hot-plug question.
    // SAFETY: sysconf has no memory effects.
    let configured = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(0);
    let limit = configured.clamp(1, libc::CPU_SETSIZE as usize);
    // SAFETY: cpu_set_t is a plain bit array; all zeros is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= limit {
            return Err(Error::invalid("realtime.cpus", format!("CPU {cpu} does not exist: this machine has CPUs 0..={}", limit - 1)));
        }
        // SAFETY: cpu < CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        let e = io::Error::last_os_error();
        let message = match e.raw_os_error() {
            // The set holds no CPU this process may use: offline, or outside its cpuset cgroup.
            Some(libc::EINVAL) => format!("none of CPUs {cpus:?} is online and allowed for this process (cgroup cpuset, taskset): {e}"),
            _ => format!("sched_setaffinity({cpus:?}): {e}"),
        };
        return Err(Error::invalid("realtime.cpus", message));
    }
    Ok(())
}

fn set_fifo_priority(priority: i32) -> Result<()> {
    // SAFETY: pure queries.
    let (min, max) = unsafe { (libc::sched_get_priority_min(libc::SCHED_FIFO), libc::sched_get_priority_max(libc::SCHED_FIFO)) };
    if !(min..=max).contains(&priority) {
        return Err(Error::invalid("realtime.fifo_priority", format!("SCHED_FIFO priority {priority} is outside {min}..={max}")));
    }
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: pthread_self() is the calling thread; `param` outlives the call.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(fifo_error(priority, io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

fn fifo_error(priority: i32, e: io::Error) -> Error {
    let message = match e.raw_os_error() {
        Some(libc::EPERM) => format!(
            "SCHED_FIFO priority {priority} refused ({e}): needs CAP_SYS_NICE or RLIMIT_RTPRIO >= {priority} \
             (systemd: LimitRTPRIO={priority}; shell: /etc/security/limits.conf rtprio; containers: --cap-add SYS_NICE)"
        ),
        _ => format!("SCHED_FIFO priority {priority}: {e}"),
    };
    Error::invalid("realtime.fifo_priority", message)
}

fn mlock_error(e: io::Error) -> Error {
    let message = match e.raw_os_error() {
        // EPERM: no capability and a zero limit; ENOMEM: the process is larger than the limit.
        Some(libc::EPERM | libc::ENOMEM) => format!(
            "mlockall refused ({e}): needs CAP_IPC_LOCK or RLIMIT_MEMLOCK above the process size \
             (systemd: LimitMEMLOCK=infinity; shell: ulimit -l unlimited)"
        ),
        _ => format!("mlockall: {e}"),
    };
    Error::invalid("realtime.lock_memory", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_changes_nothing() {
        assert!(RealtimeConfig::default().is_empty());
        apply(&RealtimeConfig::default()).unwrap();
    }

    // Tests run in their own threads, so changing the calling thread's affinity or policy does
    // not leak into other tests.
    #[test]
    fn pinning_to_cpu_0_works_everywhere() {
        apply(&RealtimeConfig { cpus: vec![0], ..Default::default() }).unwrap();
    }

    #[test]
    fn nonexistent_cpu_is_named() {
        let err = apply(&RealtimeConfig { cpus: vec![0, 100_000], ..Default::default() }).unwrap_err().to_string();
        assert!(err.contains("realtime.cpus") && err.contains("CPU 100000 does not exist"), "{err}");
    }

    #[test]
    fn out_of_range_priority_is_refused_before_any_syscall() {
        for priority in [0, 100] {
            let err = apply(&RealtimeConfig { fifo_priority: Some(priority), ..Default::default() }).unwrap_err().to_string();
            assert!(err.contains(&format!("priority {priority} is outside 1..=99")), "{err}");
        }
    }

    #[test]
    fn fifo_priority_works_or_names_the_missing_capability() {
        // As root (CI) this succeeds; unprivileged it must say what is missing.
        match apply(&RealtimeConfig { fifo_priority: Some(1), ..Default::default() }) {
            Ok(()) => {
                let param = libc::sched_param { sched_priority: 0 };
                // SAFETY: as in set_fifo_priority; back to the default policy for this thread.
                assert_eq!(unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_OTHER, &param) }, 0);
            }
            Err(e) => assert!(e.to_string().contains("CAP_SYS_NICE or RLIMIT_RTPRIO >= 1"), "{e}"),
        }
    }

    #[test]
    fn refusals_name_the_capability() {
        let eperm = || io::Error::from_raw_os_error(libc::EPERM);
        let fifo = fifo_error(80, eperm()).to_string();
        assert!(fifo.starts_with("invalid realtime.fifo_priority") && fifo.contains("CAP_SYS_NICE or RLIMIT_RTPRIO >= 80"), "{fifo}");
        for errno in [libc::EPERM, libc::ENOMEM] {
            let mlock = mlock_error(io::Error::from_raw_os_error(errno)).to_string();
            assert!(mlock.starts_with("invalid realtime.lock_memory") && mlock.contains("CAP_IPC_LOCK or RLIMIT_MEMLOCK"), "{mlock}");
        }
    }
}
