//! Event time: the `EventTime` instant, UTC text, window assignment, watermarks
//! and the liveness rule. Pure; no I/O, no wall clock (the liveness rule is told
//! the wall clock).

pub(crate) mod event_time;
pub(crate) mod liveness;
pub mod utc;
pub(crate) mod watermark;
pub(crate) mod window;

pub use event_time::EventTime;
pub use watermark::Watermark;
pub use window::{Window, WindowSpec};
