//! With the `rdma-core` feature: compile the C shim and link libibverbs and librdmacm.
fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    #[cfg(feature = "rdma-core")]
    {
        cc::Build::new()
            .file("src/shim.c")
            .warnings(true)
            .compile("ironsan_verbs_shim");
        // After the shim, so the linker resolves the shim's references to them.
        println!("cargo:rustc-link-lib=dylib=rdmacm");
        println!("cargo:rustc-link-lib=dylib=ibverbs");
    }
}
