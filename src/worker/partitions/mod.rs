//! The worker's partitions, whichever driver feeds them (the Kafka worker, the
//! file run), and their one port to the world (`Outputs`).

mod outputs;

pub use outputs::{NoGroup, OutputPorts, Outputs, Record};
