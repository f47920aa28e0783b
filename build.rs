//! The build script of `ratewell` and `ratewell-loom-tests`: declares the values of the
//! `ratewell_broken` cfg, read from `src/broken/variants.txt` (the one list of the broken protocols), and,
//! when one is selected (`--cfg ratewell_broken="VARIANT"`), sets `ratewell_broken_protocol`,
//! the one cfg that swaps in `src/broken.rs`.

fn main() {
    let variants: Vec<&str> = include_str!("src/broken/variants.txt")
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|name| !name.is_empty())
        .collect();
    let values: Vec<String> = variants.iter().map(|name| format!("\"{name}\"")).collect();
    println!("cargo::rustc-check-cfg=cfg(ratewell_broken, values({}))", values.join(", "));
    println!("cargo::rustc-check-cfg=cfg(ratewell_broken_protocol)");
    if let Ok(selected) = std::env::var("CARGO_CFG_RATEWELL_BROKEN") {
        if !variants.contains(&selected.as_str()) {
            eprintln!(
                "ratewell_broken=\"{selected}\" is none of src/broken/variants.txt: {variants:?}"
            );
            std::process::exit(1);
        }
        println!("cargo::rustc-cfg=ratewell_broken_protocol");
    }
}
