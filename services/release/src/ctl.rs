//! Why an operator request (`fleet.releasectl.plan|apply|approve|rollback|status|history`) was not carried
//! out: the reply's `error` is its text.

use crate::model::State;
use crate::{machine, plan, spec, store};

/// Why a request to the release role failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No release by that name is stored.
    #[error("no release named {0}")]
    NoRelease(String),
    /// The spec does not parse or breaks a rule.
    #[error(transparent)]
    Spec(#[from] spec::Error),
    /// No plan could be made (targets, batches).
    #[error(transparent)]
    Plan(#[from] plan::Error),
    /// The release can't be started or rolled back now.
    #[error(transparent)]
    Refused(#[from] machine::Error),
    /// The release is applying or rolling back: it can't be planned again now.
    #[error("release {name} is {state} (revision {revision}): wait for it or roll it back")]
    Busy {
        /// Release.
        name: String,
        /// Its state.
        state: State,
        /// Its revision.
        revision: u64,
    },
    /// The release started applying while it was being planned again.
    #[error("release {0} started meanwhile")]
    StartedMeanwhile(String),
    /// Applied by name, but it is not planned (it ran or runs).
    #[error("release {name} is {state} (revision {revision}): plan it again with -f spec.yaml")]
    NotPlanned {
        /// Release.
        name: String,
        /// Its state.
        state: State,
        /// Its revision.
        revision: u64,
    },
    /// Its `depends_on` closes a cycle among the releases.
    #[error("depends_on would make a cycle: {0}")]
    Cycle(String),
    /// An apply that names neither a release nor a spec.
    #[error("apply needs a release name or a spec")]
    NothingToApply,
    /// The stored spec could not be written out to be planned again.
    #[error(transparent)]
    SpecText(#[from] serde_yaml::Error),
    /// The store failed (retryable).
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl Error {
    /// Whether asking again later may succeed without another request (the store, a busy release).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Store(_)
                | Error::Busy { .. }
                | Error::StartedMeanwhile(_)
                | Error::Refused(machine::Error::Busy { .. })
        )
    }
}
