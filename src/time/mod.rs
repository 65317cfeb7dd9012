//! Event time: window assignment and watermarks. Pure; no I/O, no wall clock.

pub mod watermark;
pub mod window;

pub use watermark::Watermark;
pub use window::{Window, WindowSpec};
