//! The bookkeeping of what a log writer keeps: which bytes of the stream go to the file's head
//! ([`Window`]) and the last bytes past it ([`Tail`]).

/// Which part of each chunk of output goes to the file now (the head) and which past it (to
/// the tail): bytes before `skip` are already in the file.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    /// Bytes of the stream seen so far.
    seen: u64,
    /// Bytes already in the file when the writer started.
    pub(super) skip: u64,
    head: u64,
}

impl Window {
    pub(super) fn new(skip: u64, head: u64) -> Self {
        Self {
            seen: 0,
            skip,
            head,
        }
    }

    /// (the part of `chunk`, the next bytes of the stream, to append to the file; the part
    /// past the head).
    pub(super) fn admit<'a>(&mut self, chunk: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        let start = self.seen;
        let len = chunk.len() as u64;
        let end = start.saturating_add(len);
        self.seen = end;
        let from = self.skip.max(start).min(end);
        let to = self.head.max(from).min(end);
        let over = self.head.max(self.skip).max(start).min(end);
        // All are within [start, end], so the offsets fit the chunk.
        let at = |x: u64| usize::try_from(x - start).unwrap_or(chunk.len());
        (&chunk[at(from)..at(to)], &chunk[at(over)..])
    }

    /// The file's length if everything admitted to the head was written.
    pub(super) fn kept(&self) -> u64 {
        self.skip.max(self.seen.min(self.head))
    }
}

/// The last bytes of the output past the head, at most `cap`, and how many before them were
/// cut.
#[derive(Debug, Default)]
pub struct Tail {
    pub(super) bytes: std::collections::VecDeque<u8>,
    cap: usize,
    pub(super) cut: u64,
}

impl Tail {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            bytes: std::collections::VecDeque::new(),
            cap,
            cut: 0,
        }
    }

    pub(super) fn push(&mut self, b: &[u8]) {
        if b.len() >= self.cap {
            self.cut += (self.bytes.len() + b.len() - self.cap) as u64;
            self.bytes.clear();
            self.bytes.extend(&b[b.len() - self.cap..]);
            return;
        }
        let over = (self.bytes.len() + b.len()).saturating_sub(self.cap);
        self.bytes.drain(..over);
        self.cut += over as u64;
        self.bytes.extend(b);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn window_skips_what_the_file_has_and_sends_the_rest_past_the_head_to_the_tail() {
        let data = bytes(100);
        let mut w = Window::new(0, 30);
        assert_eq!(w.admit(&data[..20]), (&data[..20], &[] as &[u8]));
        assert_eq!(w.admit(&data[20..40]), (&data[20..30], &data[30..40]));
        assert_eq!(w.admit(&data[40..]), (&[] as &[u8], &data[40..]));
        assert_eq!(w.kept(), 30);

        let mut w = Window::new(25, 30);
        assert_eq!(w.admit(&data[..20]), (&[] as &[u8], &[] as &[u8]));
        assert_eq!(w.admit(&data[20..28]), (&data[25..28], &[] as &[u8]));
        assert_eq!(w.admit(&data[28..]), (&data[28..30], &data[30..]));
        assert_eq!(w.kept(), 30);
    }

    #[test]
    fn tail_keeps_the_last_bytes_and_counts_the_cut() {
        let data = bytes(1000);
        let mut t = Tail::new(100);
        for c in data.chunks(7) {
            t.push(c);
        }
        assert_eq!(t.bytes.iter().copied().collect::<Vec<_>>(), &data[900..]);
        assert_eq!(t.cut, 900);
        let mut t = Tail::new(100);
        t.push(&data[..50]);
        t.push(&data[50..500]);
        assert_eq!(t.bytes.iter().copied().collect::<Vec<_>>(), &data[400..500]);
        assert_eq!(t.cut, 400);
    }
}
