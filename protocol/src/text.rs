//! Bounded text: the messages and details that travel are cut to their caps here, the same way
//! everywhere (on a char boundary, so the result is still UTF-8). A leaf module, used by the
//! stream vocabularies ([`crate::session`], [`crate::access`]) without either using the other.

/// `s` as text, cut to at most `max` bytes on a char boundary.
pub fn truncated(s: impl std::fmt::Display, max: usize) -> String {
    let mut s = s.to_string();
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
