//! fleetscope's ring in Kubernetes: replicas share the fleet's clusters through
//! `coordination.k8s.io/v1` Leases in one coordination cluster ([`leases`]), each
//! sealed with the ring's key ([`seal`]) and read and written as client-go's leader
//! election does ([`lease`]); what a Lease says is named in [`vocabulary`]; a
//! replica's membership (its own Lease renewed, the ring's followed) is [`member`].
//! Every replica and router computes the same owners for every cluster from the
//! live members ([`assign`], pure). The decisions taken from them (what a replica
//! holds, fencing) are kube-free and live above this crate.

pub mod assign;
pub mod lease;
pub mod leases;
pub mod member;
pub mod seal;
pub mod vocabulary;
