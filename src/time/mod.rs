//! Event time: the `EventTime` instant, UTC text, window assignment and watermarks. Pure; no
//! I/O, no wall clock.

pub mod event_time;
pub mod utc;
pub mod watermark;
pub mod window;

pub use event_time::EventTime;
pub use watermark::Watermark;
pub use window::{Window, WindowSpec};
