//! Status codes, their messages, the per-thread last error and the library version.

use std::cell::RefCell;
use std::ffi::c_char;

use crate::boundary::guard;

/// Result of every fallible function. The numbers are stable: a value is never renumbered and a
/// retired value is never reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtStatus {
    /// Success.
    Ok = 0,
    /// A pointer argument (or a pointer field of a struct argument) that must not be NULL was NULL.
    NullArgument = 1,
    /// An argument or struct field has a wrong value; the last error (`frt_policy_last_error`, or
    /// `frt_last_error` for calls without a mutable policy) names the field.
    InvalidArgument = 2,
    /// The caller's text buffer cannot hold the text and its NUL; the buffer is untouched and
    /// `*written` holds the text length (the size needed is that plus one for the NUL).
    BufferTooSmall = 3,
    /// A file could not be read or written (missing checkpoint or tokenizer file, permission
    /// denied, an observation log that cannot be created or written, ...).
    Io = 4,
    /// The checkpoint (weights, config.json, normalization statistics) is unusable.
    Checkpoint = 5,
    /// No tokenizer is loaded (text prompt without tokenizer.json), or the tokenizer file was read
    /// but is unusable (not tokenizer JSON, no `<bos>`, cannot assemble Pi0.5 prompts).
    Tokenizer = 6,
    /// The requested backend or precision cannot run here (no GPU, no driver, a precision the
    /// backend does not compute in, e.g. FP8 or bf16 on the CPU).
    Backend = 7,
    /// An internal error (a Rust panic) was caught at the ABI boundary. This is a bug in FlashRT;
    /// free the policy involved, its state may be inconsistent.
    Panic = 8,
    /// Another call on the same `FrtPolicy*` was running (two threads used one policy at once,
    /// against the one-thread-at-a-time rule). This call did nothing: the policy, its outputs and
    /// its last error are as the other call leaves them. Serialize the calls on a policy.
    Busy = 9,
    /// A step failed inside the backend (a device error, e.g. a failed CUDA launch or
    /// synchronization): the policy's state is unknown, so this step and every later step or
    /// prompt call on the policy returns this status, with the first failure in
    /// `frt_policy_last_error`. The const calls still work. Free the policy and open a new one.
    Faulted = 10,
    /// FP8 was asked for and its calibration file is missing, unreadable or made for another
    /// checkpoint, plan or runtime version (the message names each field that differs):
    /// recalibrate (`flashrt calibrate`) for this checkpoint and these options.
    Calibration = 11,
}

impl FrtStatus {
    fn from_code(code: u32) -> Option<Self> {
        use FrtStatus::*;
        [Ok, NullArgument, InvalidArgument, BufferTooSmall, Io, Checkpoint, Tokenizer, Backend, Panic, Busy, Faulted, Calibration]
            .into_iter()
            .find(|s| *s as u32 == code)
    }

    fn message(self) -> &'static str {
        match self {
            FrtStatus::Ok => "success",
            FrtStatus::NullArgument => "a required pointer argument was NULL",
            FrtStatus::InvalidArgument => "an argument has an invalid value",
            FrtStatus::BufferTooSmall => "the text buffer is too small",
            FrtStatus::Io => "a file could not be read or written",
            FrtStatus::Checkpoint => "the checkpoint is unusable",
            FrtStatus::Tokenizer => "the tokenizer is missing or unusable",
            FrtStatus::Backend => "the requested backend is unavailable",
            FrtStatus::Panic => "internal error: a panic was caught at the ABI boundary",
            FrtStatus::Busy => "the policy is in use by another thread (one thread at a time per policy)",
            FrtStatus::Faulted => "the policy is unusable after a device failure; free it and open a new one",
            FrtStatus::Calibration => "the FP8 calibration is missing, unreadable or made for another checkpoint or plan",
        }
    }
}

impl From<&flashrt::Error> for FrtStatus {
    fn from(e: &flashrt::Error) -> Self {
        match e {
            flashrt::Error::Io { .. } => FrtStatus::Io,
            flashrt::Error::Checkpoint { .. } => FrtStatus::Checkpoint,
            flashrt::Error::Tokenizer(_) => FrtStatus::Tokenizer,
            flashrt::Error::InvalidArgument { .. } => FrtStatus::InvalidArgument,
            flashrt::Error::Backend(_) => FrtStatus::Backend,
            flashrt::Error::Faulted(_) => FrtStatus::Faulted,
            flashrt::Error::Calibration { .. } => FrtStatus::Calibration,
        }
    }
}

