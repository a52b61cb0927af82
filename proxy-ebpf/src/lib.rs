//! The kernel programs live in `main.rs` (built for the BPF target by
//! `proxy-user/build.rs`). This empty library lets `proxy-user` name the crate
//! as a build-dependency so cargo rebuilds the object when it changes.
#![no_std]
