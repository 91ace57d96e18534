//! The second provider of the `rdma` API: real RDMA devices (iWARP RNICs, RoCE, InfiniBand, or the
//! kernel's soft-iWARP `siw` and soft-RoCE `rxe`) through rdma-core's libibverbs and librdmacm.
//! It is compiled only with the `rdma-core` cargo feature, so the default build needs no RDMA
//! libraries.
//!
//! With the feature, [`Verbs`] implements [`rdma::Provider`]: protection domains
//! (`ibv_alloc_pd`), memory regions owning zeroed memory (`ibv_reg_mr`; local invalidation
//! deregisters, re-validation registers again under new keys), completion channels
//! (`ibv_comp_channel`, non-blocking fd) and completion queues (`ibv_poll_cq`,
//! `ibv_req_notify_cq`), reliable connected queue pairs (`ibv_post_send` for Send, Send with SE,
//! Send with Invalidate, RDMA Write and RDMA Read; `ibv_post_recv`) and connection management
//! over `rdma_cm` (connect, listen, accept, reject with private data, disconnect). libibverbs'
//! data-path calls are inline C functions, so a small C shim (`src/shim.c`, built by `cc`) wraps
//! them; Rust sees only opaque pointers and flat structs.
//!
//! Differences from the software RNIC: MPA settings (CRC, revision, peer-to-peer RTR) belong to
//! the device (siw: its module settings) and are not negotiable through verbs, so
//! `ConnParams::{crc, mpa_revision, p2p, first_fpdu_delay}` are ignored and `ConnInfo::crc` is
//! reported as false; a work completion does not tell whether a Send carried the Solicited Event
//! flag, so `Wc::solicited` is always false.
//!
//! **Status.** The project's build and test machines have no RDMA devices and no kernel RDMA
//! support, so this provider cannot run there: stage `40-iwarp-verbs-build` compiles, lints and
//! links it (with `libibverbs-dev`, `librdmacm-dev`), and its unit test only checks that opening a
//! device fails cleanly. It does run in the kernel-peer harness's qemu guest, over Linux siw:
//! scenario `siw-ironsan@verbs` runs the `verbs-ping` example (the rping-compatible ping of
//! `ironsan rdma ping` on this provider) as client and server against ironsan's software RNIC on
//! the host and against rdma-core's own `rping` in the guest.

#[cfg(feature = "rdma-core")]
mod ffi;
#[cfg(feature = "rdma-core")]
mod provider;
#[cfg(feature = "rdma-core")]
pub use provider::{Channel, Cq, Mr, Pd, Qp, Request, Verbs, VerbsListener};

/// Names of the RDMA devices libibverbs sees (empty without devices or without the feature).
pub fn device_names() -> Vec<String> {
    #[cfg(feature = "rdma-core")]
    {
        let mut n: std::os::raw::c_int = 0;
        // SAFETY: libibverbs returns a NULL-terminated array (or NULL) that we free below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n entries are valid device pointers; the name is a NUL-terminated string
            // owned by the device list.
            unsafe {
                let name = ffi::ibv_get_device_name(*list.add(i));
                if !name.is_null() {
                    names.push(
                        std::ffi::CStr::from_ptr(name)
                            .to_string_lossy()
                            .into_owned(),
                    );
                }
            }
        }
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(list) };
        names
    }
    #[cfg(not(feature = "rdma-core"))]
    Vec::new()
}

/// Whether librdmacm can open an event channel (needs /dev/infiniband/rdma_cm).
pub fn rdma_cm_available() -> bool {
    #[cfg(feature = "rdma-core")]
    {
        // SAFETY: create/destroy pair on a channel we own.
        unsafe {
            let ch = ffi::rdma_create_event_channel();
            if ch.is_null() {
                return false;
            }
            ffi::rdma_destroy_event_channel(ch);
            true
        }
    }
    #[cfg(not(feature = "rdma-core"))]
    false
}

/// Why the verbs provider cannot be used here, or `Ok` if a device is there to open with
/// `Verbs::open` (feature `rdma-core`).
pub fn availability() -> rdma::Result<()> {
    if !cfg!(feature = "rdma-core") {
        return Err(rdma::Error::Unavailable(
            "built without the rdma-core feature".into(),
        ));
    }
    if device_names().is_empty() {
        return Err(rdma::Error::Unavailable("no RDMA devices".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn unavailable_here_fails_cleanly() {
        // No machine in this project's CI has RDMA devices; with or without the feature, asking
        // must fail cleanly rather than crash.
        let e = super::availability().unwrap_err();
        assert!(matches!(e, rdma::Error::Unavailable(_)), "{e}");
        #[cfg(feature = "rdma-core")]
        {
            assert!(super::device_names().is_empty());
            let e = super::Verbs::open().err().expect("no device to open");
            assert!(matches!(e, rdma::Error::Unavailable(_)), "{e}");
        }
    }

    /// The provider type satisfies the API the iSER layer is written against (compile-time).
    #[cfg(feature = "rdma-core")]
    #[test]
    fn verbs_implements_the_rdma_api() {
        fn is_provider<P: rdma::Provider>() {}
        is_provider::<super::Verbs>();
    }
}