/// A failed call: its status and the message `frt_policy_last_error` / `frt_last_error`
/// report, in the runtime's wording ("invalid {field}: {message}").
pub(crate) struct Failure {
    pub status: FrtStatus,
    pub message: String,
}

impl Failure {
    pub fn null(field: &str) -> Failure {
        Failure { status: FrtStatus::NullArgument, message: format!("{field} is NULL") }
    }

    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Failure {
        Failure { status: FrtStatus::InvalidArgument, message: format!("invalid {field}: {message}") }
    }
}

/// Reads the `struct_size` of the caller's struct `name` (its first field) and refuses one smaller
/// than this library's `T`: it comes from an older header, and its tail is not the caller's memory.
///
/// # Safety
/// `ptr` is non-NULL and points to a readable struct whose first field is `size_t struct_size`.
pub(crate) unsafe fn struct_size<T>(ptr: *const T, name: &str) -> Result<usize, Failure> {
    // SAFETY: the caller's promise; every version of the struct starts with struct_size.
    let size = unsafe { ptr.cast::<usize>().read() };
    let needed = size_of::<T>();
    if size < needed {
        let ty = std::any::type_name::<T>().rsplit("::").next().unwrap_or("the struct");
        return Err(Failure::invalid(
            &format!("{name}.struct_size"),
            format!("{size} is below sizeof({ty}) = {needed}: set it to sizeof({ty})"),
        ));
    }
    Ok(size)
}

impl From<flashrt::Error> for Failure {
    fn from(e: flashrt::Error) -> Failure {
        Failure { status: (&e).into(), message: e.to_string() }
    }
}

/// Major version of the library this header belongs to.
pub const FRT_VERSION_MAJOR: u32 = 0;
/// Minor version.
pub const FRT_VERSION_MINOR: u32 = 4;
/// Patch version.
pub const FRT_VERSION_PATCH: u32 = 0;
/// The version as one comparable number: MAJOR * 1000000 + MINOR * 1000 + PATCH.
pub const FRT_VERSION_NUMBER: u32 = FRT_VERSION_MAJOR * 1000000 + FRT_VERSION_MINOR * 1000 + FRT_VERSION_PATCH;

// The literals above are what cbindgen copies into the header; they must follow Cargo.toml.
const fn parse(s: &str) -> u32 {
    let (b, mut i, mut v) = (s.as_bytes(), 0, 0);
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}
const _: () = assert!(FRT_VERSION_MAJOR == parse(env!("CARGO_PKG_VERSION_MAJOR")), "FRT_VERSION_MAJOR differs from Cargo.toml");
const _: () = assert!(FRT_VERSION_MINOR == parse(env!("CARGO_PKG_VERSION_MINOR")), "FRT_VERSION_MINOR differs from Cargo.toml");
const _: () = assert!(FRT_VERSION_PATCH == parse(env!("CARGO_PKG_VERSION_PATCH")), "FRT_VERSION_PATCH differs from Cargo.toml");

/// The library's version, e.g. "0.4.0": a static NUL-terminated string, never NULL. Compare it with
/// the `FRT_VERSION_*` macros to detect a header/library mismatch.
///
/// Thread safety: safe to call from any thread.
#[unsafe(no_mangle)]
pub extern "C" fn frt_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    guard(VERSION.as_ptr().cast(), || VERSION.as_ptr().cast())
}

/// Copies a short English description of `status` (an `FrtStatus` value) into `buf`.
///
/// Text output follows the rule of every text function: on success `buf` holds the text and a
/// terminating NUL and `*written` is the text length without the NUL. Pass `buf = NULL, len = 0`
/// to query the length only. On `FRT_STATUS_BUFFER_TOO_SMALL` `buf` is untouched and `*written`
/// is the text length too: allocate `*written + 1` bytes and call again.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` when `written` is NULL or `buf` is NULL with
/// `len > 0`; `FRT_STATUS_BUFFER_TOO_SMALL` when `len` cannot hold the text and its NUL;
/// `FRT_STATUS_INVALID_ARGUMENT` when `status` is not an `FrtStatus` value.
///
/// Thread safety: safe to call from any thread.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writing and `written` for one `size_t`, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_status_message(status: u32, buf: *mut c_char, len: usize, written: *mut usize) -> FrtStatus {
    guard(FrtStatus::Panic, || match FrtStatus::from_code(status) {
        // SAFETY: the caller's promise on buf/len/written.
        Some(s) => unsafe { copy_text(s.message(), buf, len, written) },
        None => FrtStatus::InvalidArgument,
    })
}

