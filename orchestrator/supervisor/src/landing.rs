//! What came back of a run, however it came (the host's import by path,
//! `run::import_into`, or the end-of-run packer's pack, `run::packer`), and
//! the slot where the packer's door leaves it. A leaf: it names no other
//! module of the supervisor.

use std::sync::Mutex;

/// What came back of a run.
#[derive(Debug, Clone)]
pub(crate) struct Landed {
    pub(crate) agent_tip: String,
    pub(crate) observed_commit: Option<String>,
    pub(crate) result_commit: String,
    pub(crate) tree: String,
    pub(crate) files_changed: u64,
    pub(crate) insertions: u64,
    pub(crate) deletions: u64,
    /// `{"path", "why"}` of each working file left out (listed ones).
    pub(crate) skipped: Vec<serde_json::Value>,
    pub(crate) dropped: Option<Dropped>,
}

/// Why a run's commits were left out of its result.
#[derive(Debug, Clone)]
pub(crate) struct Dropped {
    pub(crate) kind: String,
    pub(crate) object: Option<String>,
    pub(crate) size: Option<u64>,
    pub(crate) limit: Option<u64>,
    pub(crate) why: String,
}

/// Where the packer's door leaves the result: taken once.
#[derive(Debug, Default)]
pub struct Slot {
    state: Mutex<SlotState>,
}

/// What the door took: the result and its pack's size, or the failure's
/// kind and words.
pub(crate) type Taken = Result<(Landed, u64), (&'static str, String)>;

#[derive(Debug, Default)]
enum SlotState {
    #[default]
    Open,
    Taking,
    Taken(Box<Taken>),
    Gone,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this request is the first result sent.
    pub(crate) fn begin(&self) -> bool {
        let mut state = self.lock();
        if matches!(*state, SlotState::Open) {
            *state = SlotState::Taking;
            true
        } else {
            false
        }
    }

    pub(crate) fn end(&self, taken: Taken) {
        *self.lock() = SlotState::Taken(Box::new(taken));
    }

    pub(crate) fn take(&self) -> Option<Taken> {
        match std::mem::replace(&mut *self.lock(), SlotState::Gone) {
            SlotState::Taken(taken) => Some(*taken),
            _ => None,
        }
    }
}
