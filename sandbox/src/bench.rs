//! GPU benchmark.
