//! The build script of `ratewell` and `ratewell-loom-tests`: declares the values of the
//! `ratewell_broken` cfg, read from `variants.txt` (the one list of the broken protocols).

fn main() {
    let values: Vec<String> = include_str!("variants.txt")
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|name| !name.is_empty())
        .map(|name| format!("\"{name}\""))
        .collect();
    // `none()`: the bare `cfg(ratewell_broken)`, which selects `broken.rs`.
    println!("cargo::rustc-check-cfg=cfg(ratewell_broken, values(none(), {}))", values.join(", "));
}
