//! Metering.
