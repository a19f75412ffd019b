//! Empty on purpose: the programs are the `observer-ebpf` binary, built for
//! the BPF target by observer/build.rs. This library target only exists so
//! the daemon can name this crate as a build dependency and be rebuilt when
//! the programs change.
#![no_std]
