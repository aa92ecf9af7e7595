//! The Maglev load balancer. For now: the consistent-hashing evaluation of
//! the paper's section 5.3 ([`hash_eval`]). The forwarder and control plane
//! arrive with their issues.

#![deny(missing_docs)]

pub mod hash_eval;
