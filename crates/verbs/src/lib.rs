//! The second provider of the `rdma` API: real RDMA devices (iWARP, RoCE, InfiniBand, or the
//! kernel's siw/rxe) through rdma-core's libibverbs and librdmacm. It is compiled only with the
//! `rdma-core` cargo feature, so the default build needs no RDMA libraries.
//!
//! Status: this crate links rdma-core and enumerates devices; it cannot be run on the project's
//! build machines (no RDMA devices and no kernel RDMA support there), so it is only compiled in CI
//! (stage `40-iwarp-verbs-build`). The verbs data path (PD/MR/CQ/QP over `ibv_*`, connection
//! management over `rdma_cm`) is not implemented yet; [`open`] reports `Unavailable`.

use rdma::{Error, Result};

#[cfg(feature = "rdma-core")]
mod ffi {
    use std::os::raw::{c_char, c_int};

    /// Opaque `struct ibv_device`.
    #[repr(C)]
    pub struct IbvDevice {
        _private: [u8; 0],
    }

    #[link(name = "ibverbs")]
    extern "C" {
        pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut IbvDevice;
        pub fn ibv_free_device_list(list: *mut *mut IbvDevice);
        pub fn ibv_get_device_name(device: *mut IbvDevice) -> *const c_char;
    }

    /// Opaque `struct rdma_event_channel`.
    #[repr(C)]
    pub struct RdmaEventChannel {
        _private: [u8; 0],
    }

    #[link(name = "rdmacm")]
    extern "C" {
        pub fn rdma_create_event_channel() -> *mut RdmaEventChannel;
        pub fn rdma_destroy_event_channel(channel: *mut RdmaEventChannel);
    }
}

/// Names of the RDMA devices rdma-core sees (empty without devices or without the feature).
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
                let dev = *list.add(i);
                let name = ffi::ibv_get_device_name(dev);
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

/// Opens the first RDMA device as a provider.
pub fn open() -> Result<()> {
    if !cfg!(feature = "rdma-core") {
        return Err(Error::Unavailable(
            "built without the rdma-core feature".into(),
        ));
    }
    let names = device_names();
    if names.is_empty() {
        return Err(Error::Unavailable("no RDMA devices".into()));
    }
    Err(Error::Unavailable(format!(
        "found {names:?}, but the verbs provider's data path is not implemented yet"
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_reports_unavailable_here() {
        // No machine in this project's CI has RDMA devices; with or without the feature, opening
        // must fail cleanly rather than crash.
        let e = super::open().unwrap_err();
        assert!(matches!(e, rdma::Error::Unavailable(_)), "{e}");
        #[cfg(feature = "rdma-core")]
        assert!(super::device_names().is_empty());
    }
}
