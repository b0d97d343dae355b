//! The status of a server's inputs that reload (its configuration file, kubeconfigs,
//! tokens, policy and TLS files), as the API and the metrics read it.

use std::path::PathBuf;
use std::time::SystemTime;

use tokio::sync::watch;

/// The status of one input that reloads.
#[derive(Debug, Clone, PartialEq)]
pub struct InputStatus {
    /// Its name: `config`, `sources`, `tokens`, `policy` or `tls`.
    pub input: &'static str,
    /// The files it is read from.
    pub files: Vec<PathBuf>,
    /// When the version in force was loaded.
    pub loaded_at: SystemTime,
    /// Reloads tried since start.
    pub reloads: u64,
    /// Why the last reload failed, and when; `None` when it succeeded.
    pub error: Option<(String, SystemTime)>,
}

/// The status of every input, as it changes.
pub type Inputs = watch::Receiver<Vec<InputStatus>>;

/// No input reloads (a server without files to follow).
pub fn no_inputs() -> Inputs {
    watch::channel(Vec::new()).1
}
