//! The kernel programs live in `main.rs` (built for the BPF target by
//! `proxy-object/build.rs`). This empty library lets `proxy-object` name the
//! crate as a build-dependency so cargo rebuilds the object when it changes.
#![no_std]
