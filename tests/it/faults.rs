//! See main.rs for the module map.
