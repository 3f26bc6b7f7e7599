//! Copying text into caller buffers without allocating.

use std::ffi::c_char;

use crate::status::FrtStatus;

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
