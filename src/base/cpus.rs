//! How many CPUs this process may run on, and what the file mode's record path
//! does with them.
//!
//! The file mode reads and runs step 1 of the rules (parse, validate, price,
//! fingerprint) on a reading thread, beside the thread that applies the records:
//! on two CPUs the two halves overlap. On one CPU they cannot; they only take
//! turns, and every hand-over between them (a chunk through a channel, a wake-up,
//! a context switch, the chunk's buffers cold in the other thread's cache) is paid
//! for nothing (docs/BENCHMARKS.md §1). So with one CPU it runs step 1 inline.
//! The Kafka worker keeps its poll thread on one CPU too: polling on the loop
//! saved about 2 % of its CPU and lengthened its runs by 2–7 % (§2).

/// Whether a record path runs step 1 on a thread of its own or on the thread
/// that applies the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipeline {
    /// One thread reads (or polls), prepares and applies: the process may run on
    /// one CPU only.
    Inline,
    /// A reading (or polling) thread prepares while the other applies.
    Threaded,
}

impl Pipeline {
    /// `Inline` when the process may run on one CPU only (its affinity mask, or
    /// its cgroup's CPU quota, as `std::thread::available_parallelism` reads
    /// them), `Threaded` otherwise or when that cannot be read.
    pub fn for_this_process() -> Self {
        Self::for_cpus(available())
    }

    /// The pipeline for `cpus` usable CPUs.
    pub fn for_cpus(cpus: usize) -> Self {
        if cpus == 1 {
            Self::Inline
        } else {
            Self::Threaded
        }
    }

    /// The name a log line gives it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::Threaded => "threaded",
        }
    }
}

/// The CPUs this process may run on; 0 when that cannot be read.
pub fn available() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cpu_is_inline_and_any_other_count_threaded() {
        assert_eq!(Pipeline::for_cpus(1), Pipeline::Inline);
        assert_eq!(Pipeline::for_cpus(2), Pipeline::Threaded);
        assert_eq!(Pipeline::for_cpus(64), Pipeline::Threaded);
        // Unknown: as before this existed.
        assert_eq!(Pipeline::for_cpus(0), Pipeline::Threaded);
    }
}
