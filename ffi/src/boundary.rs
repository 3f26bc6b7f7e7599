//! The panic boundary around every export.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body`; a panic inside it is caught (it must not unwind into C, which aborts) and turned
/// into `on_panic`. Free of allocation when nothing panics.
pub(crate) fn guard<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(|| {
        #[cfg(debug_assertions)]
        debug_panic::fire();
        body()
    }))
    .unwrap_or(on_panic)
}

/// A way for the C tests to prove that every export has a boundary: arm, call any export, observe
/// `FRT_STATUS_PANIC` (or the documented fallback) and a process that is still alive. Compiled into
/// debug builds only, so no release library carries a switch that makes it panic; not in the
/// header either (cbindgen.toml excludes it).
#[cfg(debug_assertions)]
mod debug_panic {
    use std::cell::Cell;

    thread_local! {
        static ARMED: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) fn fire() {
        if ARMED.replace(false) {
            panic!("frt_debug_panic_next_call: injected panic");
        }
    }

    /// Debug builds only: the next `frt_*` call on this thread panics inside its boundary.
    #[unsafe(no_mangle)]
    pub extern "C" fn frt_debug_panic_next_call() {
        ARMED.set(true);
    }

    /// Debug builds only: the next step of `policy` that passes validation fails as a device
    /// failure would (`flashrt::Policy::inject_fault`), so the C tests can follow the policy into
    /// `FRT_STATUS_FAULTED`. Returns `FRT_STATUS_NULL_ARGUMENT` for NULL, `FRT_STATUS_BUSY` while
    /// another call holds the policy.
    ///
    /// # Safety
    /// `policy` from `frt_policy_open` (not freed) or NULL.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn frt_debug_fault_next_step(policy: *mut crate::FrtPolicy) -> crate::FrtStatus {
        // SAFETY: the caller's promise.
        unsafe { crate::policy::inject_fault(policy) }
    }
}
