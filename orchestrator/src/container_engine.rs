//! The container engine as the core sees it: a narrow trait owned by the
//! core, implemented by the bollard adapter (`engine.rs`) and by
//! [`fake::FakeEngine`], a hand-written fake that records what it was asked.
//!
//! It holds what the kill switch's first step needs (find a state's
//! sandboxes by their labels, kill, remove); the run lifecycle's create,
//! inspect, attach, start, wait and samples are still called on
//! [`crate::engine::Engine`] directly and join this trait as `run.rs` is
//! made generic. A Kubernetes backend implements it without touching the
//! core.
//!
//! Invariants every implementation keeps: `kill` of a container that
//! already stopped, and `remove` of one already gone, are not errors;
//! `managed` lists every container carrying nightshift's labels, running or
//! not.

use std::future::Future;

use crate::engine::{EngineError, Managed};

pub trait ContainerEngine: Sync {
    /// Containers carrying nightshift's label, optionally of one run only.
    fn managed(
        &self,
        run: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Managed>, EngineError>> + Send;
    /// SIGKILL.
    fn kill(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Forced removal.
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send;
}

impl ContainerEngine for crate::engine::Engine {
    fn managed(
        &self,
        run: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Managed>, EngineError>> + Send {
        crate::engine::Engine::managed(self, run)
    }
    fn kill(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send {
        crate::engine::Engine::kill(self, id)
    }
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send {
        crate::engine::Engine::remove(self, id)
    }
}

pub mod fake {
    //! An in-memory engine: containers in a list, every call recorded, and
    //! containers whose kill or removal the engine refuses.

    use std::collections::HashSet;
    use std::sync::Mutex;

    use super::ContainerEngine;
    use crate::engine::{EngineError, Managed};

    #[derive(Debug, Default)]
    pub struct FakeEngine {
        pub containers: Mutex<Vec<Managed>>,
        /// `kill ID` / `remove ID`, in the order asked.
        pub calls: Mutex<Vec<String>>,
        /// Containers whose kill fails (one that stopped by itself meanwhile).
        pub refuse_kill: HashSet<String>,
        /// Containers whose removal fails.
        pub refuse_remove: HashSet<String>,
    }

    fn refused(doing: &str, id: &str) -> EngineError {
        EngineError::Unreachable {
            endpoint: "fake".into(),
            message: format!("{doing} {id} refused by the fake"),
        }
    }

    impl FakeEngine {
        pub fn with(containers: Vec<Managed>) -> Self {
            Self {
                containers: Mutex::new(containers),
                ..Default::default()
            }
        }

        pub fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }

        pub fn ids(&self) -> Vec<String> {
            self.containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|c| c.id.clone())
                .collect()
        }

        fn record(&self, call: String) {
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(call);
        }
    }

    impl ContainerEngine for FakeEngine {
        async fn managed(&self, run: Option<&str>) -> Result<Vec<Managed>, EngineError> {
            Ok(self
                .containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|c| run.is_none() || c.run.as_deref() == run)
                .cloned()
                .collect())
        }

        async fn kill(&self, id: &str) -> Result<(), EngineError> {
            self.record(format!("kill {id}"));
            if self.refuse_kill.contains(id) {
                return Err(refused("killing", id));
            }
            for c in self
                .containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter_mut()
                .filter(|c| c.id == id)
            {
                c.running = false;
            }
            Ok(())
        }

        async fn remove(&self, id: &str) -> Result<(), EngineError> {
            self.record(format!("remove {id}"));
            if self.refuse_remove.contains(id) {
                return Err(refused("removing", id));
            }
            self.containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|c| c.id != id);
            Ok(())
        }
    }
}
