//! GPU inventory.
