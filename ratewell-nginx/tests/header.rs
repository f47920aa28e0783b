//! `include/ratewell_nginx.h`, the module's C half's view of the C ABI, is what cbindgen makes
//! of `src/ffi.rs` now (`RATEWELL_BLESS=1 cargo test --test header` writes it).

#[test]
fn the_header_is_generated_from_the_abi() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).unwrap();
    let bindings = cbindgen::Builder::new()
        .with_src(format!("{dir}/src/ffi.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen reads src/ffi.rs");
    let mut made = Vec::new();
    bindings.write(&mut made);
    let made = String::from_utf8(made).unwrap();
    let path = format!("{dir}/include/ratewell_nginx.h");
    if std::env::var_os("RATEWELL_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(kept == made, "{path} is not src/ffi.rs's: RATEWELL_BLESS=1 cargo test --test header");
}
