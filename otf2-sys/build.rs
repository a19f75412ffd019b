//! Links Debian's libotf2 (package libotf2-trace-dev, OTF2 3.0.2).
//!
//! `OTF2_LIB_DIR`, when set, is searched first: a cross build points it at
//! the target's libotf2 (`cargo xtask package --arch arm64` at an arm64
//! sysroot unpacked under target/), which the cross linker would not find
//! in its own default directories.

fn main() {
    println!("cargo::rerun-if-env-changed=OTF2_LIB_DIR");
    if let Some(dir) = std::env::var_os("OTF2_LIB_DIR").filter(|d| !d.is_empty()) {
        println!("cargo::rustc-link-search=native={}", dir.to_string_lossy());
    }
    // By name, not through pkg-config: Debian's otf2.pc says
    // `-lopen-trace-format2`, a library that package does not ship; the
    // library is /usr/lib/x86_64-linux-gnu/libotf2.so.
    println!("cargo::rustc-link-lib=dylib=otf2");
    println!("cargo::rerun-if-changed=build.rs");
}