thread_local! {
    /// The message of the last failed call on this thread that has no `FrtPolicy*` to keep it.
    static THREAD_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Ends a call whose message is kept per thread (`frt_last_error`): a failure's text replaces it,
/// a success clears it.
pub(crate) fn finish_on_thread(result: Result<(), Failure>) -> FrtStatus {
    match result {
        Ok(()) => {
            THREAD_ERROR.with_borrow_mut(String::clear);
            FrtStatus::Ok
        }
        Err(f) => {
            THREAD_ERROR.set(f.message);
            f.status
        }
    }
}

/// Copies the message of the most recent call on this thread that failed without a mutable policy
/// to keep its message — `frt_policy_open`, `frt_policy_config_default`, `frt_policy_info`,
/// `frt_policy_stats` — naming the problem, e.g. "checkpoint /data/pi05: tensor ... missing" or
/// "invalid info.struct_size: 8 is below sizeof(FrtPolicyInfo) = 152". Empty after one of them
/// succeeded. The text-copying calls (`frt_status_message`, `frt_last_error`,
/// `frt_policy_last_error`, `frt_policy_explain`) never change it: their statuses say everything,
/// and reading a message must not replace it. Text rule as in `frt_status_message`.
///
/// Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
///
/// Thread safety: safe; each thread has its own message.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writing and `written` for one `size_t`, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_last_error(buf: *mut c_char, len: usize, written: *mut usize) -> FrtStatus {
    // SAFETY: the caller's promise on buf/len/written.
    guard(FrtStatus::Panic, || THREAD_ERROR.with_borrow(|m| unsafe { copy_text(m, buf, len, written) }))
}

/// Copies `text` and a NUL into `buf[..len]` and its length into `*written`. `buf = NULL, len = 0`
/// is a size query. A buffer too small for text + NUL is left untouched and `*written` gets the
/// text length, so the caller learns the size needed (`*written + 1`) from the failed call too.
///
/// # Safety
/// `buf` valid for `len` bytes of writing and `written` for one `usize`, or NULL.
pub(crate) unsafe fn copy_text(text: &str, buf: *mut c_char, len: usize, written: *mut usize) -> FrtStatus {
    if written.is_null() || (buf.is_null() && len != 0) {
        return FrtStatus::NullArgument;
    }
    if !buf.is_null() {
        if text.len() >= len {
            // SAFETY: checked non-NULL above; valid by the caller's promise.
            unsafe { *written = text.len() };
            return FrtStatus::BufferTooSmall;
        }
        // SAFETY: text.len() + 1 <= len bytes of buf are writable (caller's promise).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            *buf.add(text.len()) = 0;
        }
    }
    // SAFETY: checked non-NULL above; valid by the caller's promise.
    unsafe { *written = text.len() };
    FrtStatus::Ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_a_distinct_number_and_message() {
        let all: Vec<FrtStatus> = (0..100).filter_map(FrtStatus::from_code).collect();
        assert_eq!(all.len(), 12);
        for (i, s) in all.iter().enumerate() {
            assert_eq!(*s as u32, i as u32, "numbers are dense and stable");
            assert!(!s.message().is_empty());
        }
    }

    #[test]
    fn query_copy_and_too_small() {
        let mut n = 99;
        assert_eq!(unsafe { copy_text("abc", std::ptr::null_mut(), 0, &mut n) }, FrtStatus::Ok);
        assert_eq!(n, 3);
        let mut buf = [b'x' as c_char; 4];
        n = 99;
        assert_eq!(unsafe { copy_text("abcd", buf.as_mut_ptr(), 4, &mut n) }, FrtStatus::BufferTooSmall);
        assert_eq!((n, buf[0]), (4, b'x' as c_char), "buffer untouched, the length reported");
        assert_eq!(unsafe { copy_text("abc", buf.as_mut_ptr(), 4, &mut n) }, FrtStatus::Ok);
        assert_eq!((n, buf[3]), (3, 0));
        assert_eq!(unsafe { copy_text("abc", std::ptr::null_mut(), 4, &mut n) }, FrtStatus::NullArgument);
        assert_eq!(unsafe { copy_text("abc", buf.as_mut_ptr(), 4, std::ptr::null_mut()) }, FrtStatus::NullArgument);
    }
}
