//! Every figure kind the simulator draws, rendered by the real binary, has text that stays
//! apart and inside the image: no two text boxes overlap, none runs past an edge. The boxes are
//! measured with the font the binary draws with (plotters' own text layout on the same
//! TrueType file, at the size the PNG is drawn at), from each SVG's text elements: position,
//! anchor, baseline shift, size and rotation.
//!
//! Kinds: `price`, `utilization`, `waits` and `revenue_gini` of a sweep with long labels (the
//! case that used to overlap), `reputation` of a run with network reputation, and `zi`'s
//! `prices` and `efficiency` of two markets.
//!
//! Needs a TrueType font, as `tests/plots.rs` does.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::path::{Path, PathBuf};

use plotters::style::{FontStyle, IntoFont};

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers the font the binary uses (the same search order), once.
fn font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let env = std::env::var(gridlease_sim::plot::FONT_ENV).ok();
        let path = env
            .iter()
            .map(String::as_str)
            .chain(FONTS)
            .find(|p| Path::new(p).is_file())
            .expect("no TrueType font: install fonts-dejavu-core or set GRIDLEASE_SIM_FONT");
        let bytes: &'static [u8] = Box::leak(std::fs::read(path).unwrap().into_boxed_slice());
        assert!(plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok());
    });
}

fn scenario(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
        .display()
        .to_string()
}

fn sim(args: &[&str]) {
    let out = common::run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("plots skipped"), "no TrueType font found");
}

