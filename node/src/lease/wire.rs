//! Session messages of a running lease: defined in `gridlease_protocol::session` (with their
//! byte caps), re-exported here for the lease service.

pub use gridlease_protocol::session::{
    LogChunk, MAX_DETAIL, MAX_LOG_CHUNK, SessionRequest, SessionResponse, detail,
};
