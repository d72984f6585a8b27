//! replay-guard: exactly-once incident effects from an at-least-once MQTT feed.
//!
//! The decision core (`json`, `wire`, `key`, `decide`, `model`) is pure and knows nothing of
//! storage or transport; `store` is the only module that names redb. See ARCHITECTURE.md.
//!
//! The public surface is what code outside `src/` names, nothing more, so that rustc's
//! dead-code lint sees the rest: `cli` and `commands` (the binary, `main.rs`), `store`,
//! `relay`, `config`, `json`, `model`, `key`, `wire`, `timefmt`, `tls`, `logging` and `output`
//! (the binary, the integration tests, the benches and the examples), and the doc-hidden
//! `fuzzing` and `testing` (the fuzz targets and the integration tests). Every other module is
//! `pub(crate)`.

pub mod cli;
pub mod commands;
pub mod config;
pub(crate) mod decide;
pub(crate) mod demo;
pub(crate) mod entropy;
pub(crate) mod filter;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod hyper_io;
pub mod json;
pub mod key;
pub mod logging;
pub(crate) mod metrics;
pub mod model;
pub(crate) mod notify;
pub mod output;
pub(crate) mod progress;
pub(crate) mod rangeset;
pub(crate) mod readings;
pub mod relay;
pub(crate) mod report;
pub(crate) mod service;
pub(crate) mod signals;
#[cfg(test)]
mod spec_vectors;
pub mod store;
#[doc(hidden)]
pub mod testing;
pub(crate) mod textsafe;
pub mod timefmt;
pub mod tls;
pub(crate) mod transport;
pub mod wire;
