//! Links Debian's libotf2 (package libotf2-trace-dev, OTF2 3.0.2).

fn main() {
    // By name, not through pkg-config: Debian's otf2.pc says
    // `-lopen-trace-format2`, a library that package does not ship; the
    // library is /usr/lib/x86_64-linux-gnu/libotf2.so.
    println!("cargo::rustc-link-lib=dylib=otf2");
    println!("cargo::rerun-if-changed=build.rs");
}
