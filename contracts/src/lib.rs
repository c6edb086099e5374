//! gridlease market rules (in progress).
