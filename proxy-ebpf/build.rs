//! Rebuild the eBPF object when the linker changes (a new bpf-linker can emit
//! different BTF), as aya's template does.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!("cargo:rerun-if-env-changed=PATH"),
    }
}