/// A text element's box in image pixels: `(left, top, right, bottom)`, and its text.
#[derive(Debug, Clone)]
struct TextBox {
    text: String,
    b: (f64, f64, f64, f64),
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(tag[i..i + tag[i..].find('"')?].to_string())
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The image size and every non-empty text element's box.
fn boxes(svg: &str) -> ((f64, f64), Vec<TextBox>) {
    font();
    let head = &svg[svg.find("<svg").unwrap()..];
    let head = &head[..head.find('>').unwrap()];
    let size = (
        attr(head, "width").unwrap().parse().unwrap(),
        attr(head, "height").unwrap().parse().unwrap(),
    );
    let mut out = Vec::new();
    for part in svg.split("<text").skip(1) {
        let tag = &part[..part.find('>').unwrap()];
        let text = unescape(part[tag.len() + 1..part.find("</text>").unwrap()].trim());
        if text.is_empty() {
            continue;
        }
        let x: f64 = attr(tag, "x").unwrap().parse().unwrap();
        let y: f64 = attr(tag, "y").unwrap().parse().unwrap();
        // plotters writes an SVG font size of the drawn size / 1.24 (plotters-svg); the PNG
        // is drawn at the size itself, and a browser's DejaVu at the SVG's size is as wide.
        let size: f64 = attr(tag, "font-size").unwrap().parse::<f64>().unwrap() * 1.24;
        let (w, _) = ("sans-serif", size).into_font().box_size(&text).unwrap();
        let (w, h) = (f64::from(w), size);
        // Along the reading direction, from the anchor.
        let (a0, a1) = match attr(tag, "text-anchor").as_deref() {
            Some("middle") => (-w / 2.0, w / 2.0),
            Some("end") => (-w, 0.0),
            _ => (0.0, w),
        };
        // Across it (downwards in the text's own frame), from the baseline shift.
        let (c0, c1) = match attr(tag, "dy").as_deref() {
            Some("0.76em") => (0.0, h),
            Some("0.5ex") => (-h / 2.0, h / 2.0),
            Some("-0.5ex") => (-h, 0.0),
            _ => (-0.8 * h, 0.2 * h),
        };
        let b = match attr(tag, "transform") {
            // rotate(270): reading goes up, the text's "down" goes right.
            Some(t) if t.starts_with("rotate(270") => (x + c0, y - a1, x + c1, y - a0),
            Some(t) if t.starts_with("rotate(90") => (x - c1, y + a0, x - c0, y + a1),
            Some(t) => panic!("unexpected transform {t}"),
            None => (x + a0, y + c0, x + a1, y + c1),
        };
        out.push(TextBox { text, b });
    }
    (size, out)
}

/// Every pair of boxes that overlap by more than `slack` pixels each way, and every box past an
/// edge by more than `slack`.
fn problems(svg: &str) -> Vec<String> {
    let slack = 1.0;
    let ((w, h), bs) = boxes(svg);
    let mut out = Vec::new();
    for t in &bs {
        let (l, tp, r, bt) = t.b;
        if l < -slack || tp < -slack || r > w + slack || bt > h + slack {
            out.push(format!(
                "{:?} at {:?} leaves the {w}x{h} image",
                t.text, t.b
            ));
        }
    }
    for (i, p) in bs.iter().enumerate() {
        for q in &bs[i + 1..] {
            let ox = p.b.2.min(q.b.2) - p.b.0.max(q.b.0);
            let oy = p.b.3.min(q.b.3) - p.b.1.max(q.b.1);
            if ox > slack && oy > slack {
                out.push(format!(
                    "{:?} {:?} overlaps {:?} {:?}",
                    p.text, p.b, q.text, q.b
                ));
            }
        }
    }
    out
}

fn svgs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .collect();
    v.sort();
    v
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!(
        "gridlease-sim-layout-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    Dir(d)
}

fn check(dirs: &[PathBuf], expect: &[&str]) {
    let mut seen = Vec::new();
    let mut all = Vec::new();
    for d in dirs {
        for f in svgs(d) {
            let stem = f.file_stem().unwrap().to_string_lossy().to_string();
            let svg = std::fs::read_to_string(&f).unwrap();
            let (_, bs) = boxes(&svg);
            assert!(bs.len() > 5, "{}: only {} texts", f.display(), bs.len());
            all.extend(
                problems(&svg)
                    .into_iter()
                    .map(|p| format!("{}: {p}", f.display())),
            );
            seen.push(stem);
        }
    }
    for k in expect {
        assert!(seen.iter().any(|s| s == k), "no {k} figure among {seen:?}");
    }
    assert!(
        all.is_empty(),
        "{} layout problems:\n{}",
        all.len(),
        all.join("\n")
    );
}

#[test]
fn the_checker_finds_overlapping_and_clipped_text() {
    let svg = r#"<svg width="200" height="100"><text x="10" y="10" dy="0.76em" font-size="12">hello world</text><text x="30" y="12" dy="0.76em" font-size="12">over it</text><text x="190" y="50" font-size="12">past the edge</text><text x="10" y="60" dy="0.76em" font-size="12">alone</text></svg>"#;
    let p = problems(svg);
    assert!(
        p.iter()
            .any(|x| x.contains("\"hello world\"") && x.contains("overlaps")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|x| x.contains("\"past the edge\"") && x.contains("leaves")),
        "{p:?}"
    );
    assert!(!p.iter().any(|x| x.contains("alone")), "{p:?}");
}

#[test]
fn sweep_figures_with_long_labels_keep_their_text_apart() {
    let d = dir("sweep");
    let o = d.0.display().to_string();
    sim(&[
        "sweep",
        &scenario("baseline"),
        "--param",
        "providers.home-4090.count=30,60",
        "--param",
        "renter_rate=0.5,1.0",
        "--reps",
        "3",
        "--out",
        &o,
        "-q",
    ]);
    check(
        std::slice::from_ref(&d.0),
        &["price", "utilization", "waits", "revenue_gini", "welfare"],
    );
}

#[test]
fn reputation_and_zi_figures_keep_their_text_apart() {
    let d = dir("rep");
    let rep = d.0.join("rep");
    let zi = d.0.join("zi");
    sim(&[
        "run",
        &scenario("sybil"),
        "--reps",
        "2",
        "--out",
        rep.to_str().unwrap(),
        "-q",
    ]);
    sim(&[
        "zi",
        "--scenario",
        &scenario("gs-market1"),
        "--scenario",
        &scenario("gs-market5"),
        "--reps",
        "5",
        "--out",
        zi.to_str().unwrap(),
        "-q",
    ]);
    check(
        &[rep, zi.clone(), zi.join("gs-market1")],
        &["reputation", "prices", "efficiency"],
    );
}
