//! The `fleetscope get | count | watch | clusters` commands: a gRPC client with
//! kubectl-like output.

// clap turns doc comments into help text: the flag structs are documented by `--help`.
#[allow(missing_docs)]
pub mod args;
pub mod columns;
pub mod complete;
mod connect;
mod describe;
mod follow;
mod get;
pub mod jsonpath;
mod kubeconfig;
mod lookup;
pub mod output;
mod printing;
mod status;

pub use connect::{Client, ClientError, Credentials, connect, server_url};
pub use describe::describe;
pub use follow::watch;
pub use get::{count, get};
pub use kubeconfig::kubeconfig;
pub use status::{clusters, server_version, store};

#[cfg(test)]
mod tests;
