//! fleetscope beyond one machine: replicas share the fleet's clusters through
//! Kubernetes Leases in one coordination cluster ([`lease`], [`member`]), every
//! replica computes the same owners for every cluster from the live members
//! ([`assign`]), and each runs the clusters it holds ([`owner`]).

pub mod assign;
pub mod coordination;
pub mod lease;
pub mod member;
pub mod owner;
pub mod replica;
pub mod seal;
