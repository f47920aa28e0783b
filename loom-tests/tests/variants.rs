//! The list of broken protocols (`src/broken/variants.txt`) is the one `.ci/run` runs loom under:
//! each listed variant must be implemented in `src/broken.rs` and expected to fail by at least one
//! model, and every variant a model names must be listed. Runs without loom.

const LIST: &str = include_str!("../../src/broken/variants.txt");
const BROKEN: &str = include_str!("../../src/broken.rs");
const MODELS: &str = include_str!("models.rs");

fn listed() -> Vec<&'static str> {
    LIST.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The variants named by `ratewell_broken = "..."` on the `should_panic` attributes of `source`.
fn caught(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for attr in source.split("#[cfg_attr(").skip(1) {
        let attr = &attr[..attr.find(")]").unwrap_or(attr.len())];
        if !attr.contains("should_panic") {
            continue;
        }
        for part in attr.split("ratewell_broken = \"").skip(1) {
            names.push(part[..part.find('"').unwrap_or(0)].to_string());
        }
    }
    names
}

#[test]
fn every_listed_variant_is_implemented_and_caught() {
    let list = listed();
    assert!(list.len() >= 6, "the list lost variants: {list:?}");
    let caught = caught(MODELS);
    for variant in &list {
        assert!(
            BROKEN.contains(&format!("cfg!(ratewell_broken = \"{variant}\")")),
            "src/broken.rs does not implement `{variant}`"
        );
        assert!(
            caught.iter().any(|c| c == variant),
            "no loom model is expected to catch `{variant}`"
        );
    }
    for name in &caught {
        assert!(list.contains(&name.as_str()), "models.rs names `{name}`, which is not listed");
    }
}
