//! BLAKE3 Merkle trees over the leaves of a proof-of-GPU commitment (rows of a GEMM output,
//! pages of the VRAM fill), shaped as RFC 6962 shapes them: the left subtree of a node over n
//! leaves holds the largest power of two below n. Built level by level (an odd node at the end
//! of a level moves up unchanged), which gives the same tree.
//!
//! Leaves arrive already hashed (each with its own domain tag, `super::data`); an inner node is
//! BLAKE3 of `0x01 || "gl-merkle" || left || right`, so no leaf can pose as a node.

use gridlease_protocol::Digest;

/// An inner node.
pub fn node(left: &Digest, right: &Digest) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(&[1]);
    h.update(b"gl-merkle");
    h.update(&left.0);
    h.update(&right.0);
    Digest(*h.finalize().as_bytes())
}

/// A whole tree: every level, leaves first.
#[derive(Clone, Debug)]
pub struct Tree {
    levels: Vec<Vec<Digest>>,
}

impl Tree {
    /// The tree over `leaves` (at least one).
    pub fn new(leaves: Vec<Digest>) -> Self {
        let mut levels = vec![leaves];
        while levels.last().map_or(0, Vec::len) > 1 {
            let below = levels.last().map(Vec::as_slice).unwrap_or_default();
            let up: Vec<Digest> = below
                .chunks(2)
                .map(|pair| match pair {
                    [l, r] => node(l, r),
                    [one] => *one,
                    _ => unreachable!("chunks(2)"),
                })
                .collect();
            levels.push(up);
        }
        Self { levels }
    }

    /// The root (all zeros for an empty tree).
    pub fn root(&self) -> Digest {
        self.levels
            .last()
            .and_then(|l| l.first())
            .copied()
            .unwrap_or_default()
    }

    /// Leaves.
    pub fn len(&self) -> u64 {
        self.levels.first().map_or(0, Vec::len) as u64
    }

    /// True without leaves.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The leaf at `index`.
    pub fn leaf(&self, index: u64) -> Option<Digest> {
        let i = usize::try_from(index).ok()?;
        self.levels.first()?.get(i).copied()
    }

    /// The siblings from leaf `index` up to the root (none for a one-leaf tree).
    pub fn path(&self, index: u64) -> Vec<Digest> {
        let mut out = Vec::new();
        let Ok(mut i) = usize::try_from(index) else {
            return out;
        };
        for level in &self.levels[..self.levels.len().saturating_sub(1)] {
            let sibling = i ^ 1;
            if let Some(s) = level.get(sibling) {
                out.push(*s);
            }
            i /= 2;
        }
        out
    }
}

/// Whether `path` leads from `leaf` at `index` in a tree of `size` leaves to `root`.
pub fn verify(leaf: &Digest, index: u64, size: u64, path: &[Digest], root: &Digest) -> bool {
    if index >= size {
        return false;
    }
    let (mut i, mut n, mut h, mut used) = (index, size, *leaf, 0usize);
    while n > 1 {
        let has_sibling = i ^ 1 < n;
        if has_sibling {
            let Some(s) = path.get(used) else {
                return false;
            };
            used += 1;
            h = if i % 2 == 0 { node(&h, s) } else { node(s, &h) };
        }
        i /= 2;
        n = n.div_ceil(2);
    }
    used == path.len() && h == *root
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leaves(n: usize) -> Vec<Digest> {
        (0..n)
            .map(|i| Digest(*blake3::hash(&(i as u64).to_le_bytes()).as_bytes()))
            .collect()
    }

    /// RFC 6962's recursive definition, for comparison.
    fn rfc_root(l: &[Digest]) -> Digest {
        if l.len() == 1 {
            return l[0];
        }
        let mut k = 1;
        while k * 2 < l.len() {
            k *= 2;
        }
        node(&rfc_root(&l[..k]), &rfc_root(&l[k..]))
    }

    #[test]
    fn the_level_by_level_tree_is_rfc_6962s() {
        for n in 1..70 {
            let l = leaves(n);
            assert_eq!(Tree::new(l.clone()).root(), rfc_root(&l), "{n} leaves");
        }
    }

    proptest! {
        #[test]
        fn every_path_verifies_and_no_other_leaf_index_or_size_does(n in 1usize..300, pick in any::<u64>()) {
            let l = leaves(n);
            let t = Tree::new(l.clone());
            let i = pick % n as u64;
            let p = t.path(i);
            prop_assert!(verify(&l[i as usize], i, n as u64, &p, &t.root()));
            let other = Digest([7; 32]);
            prop_assert!(!verify(&other, i, n as u64, &p, &t.root()));
            if n > 1 {
                let j = (i + 1) % n as u64;
                prop_assert!(!verify(&l[i as usize], j, n as u64, &p, &t.root()) || l[i as usize] == l[j as usize]);
                let mut bent = p.clone();
                bent[0].0[0] ^= 1;
                prop_assert!(!verify(&l[i as usize], i, n as u64, &bent, &t.root()));
            }
        }
    }
}
