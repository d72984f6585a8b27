//! replay-guard: exactly-once incident effects from an at-least-once MQTT feed.
//!
//! The decision core (`json`, `wire`, `key`, `decide`, `model`) is pure and knows nothing of
//! storage or transport; `store` is the only module that names redb. See ARCHITECTURE.md.

pub mod cli;
pub mod commands;
pub mod config;
pub mod decide;
pub mod demo;
pub mod entropy;
pub mod filter;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod hyper_io;
pub mod json;
pub mod key;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod output;
pub mod progress;
pub mod rangeset;
pub mod readings;
pub mod relay;
pub mod service;
pub mod signals;
#[cfg(test)]
mod spec_vectors;
pub mod store;
#[doc(hidden)]
pub mod testing;
pub mod textsafe;
pub mod timefmt;
pub mod tls;
pub mod transport;
pub mod wire;
