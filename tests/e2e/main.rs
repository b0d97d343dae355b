//! fleetscope's end-to-end tests, in one binary (one link; `cargo test --test e2e
//! security::` runs one module): simulated clusters on loopback, the real server (as
//! a process where crashes matter), real gRPC clients, kube-rs and the real kubectl.
//! Tests wait on readiness signals (health, `ListClusters` and its inputs' reload
//! status, the Watch) with generous deadlines, never on sleeps.
//!
//! The modules share [`common`]. Servers run in-process by some modules share this
//! process's statics (the task registry, connection counters) with each other: a test
//! reads what it caused from its own server, never a process-wide total.

#![allow(clippy::unwrap_used)]

mod common;

mod cli;
mod config;
mod connections;
mod crash;
mod credentials;
mod deploy;
mod examples;
mod first_sync;
mod fleet_api;
mod grpc_api;
mod kube_api;
mod kubectl;
mod limits;
mod metrics;
mod outage;
mod persistence;
mod reload;
mod resume;
mod security;
mod shard;
mod sim_clients;
mod traces;
