//! fleetscope beyond one machine: replicas share the fleet's clusters through
//! Kubernetes Leases in one coordination cluster (`fleetscope_ring`: the Leases,
//! their seal and vocabulary, a replica's membership), every replica computes the
//! same owners for every cluster from the live members (`fleetscope_ring::assign`), and each runs
//! the clusters it holds ([`owner`]).

pub mod owner;
pub mod replica;
