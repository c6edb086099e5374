//! GPU classes: the canonical name of an offer's GPU model, which shards offer gossip into one
//! topic per class (`docs/protocol.md` 3c step 1).
//!
//! A class is lower-case ASCII letters, digits and single dashes, at most [`MAX_CLASS_LEN`]
//! bytes: the model name lower-cased, every run of other characters turned into one dash, the
//! vendor words `nvidia` and `geforce` dropped (`NVIDIA GeForce RTX 4090` -> `rtx-4090`,
//! `NVIDIA A100-SXM4-80GB` -> `a100-sxm4-80gb`). An offer whose GPUs are not all one model is
//! of class [`MIXED`]. The same function names the class of an offer, of a topic and of what a
//! user types (`--follow "RTX 4090"` follows `rtx-4090`), so they cannot disagree.

use crate::messages::Offer;

/// Longest class name; a longer model name is cut (at a dash boundary or not).
pub const MAX_CLASS_LEN: usize = 48;
/// The class of an offer whose GPUs are of different models.
pub const MIXED: &str = "mixed";
/// The class of a model name with no letter or digit.
pub const UNKNOWN: &str = "unknown";
/// Most classes one node follows, and one book-sync request names.
pub const MAX_FOLLOWED_CLASSES: usize = 16;

/// Words of a model name that say nothing about the card.
const VENDOR_WORDS: [&str; 2] = ["nvidia", "geforce"];

/// The class of one GPU model name.
pub fn class_of_model(model: &str) -> String {
    let mut out = String::with_capacity(model.len().min(MAX_CLASS_LEN));
    for word in model
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_ascii_lowercase();
        if VENDOR_WORDS.contains(&word.as_str()) {
            continue;
        }
        let sep = usize::from(!out.is_empty());
        if out.len() + sep + word.len() > MAX_CLASS_LEN {
            let room = MAX_CLASS_LEN.saturating_sub(out.len() + sep);
            if room > 0 {
                if sep == 1 {
                    out.push('-');
                }
                out.push_str(&word[..room]);
            }
            break;
        }
        if sep == 1 {
            out.push('-');
        }
        out.push_str(&word);
    }
    if out.is_empty() {
        UNKNOWN.to_string()
    } else {
        out
    }
}

/// The class of GPUs with these model names: the one model's class, or [`MIXED`].
pub fn class_of_models<'a>(models: impl IntoIterator<Item = &'a str>) -> String {
    let mut class: Option<String> = None;
    for m in models {
        let c = class_of_model(m);
        match &class {
            None => class = Some(c),
            Some(first) if *first == c => {}
            Some(_) => return MIXED.to_string(),
        }
    }
    class.unwrap_or_else(|| UNKNOWN.to_string())
}

/// The class of an offer (its GPUs' models).
pub fn offer_class(offer: &Offer) -> String {
    class_of_models(offer.gpus.iter().map(|g| g.spec.model.as_str()))
}

/// Whether `s` is a class name as [`class_of_model`] writes them (what a topic or a book-sync
/// request may carry).
pub fn is_class(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_CLASS_LEN
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_become_classes() {
        assert_eq!(class_of_model("NVIDIA GeForce RTX 4090"), "rtx-4090");
        assert_eq!(class_of_model("RTX 4090"), "rtx-4090");
        assert_eq!(class_of_model("rtx-4090"), "rtx-4090");
        assert_eq!(class_of_model("NVIDIA A100-SXM4-80GB"), "a100-sxm4-80gb");
        assert_eq!(class_of_model("  Tesla  T4 "), "tesla-t4");
        assert_eq!(class_of_model("¿?"), UNKNOWN);
        assert_eq!(class_of_model(""), UNKNOWN);
        let long = "x".repeat(200);
        assert_eq!(class_of_model(&long).len(), MAX_CLASS_LEN);
        let words = "abcdefghij ".repeat(10);
        let c = class_of_model(&words);
        assert!(c.len() <= MAX_CLASS_LEN && is_class(&c), "{c}");
    }

    #[test]
    fn an_offer_of_two_models_is_mixed() {
        assert_eq!(
            class_of_models(["RTX 4090", "NVIDIA GeForce RTX 4090"]),
            "rtx-4090"
        );
        assert_eq!(class_of_models(["RTX 4090", "RTX 3090"]), MIXED);
        assert_eq!(class_of_models([]), UNKNOWN);
    }

    #[test]
    fn only_canonical_names_are_classes() {
        for good in ["rtx-4090", "a100-sxm4-80gb", MIXED, UNKNOWN] {
            assert!(is_class(good), "{good}");
        }
        for bad in [
            "",
            "RTX-4090",
            "rtx 4090",
            "-rtx",
            "rtx-",
            "rtx--4090",
            "rtx/4090",
        ] {
            assert!(!is_class(bad), "{bad}");
        }
        assert!(!is_class(&"x".repeat(MAX_CLASS_LEN + 1)));
    }

    #[test]
    fn every_class_written_is_a_class() {
        for m in [
            "a",
            "NVIDIA",
            "-x-",
            "H100 80GB HBM3",
            "ü RTX 5090 ü",
            "a--b",
        ] {
            let c = class_of_model(m);
            assert!(is_class(&c), "{m:?} -> {c:?}");
        }
    }
}
