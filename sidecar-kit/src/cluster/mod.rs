//! The Kubernetes side: clients with upstream's rate limits and bounded calls, rotated
//! service-account tokens, Lease elections with client-go's rules, de-duplicated Events, the
//! intent journal.

pub mod client;
pub mod deadline;
pub mod events;
pub mod journal;
pub mod leader;
pub mod pool;
pub mod token;
