//! The SQLite state store: the core's state ports
//! (`nightshift_core::state_store`) over one SQLite database per state
//! directory, with the audit chain's head and checkpoints in files beside
//! it, and the model token ledger. The only crate that names rusqlite
//! (`scripts/check-layers.py`), and in it the only module is [`store`]
//! (`scripts/check-layers.py` too).

pub mod store;
