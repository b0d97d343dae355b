//! fleetscope beyond one machine: replicas share the fleet's clusters through
//! Kubernetes Leases in one coordination cluster ([`lease`]), and every replica
//! computes the same owners for every cluster from the live members ([`assign`]).

pub mod assign;
pub mod lease;
pub mod member;
