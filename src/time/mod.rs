//! Event time: the `EventTime` instant, UTC text, window assignment, watermarks
//! and the liveness rule. Pure; no I/O, no wall clock (the liveness rule is told
//! the wall clock).

pub mod event_time;
pub mod liveness;
pub mod utc;
pub mod watermark;
pub mod window;

pub use event_time::EventTime;
pub use watermark::Watermark;
pub use window::{Window, WindowSpec};
