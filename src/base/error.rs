//! What an error means for whoever runs tally: its class, and for a refusal, its
//! kind and the way out.
//!
//! - Every error type that reaches a command's boundary says its class by an
//!   exhaustive match (`Classify`); a new variant does not compile until it is
//!   classified. `cli::exit` turns the class into the process's exit status; the
//!   table in docs/reference/exit-codes.md is tested against `ErrorClass::ALL`.
//! - A refusal is typed (`Refusal`): its `RefusalKind` names the situation and the
//!   section of docs/operations/refusals.md with the way out; its message names
//!   the partition, key or file and the way out in words.
//! - Panics and poisoned locks are `Internal`: a bug, restart.

/// What to do about an error. The exit status of each is in `exit_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The configuration (file, environment, command line) is wrong: fix it;
    /// restarting as is fails the same way.
    Config,
    /// Continuing would guess (skip, double or under-bill): an operator must take
    /// the way out the message names; restarting as is refuses again.
    Refused,
    /// A dependency (Kafka, PostgreSQL, the object store) could not be reached or
    /// failed: a restart may succeed once it is back.
    Unavailable,
    /// Not classified: a bug (a panic, a poisoned lock), a local I/O failure,
    /// damage found by `checkpoints verify`. Restart.
    Internal,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 4] = [
        ErrorClass::Internal,
        ErrorClass::Config,
        ErrorClass::Refused,
        ErrorClass::Unavailable,
    ];

    /// The process's exit status for this class (docs/reference/exit-codes.md).
    pub fn exit_status(self) -> u8 {
        match self {
            ErrorClass::Internal => 1,
            ErrorClass::Config => 2,
            ErrorClass::Refused => 3,
            ErrorClass::Unavailable => 4,
        }
    }

    /// Whether a supervisor should restart the process (systemd:
    /// `RestartPreventExitStatus=2 3`).
    pub fn restart_helps(self) -> bool {
        matches!(self, ErrorClass::Internal | ErrorClass::Unavailable)
    }
}

/// An error type that knows its class.
pub trait Classify {
    fn class(&self) -> ErrorClass;
}

/// The situations tally refuses to continue in. Each has its way out in
/// docs/operations/refusals.md (`doc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// The best checkpoint was written under an incompatible configuration.
    ConfigChanged,
    /// Checkpoints hold the partition but none is usable (damaged, past the log end).
    NoUsableCheckpoint,
    /// The checkpoint store holds another format's checkpoints.
    StoreFormat,
    /// The group committed an offset that no checkpoint holds.
    CommittedWithoutCheckpoint,
    /// Records were deleted before tally (or `reprocess-late`) read them.
    LogTruncated,
    /// A new consumer group finds its log starting above 0.
    NewGroupOnTruncatedLog,
    /// The next offset is past the log end (a recreated topic, lost data).
    PastLogEnd,
    /// The sink's `sink_offsets` point outside the results topic's log.
    SinkOffsets,
    /// A resource tally needs is taken or misplaced: a `state.dir` in use or not
    /// a directory, an output that is the input, a group id that cannot name a
    /// store, a topic without partitions, a property tally owns.
    Setup,
}

impl RefusalKind {
    pub const ALL: [RefusalKind; 9] = [
        RefusalKind::ConfigChanged,
        RefusalKind::NoUsableCheckpoint,
        RefusalKind::StoreFormat,
        RefusalKind::CommittedWithoutCheckpoint,
        RefusalKind::LogTruncated,
        RefusalKind::NewGroupOnTruncatedLog,
        RefusalKind::PastLogEnd,
        RefusalKind::SinkOffsets,
        RefusalKind::Setup,
    ];

    /// Where the way out is told: a section of docs/operations/refusals.md.
    pub fn doc(self) -> &'static str {
        match self {
            RefusalKind::ConfigChanged => "refusals.md#a-changed-configuration",
            RefusalKind::NoUsableCheckpoint
            | RefusalKind::StoreFormat
            | RefusalKind::CommittedWithoutCheckpoint
            | RefusalKind::PastLogEnd
            | RefusalKind::Setup => "refusals.md#refusals-and-the-way-out",
            RefusalKind::LogTruncated => "refusals.md#records-deleted-before-tally-read-them",
            RefusalKind::NewGroupOnTruncatedLog => {
                "refusals.md#a-new-consumer-group-on-a-truncated-log"
            }
            RefusalKind::SinkOffsets => "refusals.md#the-sink",
        }
    }
}

/// An error that says its class, boxed where a port's implementations differ
/// (the outputs: Kafka, or the file mode's files).
pub trait ClassifiedError: std::error::Error + Classify + Send + Sync + 'static {}

impl<E: std::error::Error + Classify + Send + Sync + 'static> ClassifiedError for E {}

/// A refusal to start or continue: its kind, and a message naming what (the
/// partition, key or file) and the way out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

impl Refusal {
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A `Setup` refusal (a resource taken or misplaced).
    pub fn setup(message: impl Into<String>) -> Self {
        Self::new(RefusalKind::Setup, message)
    }
}

impl Classify for Refusal {
    fn class(&self) -> ErrorClass {
        ErrorClass::Refused
    }
}

/// A bug tally caught: a thread that panicked, a lock poisoned by one. Restart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("internal error: {0} (a bug; see the log above)")]
pub struct Bug(pub String);

impl Bug {
    /// A lock whose holder panicked.
    pub fn poisoned(what: &str) -> Self {
        Bug(format!("{what} lock poisoned by a panic"))
    }
}

impl Classify for Bug {
    fn class(&self) -> ErrorClass {
        ErrorClass::Internal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_distinct_and_only_internal_and_unavailable_restart() {
        let mut seen: Vec<u8> = ErrorClass::ALL.iter().map(|c| c.exit_status()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, [1, 2, 3, 4]);
        for c in ErrorClass::ALL {
            assert_eq!(
                c.restart_helps(),
                !matches!(c.exit_status(), 2 | 3),
                "{c:?}"
            );
        }
    }
}
