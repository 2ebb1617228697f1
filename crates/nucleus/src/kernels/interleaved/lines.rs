//! Bytes on cache lines: the AMX tiles' operands, whose rows of 64 bytes must each sit in one
//! line (a row across two lines costs the tile load two).

/// Bytes that start on a cache line, in whole lines.
#[derive(Default)]
pub(crate) struct Lines(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Lines {
    /// `bytes` (a multiple of 64) of them, the new ones zeros.
    pub(crate) fn resize(&mut self, bytes: usize) {
        assert_eq!(bytes % 64, 0);
        self.0.resize(bytes / 64, Line([0; 64]));
    }
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `Line` is 64 plain bytes, no padding (size 64, align 64): the lines are
        // 64·len initialized bytes, borrowed uniquely here.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, 64 * self.0.len()) }
    }
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr() as *const u8
    }
}
